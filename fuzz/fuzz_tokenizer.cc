// libFuzzer entry point for the tokenizer.
//
// The first byte says what the rest is:
//   0  text for a fixed Gemma-style vocabulary (control tokens, all 256 byte tokens,
//      word pieces with scores). encode() must succeed with ids inside the
//      vocabulary, a leading bos when asked, and decoding must give the text back:
//      every byte has a byte token, so any byte string round-trips (invalid UTF-8
//      too) unless it contains what the tokenizer documents as lost, a literal U+2581
//      (it decodes as a space) or a control piece (decoding hides it).
//   1  a vocabulary for from_vocab(): the specials, then '\n'-separated entries of
//      type, score and piece. It must build a working tokenizer or fail with a message.
//   2  a GGUF file for from_gguf(), with the same promise.
// In every case decode() must equal the concatenated token_text() of its ids, which
// is what streaming output relies on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/synthetic_vocab.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"

namespace {

using npurt::StatusOr;
using npurt::models::Tokenizer;
using npurt::models::TokenType;

void check(bool ok) {
  if (!ok) std::abort();
}

const Tokenizer& fixed_tokenizer() {
  static const Tokenizer* t = [] {
    npurt::models::SyntheticVocab v;
    v.add_word_pieces();
    v.add_typed("<mask>", 0, 4);  // user-defined: split out like a control piece, but kept
    StatusOr<Tokenizer> built = Tokenizer::from_vocab(v.tokens, v.scores, v.types, {});
    check(built.ok());
    return new Tokenizer(std::move(built).value());
  }();
  return *t;
}

// Encodes `text` and checks what holds for any vocabulary; returns the ids.
std::vector<int32_t> encode_checked(const Tokenizer& t, std::string_view text, bool add_bos) {
  StatusOr<std::vector<int32_t>> ids = t.encode(text, add_bos);
  check(ids.ok());  // only text over 2 GiB may fail
  for (int32_t id : *ids) check(id >= 0 && id < t.size());
  if (add_bos && t.add_bos()) check(!ids->empty() && (*ids)[0] == t.bos());
  std::string streamed;
  for (int32_t id : *ids) streamed += t.token_text(id);
  check(streamed == t.decode(*ids));
  return std::move(ids).value();
}

// Whether the tokenizer promises decode(encode(text)) == text.
bool round_trips(const Tokenizer& t, std::string_view text) {
  if (text.find(npurt::models::kSpaceMarker) != std::string_view::npos) return false;
  for (int32_t id = 0; id < t.size(); ++id) {
    if (t.type(id) == TokenType::kControl && text.find(t.piece(id)) != std::string_view::npos) return false;
  }
  return true;
}

void fuzz_text(std::string_view text, bool add_bos) {
  const Tokenizer& t = fixed_tokenizer();
  const std::vector<int32_t> ids = encode_checked(t, text, add_bos);
  if (round_trips(t, text)) check(t.decode(ids) == text);
}

// A tokenizer that some constructor accepted: its tables answer consistently and it
// encodes its own pieces and arbitrary text.
void check_built(const Tokenizer& t, std::string_view text) {
  check(t.size() > 0);
  for (int32_t id = 0; id < t.size(); ++id) {
    const int32_t found = t.find(t.piece(id));
    check(found >= 0 && found <= id && t.piece(found) == t.piece(id));  // first id wins
    encode_checked(t, t.piece(id), id % 2 == 0);
  }
  encode_checked(t, text, true);
  const int32_t strays[] = {-1, t.size(), INT32_MIN, INT32_MAX};
  check(t.decode(strays).empty());  // ids outside the vocabulary produce nothing
}

// Byte 0-3: bos, eos, unk, pad (signed, so negative ids occur); byte 4: add_bos; then
// entries "<type><score><piece>" separated by '\n' (type mod 8: 7 is no type).
void fuzz_vocab(std::string_view bytes) {
  if (bytes.size() < 5) return;
  Tokenizer::Specials s;
  s.bos = static_cast<int8_t>(bytes[0]);
  s.eos = static_cast<int8_t>(bytes[1]);
  s.unk = static_cast<int8_t>(bytes[2]);
  s.pad = static_cast<int8_t>(bytes[3]);
  s.add_bos = bytes[4] & 1;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  std::string_view rest = bytes.substr(5);
  while (!rest.empty()) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view entry = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    types.push_back(entry.empty() ? 1 : static_cast<uint8_t>(entry[0]) % 8);
    scores.push_back(entry.size() < 2 ? 0.0f : static_cast<int8_t>(entry[1]));
    tokens.emplace_back(entry.substr(std::min<size_t>(2, entry.size())));
  }
  StatusOr<Tokenizer> t = Tokenizer::from_vocab(tokens, scores, types, s);
  if (!t.ok()) {
    check(!t.status().message().empty());  // every rejection must say why
    return;
  }
  check_built(*t, bytes);
}

void fuzz_gguf(std::span<const uint8_t> bytes) {
  StatusOr<npurt::models::GgufFile> file = npurt::models::GgufFile::parse(bytes);
  if (!file.ok()) return;  // the GGUF reader has a fuzzer of its own
  StatusOr<Tokenizer> t = Tokenizer::from_gguf(*file);
  if (!t.ok()) {
    check(!t.status().message().empty());
    return;
  }
  check_built(*t, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
    case 3:
      fuzz_text(rest, data[0] & 4);
      break;
    case 1:
      fuzz_vocab(rest);
      break;
    case 2:
      fuzz_gguf({data + 1, size - 1});
      break;
  }
  return 0;
}
