// Renders chat templates for tests/serve/test_chat_template.py, which compares the
// text with Python's jinja2. Reads a JSON array of cases from stdin, each
// {"template": TEXT, "variables": {...}}, and writes a JSON array of results, each
// {"text": TEXT} or {"error": MESSAGE} (a parse or render failure).
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/chat_template.h"

int main() {
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!cases.is_array()) {
    std::cerr << "render_chat_template: stdin must be a JSON array of cases\n";
    return 2;
  }
  nlohmann::json results = nlohmann::json::array();
  for (const nlohmann::ordered_json& c : cases) {
    if (!c.is_object() || !c.contains("template") || !c["template"].is_string()) {
      results.push_back({{"error", "a case must be an object with a string \"template\""}});
      continue;
    }
    const auto t = npurt::serve::ChatTemplate::parse(c["template"].get<std::string>());
    if (!t.ok()) {
      results.push_back({{"error", t.status().message()}});
      continue;
    }
    const auto text = t->render(c.contains("variables") ? c["variables"] : nlohmann::ordered_json::object());
    if (text.ok()) {
      results.push_back({{"text", *text}});
    } else {
      results.push_back({{"error", text.status().message()}});
    }
  }
  std::cout << results.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}
