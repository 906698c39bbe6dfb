// The Gemma-3 tokenizer: vocabulary loading and validation, special-token
// splitting, score-ordered piece merging with byte fallback, and decoding.
#include "npurt/models/tokenizer.h"

#include <limits>
#include <queue>
#include <utility>

namespace npurt::models {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xXX>" piece stands for, or -1 when the spelling is wrong.
int parse_byte_piece(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  const int hi = hex_digit(s[3]);
  const int lo = hex_digit(s[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Length of the UTF-8 character starting at text[pos]; 1 for a byte that does not
// start a complete, well-formed sequence, so invalid input still round-trips.
size_t char_length(std::string_view text, size_t pos) {
  const uint8_t b = static_cast<uint8_t>(text[pos]);
  size_t n = 1;
  if ((b & 0xE0) == 0xC0 && b >= 0xC2) n = 2;
  else if ((b & 0xF0) == 0xE0) n = 3;
  else if ((b & 0xF8) == 0xF0 && b <= 0xF4) n = 4;
  if (pos + n > text.size()) return 1;
  for (size_t i = 1; i < n; ++i) {
    if (!is_continuation(static_cast<uint8_t>(text[pos + i]))) return 1;
  }
  return n;
}

std::string replace_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == ' ') out += kSpaceMarker;
    else out += c;
  }
  return out;
}

// The special id named by `key`, or `fallback` when the file does not have it.
StatusOr<int32_t> special_id(const GgufFile& file, std::string_view key, int32_t fallback) {
  StatusOr<uint64_t> v = file.get_uint(key);
  if (!v.ok()) {
    if (v.status().code() == StatusCode::kNotFound) return fallback;
    return v.status().with_context("tokenizer");
  }
  if (*v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("tokenizer: " + quoted(key) + " = " + std::to_string(*v) +
                            " is not a token id");
  }
  return static_cast<int32_t>(*v);
}

StatusOr<bool> flag(const GgufFile& file, std::string_view key, bool fallback) {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return fallback;
  if (v->type != GgufType::kBool) {
    return invalid_argument("tokenizer: " + quoted(key) + " is " +
                            std::string(gguf_type_name(v->type)) + ", expected bool");
  }
  return v->u != 0;
}

// A table that may be absent (then filled with `fallback`) but must otherwise be
// readable; the length is checked against the tokens later.
template <typename T>
StatusOr<std::vector<T>> optional_table(StatusOr<std::vector<T>> table, size_t n, T fallback) {
  if (table.ok()) return std::move(table).value();
  if (table.status().code() == StatusCode::kNotFound) return std::vector<T>(n, fallback);
  return table.status().with_context("tokenizer");
}

// One symbol of the merge list: a run of bytes of the segment, linked to its
// neighbours. A symbol merged into its left neighbour has n == 0.
struct Symbol {
  size_t start = 0;
  size_t n = 0;
  int32_t prev = -1;
  int32_t next = -1;
};

// A candidate merge of symbols left and right (adjacent when queued). `size` is
// the merged length then; a mismatch later means one side has since changed.
struct Bigram {
  int32_t left = 0;
  int32_t right = 0;
  float score = 0;
  size_t size = 0;
};

// Highest score first; among equal scores the leftmost pair.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

StatusOr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  StatusOr<std::string_view> model = file.get_string("tokenizer.ggml.model");
  if (model.ok() && *model != "llama") {
    return unimplemented("tokenizer: tokenizer.ggml.model " + quoted(*model) +
                         " is not supported (expected 'llama')");
  }
  NPURT_ASSIGN_OR_RETURN(std::vector<std::string_view> views,
                         file.get_string_array("tokenizer.ggml.tokens"));
  std::vector<std::string> tokens(views.begin(), views.end());
  const size_t n = tokens.size();
  NPURT_ASSIGN_OR_RETURN(std::vector<float> scores,
                         optional_table(file.get_float_array("tokenizer.ggml.scores"), n, 0.0f));
  NPURT_ASSIGN_OR_RETURN(
      std::vector<int32_t> types,
      optional_table(file.get_int_array("tokenizer.ggml.token_type"), n,
                     static_cast<int32_t>(TokenType::kNormal)));
  Specials s;
  NPURT_ASSIGN_OR_RETURN(s.bos, special_id(file, "tokenizer.ggml.bos_token_id", s.bos));
  NPURT_ASSIGN_OR_RETURN(s.eos, special_id(file, "tokenizer.ggml.eos_token_id", s.eos));
  NPURT_ASSIGN_OR_RETURN(s.unk, special_id(file, "tokenizer.ggml.unknown_token_id", s.unk));
  NPURT_ASSIGN_OR_RETURN(s.pad, special_id(file, "tokenizer.ggml.padding_token_id", s.pad));
  NPURT_ASSIGN_OR_RETURN(s.add_bos, flag(file, "tokenizer.ggml.add_bos_token", s.add_bos));
  return from_vocab(std::move(tokens), std::move(scores), std::move(types), s);
}

StatusOr<Tokenizer> Tokenizer::from_vocab(std::vector<std::string> tokens,
                                          std::vector<float> scores,
                                          std::vector<int32_t> types, Specials specials) {
  const size_t n = tokens.size();
  if (n == 0) return invalid_argument("tokenizer: the vocabulary has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("tokenizer: " + std::to_string(n) + " tokens do not fit int32 ids");
  }
  if (scores.size() != n) {
    return invalid_argument("tokenizer: " + std::to_string(scores.size()) + " scores for " +
                            std::to_string(n) + " tokens");
  }
  if (types.size() != n) {
    return invalid_argument("tokenizer: " + std::to_string(types.size()) + " token types for " +
                            std::to_string(n) + " tokens");
  }
  const std::pair<const char*, int32_t> ids[] = {
      {"bos", specials.bos}, {"eos", specials.eos}, {"unk", specials.unk}, {"pad", specials.pad}};
  for (const auto& [name, id] : ids) {
    if (id < 0 || static_cast<size_t>(id) >= n) {
      return invalid_argument("tokenizer: " + std::string(name) + " id " + std::to_string(id) +
                              " is outside the vocabulary of " + std::to_string(n));
    }
  }
  Tokenizer t;
  t.tokens_ = std::move(tokens);
  t.scores_ = std::move(scores);
  t.types_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (types[i] < 0 || types[i] > static_cast<int32_t>(TokenType::kByte)) {
      return invalid_argument("tokenizer: token " + std::to_string(i) + " " +
                              quoted(t.tokens_[i]) + " has unknown type " +
                              std::to_string(types[i]));
    }
    t.types_[i] = static_cast<TokenType>(types[i]);
  }
  t.specials_ = specials;
  NPURT_RETURN_IF_ERROR(t.index());
  return t;
}

// Builds the lookup tables; fails on a byte token that is not spelled "<0xXX>".
Status Tokenizer::index() {
  byte_ids_.fill(-1);
  trie_ids_.assign(1, -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const int32_t id = static_cast<int32_t>(i);
    const std::string& text = tokens_[i];
    all_.emplace(text, id);
    switch (types_[i]) {
      case TokenType::kByte: {
        const int b = parse_byte_piece(text);
        if (b < 0) {
          return invalid_argument("tokenizer: byte token " + std::to_string(i) + " " +
                                  quoted(text) + " is not of the form <0xXX>");
        }
        if (byte_ids_[b] < 0) byte_ids_[b] = id;
        break;
      }
      case TokenType::kUserDefined:
        mergeable_.emplace(text, id);
        add_special(id);
        break;
      case TokenType::kControl:
        add_special(id);
        break;
      case TokenType::kUndefined:
      case TokenType::kNormal:
        mergeable_.emplace(text, id);
        break;
      case TokenType::kUnknown:
      case TokenType::kUnused:
        break;  // never produced by merging
    }
  }
  end_of_turn_ = find("<end_of_turn>");
  return ok_status();
}

void Tokenizer::add_special(int32_t id) {
  const std::string& text = tokens_[id];
  if (text.empty()) return;  // would match everywhere
  int32_t node = 0;
  for (char c : text) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto [it, inserted] = trie_edges_.emplace(key, static_cast<int32_t>(trie_ids_.size()));
    if (inserted) trie_ids_.push_back(-1);
    node = it->second;
  }
  if (trie_ids_[node] < 0) trie_ids_[node] = id;
}

std::pair<int32_t, size_t> Tokenizer::match_special(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
    auto it = trie_edges_.find(key);
    if (it == trie_edges_.end()) break;
    node = it->second;
    if (trie_ids_[node] >= 0) best = {trie_ids_[node], i + 1 - pos};
  }
  return best;
}

StatusOr<std::vector<int32_t>> Tokenizer::encode(std::string_view text, bool add_bos) const {
  // Symbol links are int32; a larger text is not a prompt.
  if (text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()) / 4) {
    return invalid_argument("tokenizer: text of " + std::to_string(text.size()) +
                            " bytes is too long to encode");
  }
  std::vector<int32_t> out;
  if (add_bos && specials_.add_bos) out.push_back(specials_.bos);
  size_t segment = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto [id, len] = match_special(text, pos);
    if (id < 0) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(segment, pos - segment), out);
    // A literal bos at the very start replaces the one added above.
    if (!(pos == 0 && id == specials_.bos && !out.empty())) out.push_back(id);
    pos += len;
    segment = pos;
  }
  encode_segment(text.substr(segment), out);
  return out;
}

// SentencePiece's BPE over one segment free of special tokens: a linked list of
// symbols and a priority queue of adjacent pairs whose concatenation is a piece.
// Stale queue entries are skipped rather than removed, so each merge costs
// O(log n) and the whole segment O(n log n).
void Tokenizer::encode_segment(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  const std::string text = replace_spaces(raw);
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = char_length(text, pos);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({pos, n, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
    pos += n;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = mergeable(std::string_view(text).substr(symbols[left].start, size));
    if (id >= 0) queue.push({left, right, scores_[id], size});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_pair(left.prev, b.left);
    try_pair(b.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = std::string_view(text).substr(symbols[i].start, symbols[i].n);
    const int32_t id = mergeable(piece);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Only a single character can lack a piece (every merge yields one).
    for (char c : piece) {
      const int32_t byte = byte_ids_[static_cast<uint8_t>(c)];
      out.push_back(byte >= 0 ? byte : specials_.unk);
    }
  }
}

int32_t Tokenizer::mergeable(std::string_view text) const {
  auto it = mergeable_.find(text);
  return it == mergeable_.end() ? -1 : it->second;
}

void Tokenizer::append_piece(int32_t id, std::string& out) const {
  if (id < 0 || id >= size()) return;
  const std::string& text = tokens_[id];
  switch (types_[id]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return;
    case TokenType::kByte:
      out += static_cast<char>(parse_byte_piece(text));
      return;
    default:
      break;
  }
  for (size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      out += ' ';
      pos += kSpaceMarker.size();
    } else {
      out += text[pos++];
    }
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) append_piece(id, out);
  return out;
}

std::string Tokenizer::token_text(int32_t id) const {
  std::string out;
  append_piece(id, out);
  return out;
}

bool Tokenizer::is_stop(int32_t id) const {
  return id == specials_.eos || (end_of_turn_ >= 0 && id == end_of_turn_);
}

std::string_view Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= size()) return {};
  return tokens_[id];
}

TokenType Tokenizer::type(int32_t id) const {
  if (id < 0 || id >= size()) return TokenType::kUndefined;
  return types_[id];
}

int32_t Tokenizer::find(std::string_view text) const {
  auto it = all_.find(text);
  return it == all_.end() ? -1 : it->second;
}

}  // namespace npurt::models
