// Sub-ops by name: what the disassembly prints after an opcode's dot ("alu.add",
// "tun.silu") and the assembler reads back, for callers outside the isa library (the
// Python builder). The tables are the disassembler's own, so every reader and writer
// of the names agrees.
#pragma once

#include <cstdint>
#include <string_view>

#include "npurt/base/status.h"

namespace npurt::isa {

enum class SubOpFamily : uint8_t { kSpecial, kAlu, kFalu, kBin, kUn, kRed };

// The code of `name` in `family`; kInvalidArgument listing the family's names.
StatusOr<uint8_t> parse_sub_op(SubOpFamily family, std::string_view name);

}  // namespace npurt::isa
