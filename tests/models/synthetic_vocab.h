// Small Gemma-style tokenizer vocabularies for tests and fuzzers: the control tokens
// at Gemma's ids, the 256 byte tokens <0x00>..<0xFF>, then SentencePiece pieces with
// scores. Plain tables, so a caller picks how to report a from_vocab() failure.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace npurt::models {

inline const std::string kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

struct SyntheticVocab {
  static constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;

  explicit SyntheticVocab(bool with_bytes = true, bool with_turns = true) {
    add_typed("<pad>", 0, kControl);
    add_typed("<eos>", 0, kControl);
    add_typed("<bos>", 0, kControl);
    add_typed("<unk>", 0, kUnknown);
    if (with_turns) {
      add_typed("<start_of_turn>", 0, kControl);
      add_typed("<end_of_turn>", 0, kControl);
    }
    if (with_bytes) {
      for (int b = 0; b < 256; ++b) {
        char text[8];
        std::snprintf(text, sizeof(text), "<0x%02X>", b);
        add_typed(text, 0, kByte);
      }
    }
  }
  int32_t add_typed(const std::string& text, float score, int32_t type) {
    tokens.push_back(text);
    scores.push_back(score);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  int32_t add(const std::string& text, float score) { return add_typed(text, score, kNormal); }

  // Printable ASCII, "▁", a few words with every prefix as a piece (so each word is
  // reachable by pairwise merges) and some inner pieces.
  void add_word_pieces() {
    add(kSpaceMarker, -1);
    for (char c = '!'; c <= '~'; ++c) add(std::string(1, c), -50);
    add("\n", -50);
    for (const std::string w : {"the", "capital", "of", "France", "is"}) {
      const std::string word = kSpaceMarker + w;
      for (size_t n = kSpaceMarker.size() + 1; n <= word.size(); ++n) {
        add(word.substr(0, n), -static_cast<float>(word.size() - n + 1));
      }
    }
    for (const std::string p : {"th", "he", "the", "ca", "pi", "tal"}) add(p, -5);
  }

  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

}  // namespace npurt::models
