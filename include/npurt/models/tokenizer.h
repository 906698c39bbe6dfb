// The Gemma-3 tokenizer: a SentencePiece-style (llama.cpp "llama" model) vocabulary
// read from a GGUF file, turning text into token ids and back.
//
//   StatusOr<models::Tokenizer> tok = models::Tokenizer::from_gguf(file);
//   StatusOr<std::vector<int32_t>> ids = tok->encode("The capital of France is");
//   // ids: {2, 818, 5279, 529, 7001, 563}; tok->decode(*ids) gives the text back
//
// Encoding splits out special tokens (control and user-defined pieces that appear
// literally, such as "<start_of_turn>"), replaces spaces with U+2581 and merges
// characters greedily by piece score; characters with no piece fall back to byte
// tokens "<0xXX>". Decoding undoes this and hides control tokens.
//
// The vocabulary is untrusted input: lengths, special ids and byte-token spellings
// are checked when the Tokenizer is built, and errors name the offending entry.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/models/gguf.h"

namespace npurt::models {

// tokenizer.ggml.token_type codes; the values are part of the format.
enum class TokenType : int32_t {
  kUndefined = 0,  // treated as normal
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The special ids; the defaults are Gemma-3's, used when the GGUF omits a key.
struct TokenizerSpecials {
  int32_t bos = 2;
  int32_t eos = 1;
  int32_t unk = 3;
  int32_t pad = 0;
  bool add_bos = true;  // tokenizer.ggml.add_bos_token
};

class Tokenizer {
 public:
  using Specials = TokenizerSpecials;

  // Reads tokenizer.ggml.{tokens, scores, token_type} and the special ids. Scores and
  // types default to 0 and normal when absent; tokens are required.
  static StatusOr<Tokenizer> from_gguf(const GgufFile& file);
  // Builds from explicit tables (tests, other containers). `scores` and `types`
  // must have one entry per token.
  static StatusOr<Tokenizer> from_vocab(std::vector<std::string> tokens,
                                        std::vector<float> scores,
                                        std::vector<int32_t> types, Specials specials);

  // Text to ids. bos is prepended when `add_bos` is set and the vocabulary's
  // add_bos_token allows it, and never twice (text starting with a literal bos
  // piece keeps just that one). Fails only for text over 2 GiB.
  StatusOr<std::vector<int32_t>> encode(std::string_view text, bool add_bos = true) const;

  // Ids to text: U+2581 becomes a space, byte tokens their raw byte; control and
  // unused tokens and ids outside the vocabulary produce nothing.
  std::string decode(std::span<const int32_t> ids) const;
  // decode() of one token, for streaming output. A byte token gives its single
  // raw byte, so a multi-byte character may arrive over several calls.
  std::string token_text(int32_t id) const;

  // eos, and <end_of_turn> when the vocabulary has it.
  bool is_stop(int32_t id) const;

  int32_t bos() const { return specials_.bos; }
  int32_t eos() const { return specials_.eos; }
  int32_t unk() const { return specials_.unk; }
  int32_t pad() const { return specials_.pad; }
  bool add_bos() const { return specials_.add_bos; }
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

  // The stored piece for `id` (empty outside the vocabulary) and its type.
  std::string_view piece(int32_t id) const;
  TokenType type(int32_t id) const;
  // The id whose piece is exactly `text`, or -1.
  int32_t find(std::string_view text) const;

 private:
  // Hash/equality that let std::string keys be looked up by string_view.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, Hash, std::equal_to<>>;

  Tokenizer() = default;
  Status index();
  void add_special(int32_t id);
  // Longest special piece starting at text[pos]: its id and length, or {-1, 0}.
  std::pair<int32_t, size_t> match_special(std::string_view text, size_t pos) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  int32_t mergeable(std::string_view text) const;
  void append_piece(int32_t id, std::string& out) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  Specials specials_;
  int32_t end_of_turn_ = -1;

  PieceMap all_;        // every piece (first id wins for duplicates)
  PieceMap mergeable_;  // normal and user-defined pieces: merge targets
  std::array<int32_t, 256> byte_ids_{};  // byte -> its <0xXX> token, or -1

  // Trie over special pieces; node 0 is the root. Edges are keyed node << 8 | byte.
  std::vector<int32_t> trie_ids_;  // per node: the special id ending there, or -1
  std::unordered_map<uint64_t, int32_t> trie_edges_;
};

}  // namespace npurt::models
