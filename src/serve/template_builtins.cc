#include "serve/template_builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <ctime>

namespace npurt::serve::tmpl {
namespace {

constexpr size_t kMaxRange = kMaxTextBytes / sizeof(Value);  // the longest list a value may be

Status bad(const std::string& callee, const std::string& why) { return invalid_argument(callee + ": " + why); }

// The characters of UTF-8 text, each as its bytes (a stray byte is a character).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(c));
  }
  return s;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_map(s, [](int c) { return std::tolower(c); });
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80) out[0] = static_cast<char>(std::toupper(out[0]));
  return out;
}

bool is_space_char(const std::string& c) { return strip_whitespace(c, true, false).empty(); }

// str.title(): a letter after a non-letter starts a word. Non-ASCII characters count
// as letters unless they are whitespace (case mapping stays ASCII).
std::string title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (std::string c : characters(s)) {
    const auto b = static_cast<unsigned char>(c[0]);
    const bool letter = b >= 0x80 ? !is_space_char(c) : std::isalpha(b) != 0;
    if (b < 0x80 && letter) c[0] = static_cast<char>(word_start ? std::toupper(b) : std::tolower(b));
    word_start = !letter;
    out += c;
  }
  return out;
}

// Jinja's title filter (not str.title()): the text cut before runs of '-', whitespace,
// '(', '{', '[' and '<'; each piece's first character upper case, the rest lower.
std::string title_filter(const std::string& s) {
  auto separator = [](const std::string& c) { return c == "-" || c == "(" || c == "{" || c == "[" || c == "<" || is_space_char(c); };
  std::string out;
  bool piece_start = true;
  for (std::string c : characters(s)) {
    if (separator(c)) {
      piece_start = true;
    } else {
      const auto b = static_cast<unsigned char>(c[0]);
      if (b < 0x80) c[0] = static_cast<char>(piece_start ? std::toupper(b) : std::tolower(b));
      piece_start = false;
    }
    out += c;
  }
  return out;
}

// Jinja's escape filter (markupsafe): & < > " ' as entities.
std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Python's float(text): decimal or inf / nan spellings, underscores between digits; no
// hexadecimal (strtod reads "0x10", Python does not).
bool parse_python_float(std::string text, double* out) {
  if (text.empty() || text.find_first_of("xXpP") != std::string::npos) return false;
  std::string plain;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '_') {
      plain += text[i];
      continue;
    }
    const bool between_digits = i > 0 && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i - 1])) &&
                                std::isdigit(static_cast<unsigned char>(text[i + 1]));
    if (!between_digits) return false;
  }
  char* end = nullptr;
  *out = std::strtod(plain.c_str(), &end);
  return *end == '\0';
}

StatusOr<std::string> string_arg(const std::string& callee, const Value* v, const char* what) {
  if (v == nullptr || !v->is(Value::Kind::kString)) return bad(callee, std::string(what) + " must be a string");
  return v->as_string();
}

// str.strip(chars) and its halves: `chars` absent or None strips whitespace.
StatusOr<std::string> strip(const std::string& callee, const std::string& s, const Value* chars, bool left, bool right) {
  if (chars == nullptr || chars->is(Value::Kind::kNone)) return std::string(strip_whitespace(s, left, right));
  NPURT_ASSIGN_OR_RETURN(std::string set, string_arg(callee, chars, "the characters to strip"));
  const std::vector<std::string> cs = characters(s), strip_set = characters(set);
  auto stripped = [&](const std::string& c) { return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end(); };
  size_t b = 0, e = cs.size();
  while (left && b < e && stripped(cs[b])) ++b;
  while (right && e > b && stripped(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

StatusOr<Value> replace(const std::string& callee, const std::string& s, const Args& a) {
  NPURT_ASSIGN_OR_RETURN(std::string from, string_arg(callee, a.get("old", 0), "the text to replace"));
  NPURT_ASSIGN_OR_RETURN(std::string to, string_arg(callee, a.get("new", 1), "the replacement"));
  const Value* count = a.get("count", 2);
  int64_t left = count != nullptr && count->is_number() ? count->as_int() : -1;
  std::string out;
  const auto too_long = [&] {
    return bad(callee, "the text would pass " + std::to_string(kMaxTextBytes) + " bytes");
  };
  if (from.empty()) {  // Python puts the replacement between characters
    for (const std::string& c : characters(s)) {
      if (left-- != 0) out += to;
      out += c;
      if (out.size() > kMaxTextBytes) return too_long();
    }
    if (left != 0) out += to;
    return Value::string(std::move(out));
  }
  size_t pos = 0;
  for (size_t hit; left != 0 && (hit = find_text(s, from, pos)) != std::string::npos; --left) {
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    if (out.size() > kMaxTextBytes) return too_long();
  }
  out.append(s, pos);
  return Value::string(std::move(out));
}

StatusOr<Value> split(const std::string& s, const Args& a) {
  const Value* sep = a.get("sep", 0);
  const Value* maxsplit = a.get("maxsplit", 1);
  int64_t left = maxsplit != nullptr && maxsplit->is_number() ? maxsplit->as_int() : -1;
  List out;
  if (sep == nullptr || sep->is(Value::Kind::kNone)) {  // runs of whitespace, ends ignored
    const std::vector<std::string> cs = characters(s);
    size_t i = 0;
    while (true) {
      while (i < cs.size() && is_space_char(cs[i])) ++i;
      if (i == cs.size()) break;
      std::string word;
      if (left == 0) {  // the rest, less its trailing whitespace
        for (; i < cs.size(); ++i) word += cs[i];
        out.push_back(Value::string(std::string(strip_whitespace(word, false, true))));
        break;
      }
      for (; i < cs.size() && !is_space_char(cs[i]); ++i) word += cs[i];
      out.push_back(Value::string(std::move(word)));
      --left;
    }
    return Value::list(std::move(out));
  }
  NPURT_ASSIGN_OR_RETURN(std::string on, string_arg("split", sep, "the separator"));
  if (on.empty()) return bad("split", "an empty separator");
  size_t pos = 0;
  for (size_t hit; left != 0 && (hit = find_text(s, on, pos)) != std::string::npos; --left) {
    out.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + on.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return Value::list(std::move(out));
}

// startswith / endswith: a string or a list of them.
StatusOr<Value> affix(const std::string& name, const std::string& s, const Args& a) {
  const Value* p = a.get("prefix", 0);
  if (p == nullptr) return bad(name, "what to look for is missing");
  std::vector<std::string> options;
  if (p->is(Value::Kind::kString)) {
    options.push_back(p->as_string());
  } else if (p->is(Value::Kind::kList)) {
    for (const Value& v : p->as_list()) {
      if (!v.is(Value::Kind::kString)) return bad(name, "a list of strings is expected");
      options.push_back(v.as_string());
    }
  } else {
    return bad(name, "a string or a list of strings is expected");
  }
  const bool starts = name == "startswith";
  for (const std::string& o : options) {
    if (o.size() > s.size()) continue;
    if (starts ? s.compare(0, o.size(), o) == 0 : s.compare(s.size() - o.size(), o.size(), o) == 0) {
      return Value::boolean(true);
    }
  }
  return Value::boolean(false);
}

StatusOr<Value> string_method(const std::string& s, const std::string& name, const Args& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    NPURT_ASSIGN_OR_RETURN(std::string out, strip(name, s, a.get("chars", 0), name != "rstrip", name != "lstrip"));
    return Value::string(std::move(out));
  }
  if (name == "startswith" || name == "endswith") return affix(name, s, a);
  if (name == "upper") return Value::string(ascii_map(s, [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value::string(ascii_map(s, [](int c) { return std::tolower(c); }));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "title") return Value::string(title(s));
  if (name == "replace") return replace(name, s, a);
  if (name == "split") return split(s, a);
  if (name == "find" || name == "count") {
    NPURT_ASSIGN_OR_RETURN(std::string what, string_arg(name, a.get("sub", 0), "what to look for"));
    if (name == "find") {
      const size_t at = find_text(s, what);
      return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(characters(s.substr(0, at)).size()));
    }
    if (what.empty()) return Value::integer(static_cast<int64_t>(characters(s).size() + 1));
    int64_t n = 0;
    for (size_t pos = find_text(s, what); pos != std::string::npos; pos = find_text(s, what, pos + what.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = a.get("iterable", 0);
    if (items == nullptr) return bad(name, "what to join is missing");
    NPURT_ASSIGN_OR_RETURN(List parts, items_of(*items));
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].is(Value::Kind::kString)) return bad(name, std::string("item ") + std::to_string(i) + " is a " + parts[i].type_name());
      out += (i ? s : "") + parts[i].as_string();
      if (out.size() > kMaxTextBytes) return bad(name, "the text would pass " + std::to_string(kMaxTextBytes) + " bytes");
    }
    return Value::string(std::move(out));
  }
  return bad(name, "str has no method '" + name + "'");
}

StatusOr<Value> dict_method(const Dict& d, const std::string& name, const Args& a) {
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    for (const auto& [k, v] : d.items) {
      if (name == "items") out.push_back(Value::list({Value::string(k), v}));
      if (name == "keys") out.push_back(Value::string(k));
      if (name == "values") out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const Value* key = a.get("key", 0);
    if (key == nullptr) return bad(name, "the key is missing");
    const Value* found = key->is(Value::Kind::kString) ? d.find(key->as_string()) : nullptr;
    if (found != nullptr) return *found;
    const Value* fallback = a.get("default", 1);
    return fallback != nullptr ? *fallback : Value::none();
  }
  return bad(name, "dict has no method '" + name + "'");
}

// Python's ordering of two values of one kind (numbers, strings, lists).
StatusOr<int> compare(const Value& a, const Value& b, int depth = 0) {
  if (a.is_number() && b.is_number()) {
    if (a.is(Value::Kind::kFloat) || b.is(Value::Kind::kFloat)) {
      return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is(Value::Kind::kString) && b.is(Value::Kind::kString)) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is(Value::Kind::kList) && b.is(Value::Kind::kList) && depth < kMaxValueDepth) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      NPURT_ASSIGN_OR_RETURN(bool same, x[i].equals(y[i]));
      if (!same) return compare(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return invalid_argument(std::string("'<' is not supported between ") + a.type_name() + " and " + b.type_name());
}

// Python's x % 2 for the even and odd tests (floats and bools too): even is x % 2 == 0,
// odd x % 2 == 1 (so 0.5 is neither).
StatusOr<double> mod_two(const std::string& name, const Value& v) {
  if (v.is(Value::Kind::kFloat)) {
    const double r = std::fmod(v.as_double(), 2.0);
    return r < 0 ? r + 2.0 : r;
  }
  if (!v.is_number()) return bad(name, std::string("a ") + v.type_name() + " is not a number");
  const int64_t r = v.as_int() % 2;
  return static_cast<double>(r < 0 ? r + 2 : r);
}

// `x.attribute` as Jinja's selectattr and map read it (dotted paths allowed).
Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = std::min(path.find('.', pos), path.size());
    const std::string part = path.substr(pos, dot - pos);
    if (!cur.is(Value::Kind::kDict)) return Value();
    const Value* next = cur.as_dict().find(part);
    if (next == nullptr) return Value();
    cur = *next;
    pos = dot + 1;
  }
  return cur;
}

StatusOr<Value> select(const std::string& name, const Value& v, const Args& a) {
  NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  std::string attr;
  size_t next = 0;
  if (by_attr) {
    NPURT_ASSIGN_OR_RETURN(attr, string_arg(name, a.get("attribute", 0), "the attribute"));
    next = 1;
  }
  const Value* test = next < a.positional.size() ? &a.positional[next] : nullptr;
  if (test != nullptr && !test->is(Value::Kind::kString)) return bad(name, "the test must be named by a string");
  Args test_args;
  for (size_t i = next + 1; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  List out;
  for (const Value& item : items) {
    const Value subject = by_attr ? attribute_of(item, attr) : item;
    bool passes = subject.truthy();
    if (test != nullptr) {
      NPURT_ASSIGN_OR_RETURN(passes, apply_test(test->as_string(), subject, test_args));
    }
    if (passes == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

StatusOr<Value> map(const Value& v, const Args& a) {
  NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
  List out;
  if (const Value* attr = a.get("attribute", 99); attr != nullptr) {
    NPURT_ASSIGN_OR_RETURN(std::string path, string_arg("map", attr, "the attribute"));
    const Value* fallback = a.get("default", 99);
    for (const Value& item : items) {
      Value x = attribute_of(item, path);
      out.push_back(x.is(Value::Kind::kUndefined) && fallback != nullptr ? *fallback : x);
    }
    return Value::generator(std::move(out));
  }
  NPURT_ASSIGN_OR_RETURN(std::string filter, string_arg("map", a.get("", 0), "the filter"));
  Args rest;
  for (size_t i = 1; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  for (const Value& item : items) {
    NPURT_ASSIGN_OR_RETURN(Value x, apply_filter(filter, item, rest));
    out.push_back(std::move(x));
  }
  return Value::generator(std::move(out));
}

StatusOr<Value> join(const Value& v, const Args& a) {
  NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
  const Value* sep = a.get("d", 0);
  const Value* attr = a.get("attribute", 1);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0 && sep != nullptr) out += sep->str();
    out += (attr != nullptr ? attribute_of(items[i], attr->str()) : items[i]).str();
    if (out.size() > kMaxTextBytes) return bad("join", "the text would pass " + std::to_string(kMaxTextBytes) + " bytes");
  }
  return Value::string(std::move(out));
}

}  // namespace

const Value* Args::get(std::string_view name, size_t index) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return index < positional.size() ? &positional[index] : nullptr;
}

size_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: {
      size_t n = 0;  // characters: bytes that do not continue one
      for (const char c : v.as_string()) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
      return n;
    }
    case Value::Kind::kList: return v.as_list().size();
    case Value::Kind::kDict: return v.as_dict().items.size();
    default: return 0;
  }
}

StatusOr<List> items_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return List{};  // Jinja iterates an undefined value as empty
    case Value::Kind::kList: return v.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, _] : v.as_dict().items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (std::string& c : characters(v.as_string())) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default: return invalid_argument(std::string("a ") + v.type_name() + " is not iterable");
  }
}

StatusOr<Value> apply_filter(const std::string& name, const Value& v, const Args& a) {
  const bool is_string = v.is(Value::Kind::kString);
  if (name == "safe") return v;
  if (name == "string") return Value::string(v.str());
  if (name == "e" || name == "escape") return Value::string(html_escape(v.str()));
  if (name == "default" || name == "d") {
    const Value* boolean = a.get("boolean", 1);
    const bool use_fallback = v.is(Value::Kind::kUndefined) || (boolean != nullptr && boolean->truthy() && !v.truthy());
    const Value* fallback = a.get("default_value", 0);
    return use_fallback ? (fallback != nullptr ? *fallback : Value::string("")) : v;
  }
  if (name == "length" || name == "count") {
    if (v.is_generator()) return bad(name, "a generator has no length (make it a list first)");
    if (!is_string && !v.is(Value::Kind::kList) && !v.is(Value::Kind::kDict) && !v.is(Value::Kind::kUndefined)) {
      return bad(name, std::string("a ") + v.type_name() + " has no length");
    }
    return Value::integer(static_cast<int64_t>(length_of(v)));
  }
  if (name == "tojson") {
    JsonStyle style;
    if (const Value* indent = a.get("indent", 0); indent != nullptr && !indent->is(Value::Kind::kNone)) {
      if (!indent->is(Value::Kind::kInt)) return bad(name, "the indent must be an integer");
      if (indent->as_int() > 64) return bad(name, "an indent of more than 64");
      style.indent = static_cast<int>(std::max<int64_t>(indent->as_int(), 0));
    }
    if (const Value* seps = a.get("separators", 2); seps != nullptr && !seps->is(Value::Kind::kNone)) {
      if (!seps->is(Value::Kind::kList) || seps->as_list().size() != 2 || !seps->as_list()[0].is(Value::Kind::kString) ||
          !seps->as_list()[1].is(Value::Kind::kString)) {
        return bad(name, "separators must be two strings");
      }
      style.item_separator = seps->as_list()[0].as_string();
      style.key_separator = seps->as_list()[1].as_string();
    }
    if (const Value* sort = a.get("sort_keys", 3); sort != nullptr) style.sort_keys = sort->truthy();
    NPURT_ASSIGN_OR_RETURN(std::string text, v.to_json(style));
    return Value::string(std::move(text));
  }
  if (name == "trim" || name == "upper" || name == "lower" || name == "capitalize" || name == "title" || name == "replace") {
    const std::string s = v.str();
    if (name == "trim") {
      NPURT_ASSIGN_OR_RETURN(std::string out, strip(name, s, a.get("chars", 0), true, true));
      return Value::string(std::move(out));
    }
    if (name == "title") return Value::string(title_filter(s));
    return string_method(s, name, a);
  }
  if (name == "first" || name == "last") {
    NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
    return Value::list(std::move(items));
  }
  if (name == "reverse") {
    NPURT_ASSIGN_OR_RETURN(List items, items_of(v));
    std::reverse(items.begin(), items.end());
    if (!is_string) return Value::list(std::move(items));
    std::string out;
    for (const Value& c : items) out += c.as_string();
    return Value::string(std::move(out));
  }
  if (name == "items") {
    if (v.is(Value::Kind::kUndefined)) return Value::list({});
    if (!v.is(Value::Kind::kDict)) return bad(name, std::string("a ") + v.type_name() + " is not a mapping");
    return dict_method(v.as_dict(), "items", {});
  }
  if (name == "join") return join(v, a);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") return select(name, v, a);
  if (name == "map") return map(v, a);
  if (name == "int") {
    // Python's int(x), else int(float(x)) for a string; the default where neither works.
    double d = 0;
    bool real = false;
    if (v.is(Value::Kind::kFloat)) {
      d = v.as_double();
      real = true;
    } else if (v.is_number()) {
      return Value::integer(v.as_int());
    } else if (is_string) {
      const std::string text(strip_whitespace(v.as_string(), true, true));
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0' && errno == 0) return Value::integer(i);
      real = parse_python_float(text, &d);
    }
    if (real && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<int64_t>(d));
    if (real && std::isfinite(d)) return bad(name, "the integer is too large");
    const Value* fallback = a.get("default", 0);
    return fallback != nullptr ? *fallback : Value::integer(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::real(v.as_double());
    double d = 0;
    if (is_string && parse_python_float(std::string(strip_whitespace(v.as_string(), true, true)), &d)) return Value::real(d);
    const Value* fallback = a.get("default", 0);
    return fallback != nullptr ? *fallback : Value::real(0);
  }
  if (name == "abs") {
    if (v.is(Value::Kind::kFloat)) return Value::real(std::fabs(v.as_double()));
    if (!v.is_number()) return bad(name, std::string("a ") + v.type_name() + " has no absolute value");
    if (v.as_int() == INT64_MIN) return bad(name, "integer overflow");
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  return invalid_argument("the filter '" + name + "' is not supported");
}

StatusOr<bool> apply_test(const std::string& name, const Value& v, const Args& a) {
  using K = Value::Kind;
  if (name == "defined") return !v.is(K::kUndefined);
  if (name == "undefined") return v.is(K::kUndefined);
  if (name == "none") return v.is(K::kNone);
  if (name == "string") return v.is(K::kString);
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is(K::kInt);
  if (name == "float") return v.is(K::kFloat);
  if (name == "boolean") return v.is(K::kBool);
  if (name == "true") return v.is(K::kBool) && v.as_bool();
  if (name == "false") return v.is(K::kBool) && !v.as_bool();
  if (name == "mapping") return v.is(K::kDict);
  if (name == "iterable") return v.is(K::kString) || v.is(K::kList) || v.is(K::kDict) || v.is(K::kUndefined);
  if (name == "sequence") {
    return v.is(K::kString) || (v.is(K::kList) && !v.is_generator()) || v.is(K::kDict) || v.is(K::kUndefined);
  }
  if (name == "callable") return false;
  if (name == "lower" || name == "upper") {  // str.islower() / isupper(): a cased letter, none of the other case
    if (!v.is(K::kString)) return false;
    bool cased = false;
    for (const char c : v.as_string()) {
      if (std::islower(static_cast<unsigned char>(c)) != 0) {
        if (name == "upper") return false;
        cased = true;
      } else if (std::isupper(static_cast<unsigned char>(c)) != 0) {
        if (name == "lower") return false;
        cased = true;
      }
    }
    return cased;
  }
  if (name == "even" || name == "odd") {
    NPURT_ASSIGN_OR_RETURN(double r, mod_two(name, v));
    return r == (name == "even" ? 0.0 : 1.0);
  }
  const Value* other = a.get("", 0);
  if (other == nullptr) return invalid_argument("the test '" + name + "' is not supported or misses its argument");
  if (name == "divisibleby") {
    if (!v.is(K::kInt) || !other->is(K::kInt) || other->as_int() == 0) return bad(name, "needs integers, not 0");
    if (other->as_int() == -1) return true;  // INT64_MIN % -1 traps
    return v.as_int() % other->as_int() == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v.equals(*other);
  if (name == "ne" || name == "!=") {
    NPURT_ASSIGN_OR_RETURN(bool same, v.equals(*other));
    return !same;
  }
  if (name == "lt" || name == "le" || name == "gt" || name == "ge" || name == "lessthan" || name == "greaterthan") {
    NPURT_ASSIGN_OR_RETURN(int c, compare(v, *other));
    if (name == "lt" || name == "lessthan") return c < 0;
    if (name == "le") return c <= 0;
    if (name == "gt" || name == "greaterthan") return c > 0;
    return c >= 0;
  }
  if (name == "in") {
    if (other->is(K::kString) && v.is(K::kString)) return find_text(other->as_string(), v.as_string()) != std::string::npos;
    NPURT_ASSIGN_OR_RETURN(List items, items_of(*other));
    for (const Value& x : items) {
      NPURT_ASSIGN_OR_RETURN(bool same, x.equals(v));
      if (same) return true;
    }
    return false;
  }
  return invalid_argument("the test '" + name + "' is not supported");
}

StatusOr<Value> call_method(const Value& target, const std::string& name, const Args& a) {
  if (target.is(Value::Kind::kString)) return string_method(target.as_string(), name, a);
  if (target.is(Value::Kind::kDict) && !target.as_dict().is_namespace) return dict_method(target.as_dict(), name, a);
  return invalid_argument(std::string("a ") + target.type_name() + " has no method '" + name + "'");
}

bool is_global_function(const std::string& name) {
  return name == "raise_exception" || name == "namespace" || name == "range" || name == "strftime_now";
}

StatusOr<Value> call_global(const std::string& name, const Args& a) {
  if (name == "raise_exception") {
    const Value* message = a.get("message", 0);
    return invalid_argument(message != nullptr ? message->str() : std::string("the template raised an error"));
  }
  if (name == "namespace") {
    Dict d;
    d.is_namespace = true;
    for (const auto& [k, v] : a.keyword) d.set(k, v);
    return Value::dict(std::move(d));
  }
  if (name == "range") {
    int64_t bounds[3] = {0, 0, 1};
    if (a.positional.empty() || a.positional.size() > 3) return bad(name, "takes 1 to 3 integers");
    for (size_t i = 0; i < a.positional.size(); ++i) {
      if (!a.positional[i].is(Value::Kind::kInt)) return bad(name, "takes integers");
    }
    if (a.positional.size() == 1) {
      bounds[1] = a.positional[0].as_int();
    } else {
      for (size_t i = 0; i < a.positional.size(); ++i) bounds[i] = a.positional[i].as_int();
    }
    if (bounds[2] == 0) return bad(name, "a step of 0");
    List out;
    for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1];) {
      if (out.size() >= kMaxRange) return bad(name, "more than " + std::to_string(kMaxRange) + " numbers");
      out.push_back(Value::integer(i));
      if (__builtin_add_overflow(i, bounds[2], &i)) break;  // past INT64's end: the range ends too
    }
    return Value::list(std::move(out));
  }
  if (name == "strftime_now") {
    const Value* format = a.get("format", 0);
    if (format == nullptr || !format->is(Value::Kind::kString)) return bad(name, "takes a format string");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, format->as_string().c_str(), &local);
    return Value::string(std::string(buf, n));
  }
  return invalid_argument("'" + name + "' is undefined or not callable");
}

}  // namespace npurt::serve::tmpl
