// What a chat template can call: Jinja's filters and tests, the methods of Python's
// str, dict and list that templates use, and the global functions Hugging Face
// provides. Errors name the callee; the renderer adds the line.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npurt/base/status.h"
#include "serve/template_value.h"

namespace npurt::serve::tmpl {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Argument `name`, or positional `index` when not given by name; null if neither.
  const Value* get(std::string_view name, size_t index) const;
};

// Python's len() in code points for strings.
size_t length_of(const Value& v);
// The items `for` walks: a list's items, a dict's keys, a string's characters.
StatusOr<List> items_of(const Value& v);

StatusOr<Value> apply_filter(const std::string& name, const Value& v, const Args& args);
StatusOr<bool> apply_test(const std::string& name, const Value& v, const Args& args);
StatusOr<Value> call_method(const Value& target, const std::string& name, const Args& args);
// raise_exception, namespace, range, strftime_now.
StatusOr<Value> call_global(const std::string& name, const Args& args);
// Whether call_global knows `name` (raise_exception, namespace, range, strftime_now).
bool is_global_function(const std::string& name);

}  // namespace npurt::serve::tmpl
