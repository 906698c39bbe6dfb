// The names of sub-operations in assembly text, shared by the disassembler (which
// prints them) and the assembler (which reads them back), so the two cannot drift.
// Index i of a table is the sub-op code i.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "npurt/isa/isa.h"

namespace npurt::isa::mnemonics {

inline constexpr std::array<std::string_view, 4> kSpecial = {"block_id", "block_count", "arg_value",
                                                             "arg_bytes"};
inline constexpr std::array<std::string_view, 11> kAlu = {"add", "sub", "mul", "div", "rem", "min",
                                                          "max", "shl", "shr", "and", "or"};
inline constexpr std::array<std::string_view, 6> kFalu = {"add", "sub", "mul", "div", "min", "max"};
inline constexpr std::array<std::string_view, 6> kBin = {"add", "sub", "mul", "div", "max", "min"};
inline constexpr std::array<std::string_view, 12> kUn = {"exp",   "rsqrt", "sqrt", "tanh", "gelu_tanh", "silu",
                                                         "recip", "neg",   "abs",  "sin",  "cos",       "log"};
inline constexpr std::array<std::string_view, 4> kRed = {"sum", "max", "sumsq", "argmax"};
static_assert(kSpecial.size() == static_cast<size_t>(Special::kEnd));
static_assert(kAlu.size() == static_cast<size_t>(AluOp::kEnd));
static_assert(kFalu.size() == static_cast<size_t>(FaluOp::kEnd));
static_assert(kBin.size() == static_cast<size_t>(BinOp::kEnd));
static_assert(kUn.size() == static_cast<size_t>(UnOp::kEnd));
static_assert(kRed.size() == static_cast<size_t>(RedOp::kEnd));

// The code of `word` in a table, or nothing.
inline std::optional<uint8_t> find(std::span<const std::string_view> names, std::string_view word) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == word) return static_cast<uint8_t>(i);
  }
  return std::nullopt;
}

// "a, b, c": a table's names for an error message.
inline std::string listed(std::span<const std::string_view> names) {
  std::string list;
  for (const std::string_view n : names) list += (list.empty() ? "" : ", ") + std::string(n);
  return list;
}

// Bytes per line of the constant section in a listing.
inline constexpr size_t kConstBytesPerLine = 16;

}  // namespace npurt::isa::mnemonics
