// LineReader: reads the tokens of one line of assembly text, left to right, and
// words its errors with the line and column they are at.
//
// Spaces and tabs between tokens are skipped; '#' or ';' where a token is expected
// starts a comment that runs to the end of the line. Literal words match whole words
// only ("local" does not match "locals").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "npurt/base/status.h"

namespace npurt::isa {

// kInvalidArgument "line L, column C: message" (both 1-based).
Status error_at(int line, size_t column, std::string_view message);

class LineReader {
 public:
  // `text` is the line without its end-of-line characters; `first` is where reading
  // starts (a byte position in `text`).
  LineReader(std::string_view text, int line, size_t first = 0) : text_(text), pos_(first), line_(line) {}

  int line() const { return line_; }
  std::string_view text() const { return text_; }
  size_t pos() const { return pos_; }
  // The 1-based column of the next byte to read.
  size_t column() const { return pos_ + 1; }

  void skip_spaces();
  // True when only spaces and perhaps a comment are left.
  bool at_end();
  // Consumes `literal` (after spaces) if it comes next.
  bool accept(std::string_view literal);
  // Consumes `literal`, or fails naming what is there instead.
  Status expect(std::string_view literal);
  // Fails unless the line is over, naming the first thing left.
  Status expect_end();

  // A run of letters, digits, '_' and '.' (after spaces); empty when none is next.
  std::string_view word();
  // The token at the cursor as messages show it: 'r3', or "end of line".
  std::string shown();
  // An error at the cursor (after spaces) / at a column.
  Status error(std::string_view message);
  Status error_at_column(size_t column, std::string_view message) const;
  // "expected <what>, got <shown()>" at the cursor.
  Status expected(std::string_view what);

  // Operands.
  StatusOr<uint8_t> scalar_reg();  // r0..r31
  StatusOr<uint8_t> tile_reg();    // t0..t15
  StatusOr<uint8_t> arg_index();   // arg0..arg31
  // A decimal number in [0, max]; `what` names it in messages.
  StatusOr<uint64_t> unsigned_number(uint64_t max, std::string_view what);
  // A decimal int64, optionally negative.
  StatusOr<int64_t> signed_number();
  // Hex digits in [0, max] (no 0x prefix).
  StatusOr<uint64_t> hex_number(uint64_t max, std::string_view what);
  // The text between double quotes, with \xNN escapes decoded.
  StatusOr<std::string> quoted();
  // Decodes \xNN escapes in text_[begin, end); other bytes are taken as they are.
  StatusOr<std::string> unescape(size_t begin, size_t end) const;

 private:
  StatusOr<uint8_t> numbered(std::string_view prefix, unsigned count, std::string_view what);

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 0;
};

}  // namespace npurt::isa
