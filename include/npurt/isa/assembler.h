// Assembler: the text disassemble() prints (disasm.h), back into an image.
//
// assemble(disassemble(image)) gives the image's bytes again, byte for byte, for
// every image KernelBuilder makes; so a listing can be saved, edited and turned back
// into a kernel. The text is the listing format, plus what a person writing one by
// hand needs:
//
//   # y = x * s, 16 x 64 bf16 per block       <- comments: '#' or ';' to end of line
//   kernel "scale": 3 args, 6 insns, local 4096 B, constants 0 B
//     arg0 x: in buffer bf16
//     arg1 y: out buffer bf16
//     arg2 s: in scalar f32
//     0000: li r0, 0
//     0001: special r1, arg_value arg2
//     0002: tdef t0, f32, 16 x 64, local 0
//     0003: tld t0, arg0[r0], bf16
//     0004: tsop.mul t0, t0, r1
//     0005: tst t0, arg1[r0], bf16
//
// Indentation and blank lines are ignored. Each instruction line starts with its
// index, which must count up from 0000; loop targets are such indices. The header's
// counts (arguments, instructions, constant bytes, the barrier mark) must agree with
// the lines that follow, and its local bytes must cover the kernel's static tiles:
// they are checked, not inferred, so a stale edit is caught. docs/isa.md, "Assembly",
// gives the grammar of every line.
//
// Errors are kInvalidArgument values whose message starts with the place,
// "line 7, column 12: expected a tile register t0..t15, got 'r3'". The image is then
// verified (verifier.h); a verifier error is reported with the line of the
// instruction or argument it names, and keeps the verifier's code
// (kResourceExhausted when the tiles need more local memory than max_local_bytes).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/image.h"

namespace npurt::isa {

// Assembles `text` into an image verified for a device with `max_local_bytes` of
// local memory per core (KernelBuilder::build's default).
StatusOr<Image> assemble(std::string_view text, uint32_t max_local_bytes = 1u << 20);

// The image's bytes, verified by every rule but the local-memory limit, which is a
// property of a device, not of the bytes (as disassemble_bytes does).
StatusOr<std::vector<uint8_t>> assemble_bytes(std::string_view text);

}  // namespace npurt::isa
