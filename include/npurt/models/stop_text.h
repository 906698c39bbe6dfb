// StopText: the text of a stream of generated tokens, watched for stop strings.
//
//   StopText stops(&tokenizer, {"\n\n", "END"});
//   if (stops.add(token)) out.resize(stops.safe_tokens(true));  // a stop string matched
//   else hand_out(stops.safe_tokens(false));                     // tokens no stop can start in
//
// A stop string may span tokens, so the tokens whose text could still begin one are
// held back until the text moves past them; once one matches, the output ends with the
// last token wholly before it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npurt/models/tokenizer.h"

namespace npurt::models {

class StopText {
 public:
  // No stop strings: inactive, and `tokenizer` may be null.
  StopText(const Tokenizer* tokenizer, std::vector<std::string> stops);
  bool active() const { return !stops_.empty(); }
  // Appends `token`'s text; true if a stop string now matches (the first match stays).
  bool add(int32_t token);
  // How many of the added tokens can be handed out: those whose text ends where no stop
  // string can start any more (`final`: the stream ended, so none is held back); after
  // a match, the tokens wholly before it.
  size_t safe_tokens(bool final) const;

 private:
  const Tokenizer* tok_;
  std::vector<std::string> stops_;
  size_t hold_ = 0;  // bytes of text a stop string could still start in
  std::string text_;
  std::vector<size_t> ends_;  // text_ length after each token
  size_t match_ = std::string::npos;
};

}  // namespace npurt::models
