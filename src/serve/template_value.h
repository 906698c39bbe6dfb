// The values a chat template computes with: Python's as Jinja sees them (undefined,
// None, bools, integers, floats, strings, lists and dicts, the last two shared by
// reference as in Python), made from a request's JSON and printed as Python prints.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "npurt/base/status.h"

namespace npurt::serve::tmpl {

// The longest text or list a template may make (its output's bound too): what would
// pass it is refused, or, in repr(), cut just past it so that writing it is refused.
inline constexpr size_t kMaxTextBytes = 4 << 20;
// How deep lists and dicts may nest (a deeper one is refused where it would be made):
// printing, comparing and freeing walk them recursively.
inline constexpr int kMaxValueDepth = 64;
// Items one comparison may visit: shared parts make a small value a large tree.
inline constexpr uint64_t kMaxCompareItems = 1 << 20;

class Value;
using List = std::vector<Value>;
// Insertion-ordered, as Python's dict; chat templates hold few keys, so a vector.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): `{% set ns.x = ... %}` may change it
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// json.dumps's options that tojson passes on.
struct JsonStyle {
  int indent = -1;  // < 0: one line (indent=None); else newlines and this many spaces
  std::string item_separator, key_separator;  // empty: json.dumps's defaults
  bool sort_keys = false;
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };

  Value() = default;  // undefined
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value real(double d);
  static Value string(std::string s);
  static Value list(List items);
  // What select, reject, selectattr, rejectattr and map give: Jinja's generators, true
  // however empty (they have no len() either); otherwise a list.
  static Value generator(List items);
  static Value dict(Dict d);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_generator() const { return generator_; }
  // How deep its lists and dicts nest (0 for a scalar).
  int depth() const { return depth_; }
  // Whether it is or holds a namespace (known when it is made: no walk).
  bool holds_namespace() const { return holds_namespace_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? int64_t{b_} : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? d_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *list_; }
  List& mutable_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }

  // Python's truth value (undefined is false).
  bool truthy() const;
  // Python's str(): what {{ value }} prints (undefined prints nothing).
  std::string str() const;
  // Python's repr() (strings quoted), as inside a printed list or dict.
  std::string repr() const;
  // Its size in the unit kMaxTextBytes bounds: bytes of a string, items of a list.
  size_t size() const;
  // Roughly the bytes it holds itself (a list's items, not what they hold): what a
  // render is charged for making it.
  size_t footprint() const;
  // json.dumps(value, ensure_ascii=False, ...).
  StatusOr<std::string> to_json(const JsonStyle& style = {}) const;
  // Python's == (the same list or dict is equal to itself without a look inside);
  // refused past kMaxCompareItems.
  StatusOr<bool> equals(const Value& other) const;
  const char* type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool generator_ = false;
  bool holds_namespace_ = false;
  uint8_t depth_ = 0;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<std::string> s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
};

// Python's == of a and b within a budget of items (false when it runs out: *budget 0).
bool equal_within(const Value& a, const Value& b, uint64_t* budget);
// Python's repr() of a float ("1.0", "0.1", "1e-05").
std::string float_repr(double d);
// Where `needle` first occurs in `text` at or after `from` (npos if nowhere), in time
// linear in their lengths (memmem's two-way search; std::string::find can be quadratic).
size_t find_text(std::string_view text, std::string_view needle, size_t from = 0);
// Python's str.strip() and its two halves: Unicode whitespace off the ends.
std::string_view strip_whitespace(std::string_view s, bool left, bool right);

}  // namespace npurt::serve::tmpl
