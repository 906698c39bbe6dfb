#include "npurt/models/stop_text.h"

#include <algorithm>

namespace npurt::models {

StopText::StopText(const Tokenizer* tokenizer, std::vector<std::string> stops)
    : tok_(tokenizer), stops_(std::move(stops)) {
  for (const std::string& s : stops_) hold_ = std::max(hold_, s.size() - 1);
}

bool StopText::add(int32_t token) {
  const size_t from = text_.size() > hold_ ? text_.size() - hold_ : 0;
  text_ += tok_->token_text(token);
  ends_.push_back(text_.size());
  for (const std::string& s : stops_) {
    const size_t at = text_.find(s, from);
    if (at != std::string::npos) match_ = std::min(match_, at);
  }
  return match_ != std::string::npos;
}

size_t StopText::safe_tokens(bool final) const {
  const size_t limit = match_ != std::string::npos ? match_
                       : final                     ? text_.size()
                                                   : text_.size() - std::min(hold_, text_.size());
  size_t n = 0;
  while (n < ends_.size() && ends_[n] <= limit) ++n;
  return n;
}

}  // namespace npurt::models
