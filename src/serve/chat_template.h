// A model file's chat template (`tokenizer.chat_template`): the Jinja program that
// turns chat messages into the prompt text the model was tuned on. Parsed once, rendered
// per request with the variables chat templates expect (messages, bos_token,
// eos_token, add_generation_prompt, ...), as Hugging Face renders them: trim_blocks and
// lstrip_blocks on, break and continue, `raise_exception`, `namespace`, `range`,
// `strftime_now`, and a `tojson` that writes json.dumps's text.
//
// It runs the subset of Jinja that chat templates use (docs/serve.md lists it); a
// template beyond it is refused at parse time by name and line. Templates are
// untrusted: rendering is bounded in output, loop iterations and nesting, and every
// failure is a Status, never a crash.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "npurt/base/status.h"

namespace npurt::serve {

namespace tmpl {
struct Node;
}

class ChatTemplate {
 public:
  // Bounds of one rendering.
  static constexpr size_t kMaxOutputBytes = 4 << 20;
  static constexpr uint64_t kMaxSteps = 1'000'000;  // statements, expressions and loop passes

  static StatusOr<ChatTemplate> parse(std::string_view source);

  // The text for `variables` (a JSON object, read in its own key order: a dict the
  // template prints or writes as JSON keeps the order the client gave). A `raise_exception(msg)` of the template
  // comes back as kInvalidArgument with msg.
  StatusOr<std::string> render(const nlohmann::ordered_json& variables) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<tmpl::Node>> body) : body_(std::move(body)) {}
  std::shared_ptr<const std::vector<tmpl::Node>> body_;
};

}  // namespace npurt::serve
