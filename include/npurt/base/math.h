// Small integer and numeric helpers used across the layers (header-only).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>

namespace npurt {

constexpr bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// ceil(a / b) for b > 0.
constexpr uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// The smallest multiple of `align` (> 0, any value) that is >= v.
constexpr uint64_t round_up(uint64_t v, uint64_t align) { return ceil_div(v, align) * align; }

// "0x" and lowercase hex digits, at least `min_digits` of them (zero-padded).
inline std::string hex(uint64_t v, int min_digits = 1) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string digits;
  do {
    digits.insert(digits.begin(), kDigits[v & 0xF]);
    v >>= 4;
  } while (v != 0);
  if (static_cast<int>(digits.size()) < min_digits) digits.insert(0, min_digits - digits.size(), '0');
  return "0x" + digits;
}

// ||got - want|| / ||want||, summed in double: how a device result is compared with its
// host reference. Not a number (NaN or inf) when want is all zeros.
template <typename Got, typename Want>
double rel_l2(const Got& got, const Want& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::size(want); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(num / den);
}

}  // namespace npurt
