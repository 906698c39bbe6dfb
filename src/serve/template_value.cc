#include "serve/template_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace npurt::serve::tmpl {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::real(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<std::string>(std::move(s));
  return v;
}

namespace {

uint8_t depth_over(int deepest_item) { return static_cast<uint8_t>(std::min(deepest_item + 1, 255)); }

}  // namespace

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::kList;
  int deepest = 0;
  for (const Value& item : items) {
    deepest = std::max(deepest, item.depth());
    v.holds_namespace_ |= item.holds_namespace();
  }
  v.depth_ = depth_over(deepest);
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::generator(List items) {
  Value v = list(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  int deepest = 0;
  v.holds_namespace_ = d.is_namespace;
  for (const auto& [_, item] : d.items) {
    deepest = std::max(deepest, item.depth());
    v.holds_namespace_ |= item.holds_namespace();
  }
  v.depth_ = depth_over(deepest);
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? real(static_cast<double>(u)) : integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e));
      return dict(std::move(d));
    }
    default: return Value();
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return d_ != 0;
    case Kind::kString: return !s_->empty();
    case Kind::kList: return generator_ || !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Python writes the shortest digits that read back, positionally for exponents
  // -5 < e < 16, else as d.ddde[+-]XX.
  char digits[32];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, d, std::chars_format::scientific);
  (void)ec;
  const std::string sci(digits, end);
  const size_t e_at = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_at + 1));
  if (exponent < -4 || exponent >= 16) {
    std::string mantissa = sci.substr(0, e_at);
    const std::string sign = exponent < 0 ? "-" : "+";
    const int mag = std::abs(exponent);
    return mantissa + "e" + sign + (mag < 10 ? "0" : "") + std::to_string(mag);
  }
  const auto [fend, fec] = std::to_chars(digits, digits + sizeof digits, d, std::chars_format::fixed);
  (void)fec;
  std::string fixed(digits, fend);
  if (fixed.find('.') == std::string::npos) fixed += ".0";
  return fixed;
}

namespace {

// The code point of UTF-8 at s[i] and its length; a stray byte counts as itself.
std::pair<uint32_t, size_t> decode_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return {b, 1};
  uint32_t cp = n == 1 ? b : b & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  return {cp, n};
}

// Characters Python's repr() escapes: controls, separators other than the space, and
// the common format characters (unassigned code points are not known here).
bool unprintable(uint32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || c == 0x1680 || (c >= 0x2000 && c <= 0x200f) ||
         (c >= 0x2028 && c <= 0x202f) || (c >= 0x205f && c <= 0x2064) || (c >= 0x2066 && c <= 0x206f) ||
         c == 0x3000 || c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb) || (c >= 0xd800 && c <= 0xdfff);
}

// Python's repr of a str: single quotes unless the text holds one and no double one.
std::string string_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = decode_at(s, i);
    const char c = s[i];
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (unprintable(cp)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  return out + q;
}

const std::string kComma = ",", kCommaSpace = ", ", kColonSpace = ": ";

// json.dumps's string (ensure_ascii=False): nlohmann's escapes are Python's.
void json_string(const std::string& s, std::string& out) {
  out += nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status json_into(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  if (depth > kMaxValueDepth) return invalid_argument("tojson: a value nested more than 64 deep");
  if (out.size() > kMaxTextBytes) return invalid_argument("tojson: the text passes " + std::to_string(kMaxTextBytes) + " bytes");
  const int indent = style.indent;
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  const std::string& item_sep = !style.item_separator.empty() ? style.item_separator : indent < 0 ? kCommaSpace : kComma;
  const std::string& key_sep = !style.key_separator.empty() ? style.key_separator : kColonSpace;
  switch (v.kind()) {
    case Value::Kind::kUndefined: return invalid_argument("tojson: an undefined value");
    case Value::Kind::kNone: out += "null"; return ok_status();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return ok_status();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return ok_status();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return ok_status();
    }
    case Value::Kind::kString: json_string(v.as_string(), out); return ok_status();
    case Value::Kind::kList: {
      const List& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return ok_status();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        NPURT_RETURN_IF_ERROR(json_into(items[i], style, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return ok_status();
    }
    case Value::Kind::kDict: {
      const Dict& d = v.as_dict();
      if (d.items.empty()) {
        out += "{}";
        return ok_status();
      }
      std::vector<const std::pair<std::string, Value>*> order;
      for (const auto& item : d.items) order.push_back(&item);
      if (style.sort_keys) {
        std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < order.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        json_string(order[i]->first, out);
        out += key_sep;
        NPURT_RETURN_IF_ERROR(json_into(order[i]->second, style, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return ok_status();
    }
  }
  return ok_status();
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return *s_;
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return float_repr(d_);
    case Kind::kString: return string_repr(*s_);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size() && out.size() <= kMaxTextBytes; ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size() && out.size() <= kMaxTextBytes; ++i) {
        out += (i ? ", " : "") + string_repr(dict_->items[i].first) + ": " + dict_->items[i].second.repr();
      }
      return out + (dict_->is_namespace ? "}>" : "}");
    }
  }
  return "";
}

StatusOr<std::string> Value::to_json(const JsonStyle& style) const {
  std::string out;
  NPURT_RETURN_IF_ERROR(json_into(*this, style, 0, out));
  return out;
}

size_t Value::size() const {
  if (kind_ == Kind::kString) return s_->size();
  if (kind_ == Kind::kList) return list_->size();
  return 0;
}

size_t Value::footprint() const {
  if (kind_ == Kind::kString) return s_->size();
  if (kind_ == Kind::kList) return list_->size() * sizeof(Value);
  if (kind_ == Kind::kDict) return dict_->items.size() * (sizeof(Value) + sizeof(std::string));
  return 0;
}

bool equal_within(const Value& a, const Value& b, uint64_t* budget) {
  using Kind = Value::Kind;
  if (*budget == 0) return false;
  --*budget;
  if (a.is_number() && b.is_number()) {
    if (a.is(Kind::kFloat) || b.is(Kind::kFloat)) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (&x == &y) return true;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!equal_within(x[i], y[i], budget)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (&x == &y) return true;
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (other == nullptr || !equal_within(v, *other, budget)) return false;
      }
      return true;
    }
    default: return false;
  }
}

StatusOr<bool> Value::equals(const Value& o) const {
  uint64_t budget = kMaxCompareItems;
  const bool equal = equal_within(*this, o, &budget);
  if (budget == 0) return invalid_argument("a comparison of more than " + std::to_string(kMaxCompareItems) + " items");
  return equal;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
  }
  return "?";
}

namespace {

bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace

size_t find_text(std::string_view text, std::string_view needle, size_t from) {
  if (from > text.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  const void* hit = memmem(text.data() + from, text.size() - from, needle.data(), needle.size());
  return hit == nullptr ? std::string_view::npos : static_cast<size_t>(static_cast<const char*>(hit) - text.data());
}

std::string_view strip_whitespace(std::string_view s, bool left, bool right) {
  size_t begin = 0, end = s.size();
  while (left && begin < end) {
    const auto [cp, n] = decode_at(s, begin);
    if (!python_space(cp)) break;
    begin += n;
  }
  while (right && end > begin) {
    size_t start = end - 1;  // back to the start of the last character
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    const auto [cp, n] = decode_at(s, start);
    if (start + n != end || !python_space(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

}  // namespace npurt::serve::tmpl
