#include "isa/asm_line.h"

#include <limits>

#include "npurt/isa/isa.h"

namespace npurt::isa {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }
bool is_comment(char c) { return c == '#' || c == ';'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.';
}

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

enum class Decimal : uint8_t { kOk, kNotANumber, kTooLarge };

// Reads `w` as a decimal number in [0, max] into `value`.
Decimal parse_decimal(std::string_view w, uint64_t max, uint64_t& value) {
  if (w.empty()) return Decimal::kNotANumber;
  for (const char c : w) {
    if (!is_digit(c)) return Decimal::kNotANumber;
  }
  value = 0;
  for (const char c : w) {
    const auto d = static_cast<uint64_t>(c - '0');
    if (d > max || value > (max - d) / 10) return Decimal::kTooLarge;
    value = value * 10 + d;
  }
  return Decimal::kOk;
}

// Messages quote what they found; a long run (a corrupted line) is cut short.
constexpr size_t kShownChars = 32;

// Bytes a message can show as they are: printable ASCII.
std::string printable(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    out += (c >= 0x20 && c < 0x7F) ? ch : '?';
  }
  return out;
}

}  // namespace

Status error_at(int line, size_t column, std::string_view message) {
  return invalid_argument("line " + std::to_string(line) + ", column " + std::to_string(column) + ": " +
                          std::string(message));
}

void LineReader::skip_spaces() {
  while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
}

bool LineReader::at_end() {
  skip_spaces();
  return pos_ == text_.size() || is_comment(text_[pos_]);
}

bool LineReader::accept(std::string_view literal) {
  skip_spaces();
  if (text_.substr(pos_, literal.size()) != literal) return false;
  const size_t end = pos_ + literal.size();
  // A word matches whole words only.
  if (!literal.empty() && is_word(literal.back()) && end < text_.size() && is_word(text_[end])) return false;
  pos_ = end;
  return true;
}

Status LineReader::expect(std::string_view literal) {
  if (accept(literal)) return ok_status();
  return expected("'" + std::string(literal) + "'");
}

Status LineReader::expect_end() {
  if (at_end()) return ok_status();
  return error("unexpected " + shown() + " at the end of the line");
}

std::string_view LineReader::word() {
  skip_spaces();
  const size_t begin = pos_;
  while (pos_ < text_.size() && is_word(text_[pos_])) ++pos_;
  return text_.substr(begin, pos_ - begin);
}

std::string LineReader::shown() {
  if (at_end()) return "end of line";
  size_t end = pos_;
  const auto stops = [](char c) { return is_space(c) || c == ',' || c == '[' || c == ']' || c == ':'; };
  while (end < text_.size() && !stops(text_[end])) ++end;
  if (end == pos_) end = pos_ + 1;  // a lone separator
  const std::string_view token = text_.substr(pos_, end - pos_);
  if (token.size() > kShownChars) return "'" + printable(token.substr(0, kShownChars)) + "...'";
  return "'" + printable(token) + "'";
}

Status LineReader::error(std::string_view message) {
  skip_spaces();
  return error_at_column(column(), message);
}

Status LineReader::error_at_column(size_t column, std::string_view message) const {
  return error_at(line_, column, message);
}

Status LineReader::expected(std::string_view what) {
  return error("expected " + std::string(what) + ", got " + shown());
}

StatusOr<uint8_t> LineReader::numbered(std::string_view prefix, unsigned count, std::string_view what) {
  skip_spaces();
  const size_t start = pos_;
  const std::string_view w = word();
  uint64_t value = 0;
  if (w.substr(0, prefix.size()) == prefix &&
      parse_decimal(w.substr(prefix.size()), count - 1, value) == Decimal::kOk) {
    return static_cast<uint8_t>(value);
  }
  pos_ = start;
  const std::string first(prefix), last = std::string(prefix) + std::to_string(count - 1);
  return expected(std::string(what) + " " + first + "0.." + last);
}

StatusOr<uint8_t> LineReader::scalar_reg() { return numbered("r", kNumScalarRegs, "a scalar register"); }
StatusOr<uint8_t> LineReader::tile_reg() { return numbered("t", kNumTileRegs, "a tile register"); }
StatusOr<uint8_t> LineReader::arg_index() { return numbered("arg", kMaxArgs, "an argument"); }

StatusOr<uint64_t> LineReader::unsigned_number(uint64_t max, std::string_view what) {
  skip_spaces();
  const size_t start = pos_;
  const std::string_view w = word();
  uint64_t value = 0;
  pos_ = start;
  switch (parse_decimal(w, max, value)) {
    case Decimal::kOk: pos_ = start + w.size(); return value;
    case Decimal::kTooLarge:
      return error(std::string(what) + " " + shown() + " is out of range (0.." + std::to_string(max) + ")");
    case Decimal::kNotANumber: break;
  }
  return expected(what);
}

StatusOr<int64_t> LineReader::signed_number() {
  skip_spaces();
  const size_t start = pos_;
  const bool negative = pos_ < text_.size() && text_[pos_] == '-';
  if (negative) ++pos_;
  // The sign belongs to the number: "- 5" is not -5.
  if (negative && (pos_ == text_.size() || !is_digit(text_[pos_]))) {
    pos_ = start;
    return expected("an integer");
  }
  const std::string_view w = word();
  // The magnitude of INT64_MIN is one more than INT64_MAX.
  const uint64_t limit = uint64_t{std::numeric_limits<int64_t>::max()} + (negative ? 1 : 0);
  uint64_t magnitude = 0;
  const Decimal result = parse_decimal(w, limit, magnitude);
  if (result == Decimal::kOk) return static_cast<int64_t>(negative ? 0 - magnitude : magnitude);
  pos_ = start;
  if (result == Decimal::kTooLarge) return error("integer " + shown() + " does not fit in 64 bits");
  return expected("an integer");
}

StatusOr<uint64_t> LineReader::hex_number(uint64_t max, std::string_view what) {
  skip_spaces();
  const size_t start = pos_;
  const std::string_view w = word();
  uint64_t value = 0;
  bool ok = !w.empty();
  for (const char c : w) {
    const int d = hex_value(c);
    ok = ok && d >= 0 && static_cast<uint64_t>(d) <= max && value <= (max - static_cast<uint64_t>(d)) / 16;
    if (!ok) break;
    value = value * 16 + static_cast<uint64_t>(d);
  }
  pos_ = start;
  if (!ok) return expected(what);
  pos_ = start + w.size();
  return value;
}

StatusOr<std::string> LineReader::quoted() {
  NPURT_RETURN_IF_ERROR(expect("\""));
  const size_t begin = pos_;
  const size_t end = text_.find('"', begin);
  if (end == std::string_view::npos) return error_at_column(begin, "the name has no closing '\"'");
  NPURT_ASSIGN_OR_RETURN(std::string name, unescape(begin, end));
  pos_ = end + 1;
  return name;
}

StatusOr<std::string> LineReader::unescape(size_t begin, size_t end) const {
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    if (text_[i] != '\\') {
      out += text_[i];
      continue;
    }
    const int hi = i + 3 < end && text_[i + 1] == 'x' ? hex_value(text_[i + 2]) : -1;
    const int lo = hi >= 0 ? hex_value(text_[i + 3]) : -1;
    if (lo < 0) {
      return error_at_column(i + 1, "bad escape '" + printable(text_.substr(i, std::min<size_t>(4, end - i))) +
                                        "' (a name escapes a byte as \\xNN, two hex digits)");
    }
    out += static_cast<char>(hi * 16 + lo);
    i += 3;
  }
  return out;
}

}  // namespace npurt::isa
