// The Gemma-3 tokenizer on small synthetic vocabularies: hand-checked merge orders,
// byte fallback, special-token splitting, bos handling, decoding, stop tokens,
// vocabulary validation, round trips of random text, loading through a GGUF built
// in memory, and (when NPURT_MODEL names the real file) the model's known vector.
#include "npurt/models/tokenizer.h"

#include <gtest/gtest.h>

#include "models/gguf_writer.h"
#include "models/real_model.h"
#include "models/synthetic_vocab.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npurt/models/gguf.h"

namespace npurt::models {
namespace {

constexpr int32_t kPad = 0, kEos = 1, kBos = 2, kUnk = 3, kStartOfTurn = 4, kEndOfTurn = 5;
constexpr int32_t kFirstByte = 6;  // <0x00> .. <0xFF> follow the control tokens
constexpr int32_t kNormal = SyntheticVocab::kNormal;

const std::string& kSpace = kSpaceMarker;

// A synthetic vocabulary that builds its tokenizer as a test expectation.
struct VocabBuilder : SyntheticVocab {
  using SyntheticVocab::SyntheticVocab;

  Tokenizer build(Tokenizer::Specials s = {}) const {
    StatusOr<Tokenizer> t = Tokenizer::from_vocab(tokens, scores, types, s);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return std::move(t).value();
  }
};

VocabBuilder word_vocab() {
  VocabBuilder v;
  v.add_word_pieces();
  return v;
}

std::vector<int32_t> encode(const Tokenizer& t, std::string_view text, bool bos = false) {
  StatusOr<std::vector<int32_t>> ids = t.encode(text, bos);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::vector<int32_t> ids_of(const Tokenizer& t, std::vector<std::string> pieces) {
  std::vector<int32_t> ids;
  for (const std::string& p : pieces) {
    ids.push_back(t.find(p));
    EXPECT_GE(ids.back(), 0) << "no piece " << p;
  }
  return ids;
}

// The merge tests' vocabulary: one piece per character of `letters` (score -10, below
// every merge), then `merges` in order.
Tokenizer merge_vocab(std::string_view letters, std::initializer_list<std::pair<const char*, float>> merges) {
  VocabBuilder v;
  for (char c : letters) v.add(std::string(1, c), -10);
  for (const auto& [piece, score] : merges) v.add(piece, score);
  return v.build();
}

TEST(Tokenizer, MergesHighestScoreFirst) {
  Tokenizer t = merge_vocab("abcd", {{"ab", -5}, {"bc", -1}});
  // "bc" outscores "ab"; afterwards "abc" is not a piece.
  EXPECT_EQ(encode(t, "abc"), ids_of(t, {"a", "bc"}));

  Tokenizer u = merge_vocab("abc", {{"ab", -1}, {"bc", -5}});
  EXPECT_EQ(encode(u, "abc"), ids_of(u, {"ab", "c"}));
}

TEST(Tokenizer, EqualScoresMergeLeftmostFirst) {
  Tokenizer t = merge_vocab("abc", {{"ab", -2}, {"bc", -2}, {"aa", -1}});
  EXPECT_EQ(encode(t, "abc"), ids_of(t, {"ab", "c"}));
  EXPECT_EQ(encode(t, "aaa"), ids_of(t, {"aa", "a"}));
  EXPECT_EQ(encode(t, "aaaaa"), ids_of(t, {"aa", "aa", "a"}));
}

TEST(Tokenizer, MergesAreGreedyAndEnableLaterMerges) {
  // The last piece, "abcd", is unreachable: neither "abc"+"d" pair is scored before "cd".
  Tokenizer t = merge_vocab("abcd", {{"ab", -1}, {"abc", -2}, {"bc", -3}, {"cd", -1.5f}, {"abcd", -0.5f}});
  // ab (-1) first, then cd (-1.5) beats abc (-2), then ab+cd = abcd.
  EXPECT_EQ(encode(t, "abcd"), ids_of(t, {"abcd"}));
  // Without "d": ab, then abc.
  EXPECT_EQ(encode(t, "abc"), ids_of(t, {"abc"}));

  Tokenizer u = merge_vocab("abcd", {{"ab", -1}, {"cd", -1}, {"bc", -0.5f}, {"abcd", -3}});
  // bc wins, and then neither "abc" nor "bcd" is a piece: greedy, not optimal.
  EXPECT_EQ(encode(u, "abcd"), ids_of(u, {"a", "bc", "d"}));
}

TEST(Tokenizer, SpacesBecomeMarkersWithoutPrefix) {
  Tokenizer t = word_vocab().build();
  EXPECT_EQ(encode(t, "the capital of France is"),
            ids_of(t, {"the", kSpace + "capital", kSpace + "of", kSpace + "France",
                       kSpace + "is"}));
  EXPECT_EQ(encode(t, " the"), ids_of(t, {kSpace + "the"}));
  EXPECT_EQ(encode(t, "  the "), ids_of(t, {kSpace, kSpace + "the", kSpace}));
}

TEST(Tokenizer, CharactersWithoutPiecesFallBackToBytes) {
  Tokenizer t = word_vocab().build();
  // U+00E9 (C3 A9), U+65E5 (E6 97 A5), U+1F600 (F0 9F 98 80).
  EXPECT_EQ(encode(t, "\xC3\xA9"), (std::vector<int32_t>{kFirstByte + 0xC3, kFirstByte + 0xA9}));
  EXPECT_EQ(encode(t, "\xE6\x97\xA5"),
            (std::vector<int32_t>{kFirstByte + 0xE6, kFirstByte + 0x97, kFirstByte + 0xA5}));
  EXPECT_EQ(encode(t, "a\xF0\x9F\x98\x80"),
            (std::vector<int32_t>{t.find("a"), kFirstByte + 0xF0, kFirstByte + 0x9F,
                                  kFirstByte + 0x98, kFirstByte + 0x80}));
  // Invalid UTF-8: one symbol per byte.
  EXPECT_EQ(encode(t, "\xFF\x80"), (std::vector<int32_t>{kFirstByte + 0xFF, kFirstByte + 0x80}));
}

TEST(Tokenizer, MultiByteCharactersMergeAsUnits) {
  VocabBuilder v;
  const int32_t e = v.add("\xC3\xA9", -3);
  const int32_t ee = v.add("\xC3\xA9\xC3\xA9", -1);
  Tokenizer t = v.build();
  EXPECT_EQ(encode(t, "\xC3\xA9\xC3\xA9\xC3\xA9"), (std::vector<int32_t>{ee, e}));
}

TEST(Tokenizer, MissingByteTokensBecomeUnknown) {
  VocabBuilder v(/*with_bytes=*/false);
  const int32_t a = v.add("a", -1);
  Tokenizer t = v.build();
  EXPECT_EQ(encode(t, "a\xC3\xA9"), (std::vector<int32_t>{a, kUnk, kUnk}));
}

TEST(Tokenizer, ByteTokenSpellingInTextIsNotAByteToken) {
  VocabBuilder v = word_vocab();
  v.add("<0", -1);
  v.add("<0x", -1);
  v.add("<0x4", -1);
  v.add("<0x41", -1);
  Tokenizer t = v.build();
  const std::vector<int32_t> ids = encode(t, "<0x41>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kFirstByte + 0x41), 0);
  EXPECT_EQ(t.decode(ids), "<0x41>");
}

TEST(Tokenizer, SpecialTokensAreSplitOut) {
  Tokenizer t = word_vocab().build();
  const std::vector<int32_t> ids = encode(t, "<start_of_turn>user\nHi<end_of_turn>", true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], kBos);
  EXPECT_EQ(ids[1], kStartOfTurn);
  EXPECT_EQ(ids.back(), kEndOfTurn);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kStartOfTurn), 1);
  EXPECT_EQ(t.decode(ids), "user\nHi");
  // A special token between words, and two in a row.
  const std::vector<int32_t> mid = encode(t, "the<eos><eos> is");
  EXPECT_EQ(mid, (std::vector<int32_t>{t.find("the"), kEos, kEos, t.find(kSpace + "is")}));
  // An incomplete special spelling is ordinary text.
  EXPECT_EQ(t.decode(encode(t, "<end_of_turn")), "<end_of_turn");
}

TEST(Tokenizer, UserDefinedTokensAreSplitOut) {
  VocabBuilder v = word_vocab();
  const int32_t tag = v.add_typed("<tag>", 0, 4);
  Tokenizer t = v.build();
  const std::vector<int32_t> ids = encode(t, "the<tag>is");
  EXPECT_EQ(ids, (std::vector<int32_t>{t.find("the"), tag, t.find("i"), t.find("s")}));
  EXPECT_EQ(t.decode(ids), "the<tag>is");  // user-defined pieces are visible text
}

TEST(Tokenizer, BosIsAddedOnceWhenAsked) {
  Tokenizer t = word_vocab().build();
  EXPECT_EQ(encode(t, "the", true), (std::vector<int32_t>{kBos, t.find("the")}));
  EXPECT_EQ(encode(t, "the", false), (std::vector<int32_t>{t.find("the")}));
  EXPECT_EQ(encode(t, "", true), (std::vector<int32_t>{kBos}));
  EXPECT_TRUE(encode(t, "", false).empty());
  // A literal bos at the start is not doubled; one later in the text is kept.
  EXPECT_EQ(encode(t, "<bos>the", true), (std::vector<int32_t>{kBos, t.find("the")}));
  EXPECT_EQ(encode(t, "the<bos>", true), (std::vector<int32_t>{kBos, t.find("the"), kBos}));

  Tokenizer::Specials no_bos;
  no_bos.add_bos = false;
  Tokenizer u = word_vocab().build(no_bos);
  EXPECT_FALSE(u.add_bos());
  EXPECT_EQ(encode(u, "the", true), (std::vector<int32_t>{u.find("the")}));
}

TEST(Tokenizer, DecodeHidesControlTokensAndSkipsUnknownIds) {
  Tokenizer t = word_vocab().build();
  const std::vector<int32_t> ids = {kBos, kStartOfTurn, t.find("the"), t.find(kSpace + "is"),
                                    kEndOfTurn, kEos, kPad, -1, t.size(), 1 << 30};
  EXPECT_EQ(t.decode(ids), "the is");
  EXPECT_EQ(t.decode({}), "");
}

TEST(Tokenizer, TokenTextStreamsOneToken) {
  Tokenizer t = word_vocab().build();
  EXPECT_EQ(t.token_text(t.find(kSpace + "France")), " France");
  EXPECT_EQ(t.token_text(kFirstByte + 0x41), "A");
  EXPECT_EQ(t.token_text(kFirstByte + 0xC3), "\xC3");
  EXPECT_EQ(t.token_text(kEos), "");
  EXPECT_EQ(t.token_text(-5), "");
  // Streaming a byte-fallback character piece by piece reassembles it.
  std::string streamed;
  for (int32_t id : encode(t, "the \xF0\x9F\x98\x80!")) streamed += t.token_text(id);
  EXPECT_EQ(streamed, "the \xF0\x9F\x98\x80!");
}

TEST(Tokenizer, StopTokens) {
  Tokenizer t = word_vocab().build();
  EXPECT_TRUE(t.is_stop(kEos));
  EXPECT_TRUE(t.is_stop(kEndOfTurn));
  EXPECT_FALSE(t.is_stop(kBos));
  EXPECT_FALSE(t.is_stop(kStartOfTurn));
  EXPECT_FALSE(t.is_stop(-1));
  EXPECT_EQ(t.bos(), kBos);
  EXPECT_EQ(t.eos(), kEos);
  EXPECT_EQ(t.unk(), kUnk);
  EXPECT_EQ(t.pad(), kPad);

  VocabBuilder v(/*with_bytes=*/true, /*with_turns=*/false);
  Tokenizer u = v.build();
  EXPECT_TRUE(u.is_stop(kEos));
  EXPECT_FALSE(u.is_stop(4));  // the first byte token here
}

// Random text over a mixed alphabet: ASCII words, runs of spaces, newlines, accented
// and CJK characters, emoji, invalid and truncated UTF-8, stray '<' and '>'. A
// literal U+2581 is left out: it decodes as a space, as in SentencePiece.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> kAlphabet = {
      "the", "capital", " ", "  ", "\n", "\t", "France", "is", "of", "a", "Z", "0", "x", "<",
      ">", "<0x", "\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80", "\xFF",
      "\x80", "\xC3", "\xE6\x97", "\xF0\x9F", "\xC0\xAF", "\xED\xA0\x80", "\x01",
      std::string(1, '\0'), "!", "?.",
  };
  std::uniform_int_distribution<size_t> len(0, 24), pick(0, kAlphabet.size() - 1);
  std::string s;
  for (size_t n = len(rng); n > 0; --n) s += kAlphabet[pick(rng)];
  return s;
}

TEST(Tokenizer, RandomTextRoundTrips) {
  Tokenizer t = word_vocab().build();
  std::mt19937 rng(20250311);
  const std::vector<std::string> fixed = {
      "", " ", "   ", "\n", " leading", "trailing ", "multiple   spaces", "line\nbreak\n",
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x80", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "\xFF\xFE",
      "The capital of France is Paris.",
  };
  for (const std::string& s : fixed) {
    EXPECT_EQ(t.decode(encode(t, s, true)), s) << "text: " << s;
  }
  for (int i = 0; i < 400; ++i) {
    const std::string s = random_text(rng);
    const std::vector<int32_t> ids = encode(t, s, i % 2 == 0);
    ASSERT_EQ(t.decode(ids), s) << "case " << i;
    std::string streamed;
    for (int32_t id : ids) streamed += t.token_text(id);
    ASSERT_EQ(streamed, s) << "case " << i;
  }
}

// from_vocab's error for `v` with `s`, as text ("" when it succeeded).
std::string vocab_error(const VocabBuilder& v, Tokenizer::Specials s = {}) {
  StatusOr<Tokenizer> t = Tokenizer::from_vocab(v.tokens, v.scores, v.types, s);
  return t.ok() ? "" : t.status().to_string();
}

TEST(Tokenizer, RejectsMalformedVocabularies) {
  const VocabBuilder good = word_vocab();
  EXPECT_EQ(vocab_error(good), "");

  VocabBuilder scores = good;
  scores.scores.pop_back();
  EXPECT_NE(vocab_error(scores).find("scores for"), std::string::npos) << vocab_error(scores);

  VocabBuilder types = good;
  types.types.push_back(kNormal);
  EXPECT_NE(vocab_error(types).find("token types for"), std::string::npos)
      << vocab_error(types);

  VocabBuilder bad_type = good;
  bad_type.types[10] = 9;
  EXPECT_NE(vocab_error(bad_type).find("unknown type 9"), std::string::npos)
      << vocab_error(bad_type);

  for (const char* spelling : {"<0xZZ>", "<0x4>", "<0x411>", "0x41", "<0X41>"}) {
    VocabBuilder bad_byte = good;
    bad_byte.tokens[kFirstByte + 0x41] = spelling;
    const std::string err = vocab_error(bad_byte);
    EXPECT_NE(err.find("byte token"), std::string::npos) << err;
    EXPECT_NE(err.find(spelling), std::string::npos) << err;
  }

  Tokenizer::Specials bos;
  bos.bos = 100000;
  EXPECT_NE(vocab_error(good, bos).find("bos id 100000"), std::string::npos)
      << vocab_error(good, bos);
  Tokenizer::Specials eos;
  eos.eos = -1;
  EXPECT_NE(vocab_error(good, eos).find("eos id -1"), std::string::npos);
  Tokenizer::Specials unk;
  unk.unk = static_cast<int32_t>(good.tokens.size());
  EXPECT_NE(vocab_error(good, unk).find("unk id"), std::string::npos);
  Tokenizer::Specials pad;
  pad.pad = 1 << 30;
  EXPECT_NE(vocab_error(good, pad).find("pad id"), std::string::npos);

  StatusOr<Tokenizer> empty = Tokenizer::from_vocab({}, {}, {}, {});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no tokens"), std::string::npos);
}

// A GGUF holding `v`, with Gemma's keys unless told to leave the optional ones out.
std::vector<uint8_t> vocab_gguf(const VocabBuilder& v, bool with_optional_keys = true) {
  GgufWriter w;
  w.kv_str("general.architecture", "gemma3");
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_strings("tokenizer.ggml.tokens", v.tokens);
  if (with_optional_keys) {
    w.kv_floats("tokenizer.ggml.scores", v.scores);
    w.kv_ints("tokenizer.ggml.token_type", v.types);
    w.kv_u32("tokenizer.ggml.bos_token_id", kBos);
    w.kv_u32("tokenizer.ggml.eos_token_id", kEos);
    w.kv_u32("tokenizer.ggml.unknown_token_id", kUnk);
    w.kv_u32("tokenizer.ggml.padding_token_id", kPad);
    w.kv_bool("tokenizer.ggml.add_bos_token", true);
  }
  return w.bytes();
}

TEST(TokenizerGguf, MatchesTheVocabularyTables) {
  const VocabBuilder v = word_vocab();
  const std::vector<uint8_t> bytes = vocab_gguf(v);
  StatusOr<GgufFile> file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  StatusOr<Tokenizer> t = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  Tokenizer ref = v.build();
  EXPECT_EQ(t->size(), ref.size());
  EXPECT_EQ(t->bos(), kBos);
  EXPECT_EQ(t->eos(), kEos);
  EXPECT_TRUE(t->add_bos());
  for (const std::string s :
       {"the capital of France is", "<start_of_turn>user\nHi \xF0\x9F\x98\x80", "", "  x\xFF"}) {
    EXPECT_EQ(encode(*t, s, true), encode(ref, s, true)) << s;
  }
  for (const std::string s : {"the capital of France is", "", "  x\xFF"}) {
    EXPECT_EQ(t->decode(encode(*t, s)), s);
  }
}

TEST(TokenizerGguf, SpecialIdsOverrideDefaults) {
  VocabBuilder v = word_vocab();
  GgufWriter w;
  w.kv_strings("tokenizer.ggml.tokens", v.tokens);
  w.kv_floats("tokenizer.ggml.scores", v.scores);
  w.kv_ints("tokenizer.ggml.token_type", v.types);
  w.kv_u32("tokenizer.ggml.bos_token_id", kStartOfTurn);
  w.kv_u32("tokenizer.ggml.eos_token_id", kBos);
  w.kv_bool("tokenizer.ggml.add_bos_token", false);
  const std::vector<uint8_t> bytes = w.bytes();
  StatusOr<GgufFile> file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  StatusOr<Tokenizer> t = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->bos(), kStartOfTurn);
  EXPECT_EQ(t->eos(), kBos);
  EXPECT_EQ(t->unk(), kUnk);  // default
  EXPECT_FALSE(t->add_bos());
  EXPECT_TRUE(t->is_stop(kBos));
}

TEST(TokenizerGguf, MissingOptionalKeysUseDefaults) {
  VocabBuilder v = word_vocab();
  const std::vector<uint8_t> bytes = vocab_gguf(v, /*with_optional_keys=*/false);
  StatusOr<GgufFile> file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  StatusOr<Tokenizer> t = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->bos(), 2);
  EXPECT_EQ(t->eos(), 1);
  EXPECT_EQ(t->unk(), 3);
  EXPECT_EQ(t->pad(), 0);
  EXPECT_TRUE(t->add_bos());
  // Every token is normal without token_type, so "<0x41>" decodes as its text.
  EXPECT_EQ(t->token_text(kFirstByte + 0x41), "<0x41>");
}

TEST(TokenizerGguf, ErrorsNameTheProblem) {
  const VocabBuilder v = word_vocab();
  auto error_of = [](const GgufWriter& w) {
    const std::vector<uint8_t> bytes = w.bytes();
    StatusOr<GgufFile> file = GgufFile::parse(bytes);
    EXPECT_TRUE(file.ok()) << file.status().to_string();
    if (!file.ok()) return std::string();
    StatusOr<Tokenizer> t = Tokenizer::from_gguf(*file);
    return t.ok() ? std::string() : t.status().to_string();
  };

  GgufWriter no_tokens;
  no_tokens.kv_str("tokenizer.ggml.model", "llama");
  EXPECT_NE(error_of(no_tokens).find("tokenizer.ggml.tokens"), std::string::npos)
      << error_of(no_tokens);

  GgufWriter other_model;
  other_model.kv_str("tokenizer.ggml.model", "gpt2");
  other_model.kv_strings("tokenizer.ggml.tokens", v.tokens);
  EXPECT_NE(error_of(other_model).find("'gpt2'"), std::string::npos) << error_of(other_model);

  GgufWriter short_scores;
  short_scores.kv_strings("tokenizer.ggml.tokens", v.tokens);
  short_scores.kv_floats("tokenizer.ggml.scores", {1.0f, 2.0f});
  EXPECT_NE(error_of(short_scores).find("2 scores for"), std::string::npos)
      << error_of(short_scores);

  GgufWriter wrong_type;
  wrong_type.kv_strings("tokenizer.ggml.tokens", v.tokens);
  wrong_type.kv_strings("tokenizer.ggml.scores", v.tokens);
  EXPECT_NE(error_of(wrong_type).find("tokenizer.ggml.scores"), std::string::npos)
      << error_of(wrong_type);

  GgufWriter bad_bos;
  bad_bos.kv_strings("tokenizer.ggml.tokens", v.tokens);
  bad_bos.kv_u32("tokenizer.ggml.bos_token_id", 4000000000u);
  EXPECT_NE(error_of(bad_bos).find("bos_token_id"), std::string::npos) << error_of(bad_bos);

  GgufWriter bad_eos;
  bad_eos.kv_strings("tokenizer.ggml.tokens", v.tokens);
  bad_eos.kv_u32("tokenizer.ggml.eos_token_id", 70000);
  EXPECT_NE(error_of(bad_eos).find("eos id 70000"), std::string::npos) << error_of(bad_eos);

  GgufWriter bad_flag;
  bad_flag.kv_strings("tokenizer.ggml.tokens", v.tokens);
  bad_flag.kv_u32("tokenizer.ggml.add_bos_token", 1);
  EXPECT_NE(error_of(bad_flag).find("add_bos_token"), std::string::npos) << error_of(bad_flag);

  VocabBuilder bad_byte = v;
  bad_byte.tokens[kFirstByte + 7] = "<0xG7>";
  EXPECT_NE(error_of([&] {
              GgufWriter w;
              w.kv_strings("tokenizer.ggml.tokens", bad_byte.tokens);
              w.kv_ints("tokenizer.ggml.token_type", bad_byte.types);
              return w;
            }()).find("'<0xG7>'"),
            std::string::npos);
}

// The real model's known vector, when the file is installed.
TEST(TokenizerModel, KnownVector) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  StatusOr<RealModel> model = open_real_model(path);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const Tokenizer* t = &model->tokenizer;
  EXPECT_EQ(t->size(), 262144);
  const std::string text = "The capital of France is";
  const std::vector<int32_t> ids = encode(*t, text, true);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 818, 5279, 529, 7001, 563}));
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_TRUE(t->is_stop(1));
  EXPECT_TRUE(t->is_stop(106));
  EXPECT_EQ(t->decode(encode(*t, "<start_of_turn>user\nHi<end_of_turn>")), "user\nHi");
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    const std::string s = random_text(rng);
    ASSERT_EQ(t->decode(encode(*t, s, true)), s) << "case " << i;
  }
}

}  // namespace
}  // namespace npurt::models
