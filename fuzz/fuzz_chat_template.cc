// libFuzzer entry point for chat templates (serve/chat_template.h), which come in model
// files and so are untrusted input.
//
// The input is a template's text. ChatTemplate::parse must give a template or an error
// that names its line; a template must render a fixed conversation (messages with
// string and list contents, a system turn, tools, the special pieces) to text within
// kMaxOutputBytes, or fail with an error that names its line: no crash, hang or leak,
// whatever the loops, macros, recursion or output of the template.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "serve/chat_template.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

const nlohmann::ordered_json& variables() {
  static const nlohmann::ordered_json v = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi \u00e9 <b>"},
      {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "user", "content": [{"type": "text", "text": " parts "}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "bos_token": "<bos>", "eos_token": "<eos>", "add_generation_prompt": true, "n": 3, "x": 2.5, "nothing": null
  })");
  return v;
}

bool names_line(const npurt::Status& s) { return s.message().rfind("chat template, line ", 0) == 0 || s.message().rfind("chat template:", 0) == 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = npurt::serve::ChatTemplate::parse(source);
  if (!t.ok()) {
    check(names_line(t.status()));
    return 0;
  }
  auto text = t->render(variables());
  if (!text.ok()) {
    check(names_line(text.status()));
    return 0;
  }
  check(text->size() <= npurt::serve::ChatTemplate::kMaxOutputBytes);
  return 0;
}
