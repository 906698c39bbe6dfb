// Disassembler: a stable, human-readable listing of an image.
//
// The text is deterministic (same bytes, same text) and is compared verbatim by
// round-trip tests, so changing it is a format change. Shape of the listing:
//
//   kernel "scale": 3 args, 6 insns, local 4096 B, constants 0 B
//     arg0 x: in buffer bf16
//     arg1 y: out buffer bf16
//     arg2 s: in scalar f32
//     0000: li r0, 0
//     0001: loop r1 -> 0004
//     0002:   tld t3, arg0[r4], stride r5, bf16
//     0003:   tst t3, arg1[r4], bf16
//     0004: endloop -> 0001
//     0005: exit
//
// The header line ends with ", barrier" when the image uses BARRIER. Loop bodies are
// indented two spaces per level. Names are printed with non-printable bytes escaped
// as \xNN. Operand syntax per instruction is documented in docs/isa.md.
//
// When the image has constants, the listing ends with the constant section, 16 bytes
// a line in hex, each line led by the offset of its first byte (hex, at least four
// digits):
//
//   kernel "table": 1 args, 3 insns, local 64 B, constants 20 B
//     ...
//     const 0000: 00 00 80 3f 00 00 00 40 00 00 40 40 00 00 80 40
//     const 0010: 00 00 a0 40
//
// The listing says everything an image holds; for an image laid out the way
// KernelBuilder lays them out (every image npurt makes), assemble() (assembler.h)
// turns it back into the same bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "npurt/base/status.h"
#include "npurt/isa/image.h"

namespace npurt::isa {

// Lists a verified image.
std::string disassemble(const Image& image);

// Verifies `bytes` and lists them; the verifier's error otherwise. The local-memory
// limit is device-specific and not a property of the bytes, so it is not applied
// here (every other rule is).
StatusOr<std::string> disassemble_bytes(std::span<const uint8_t> bytes);

}  // namespace npurt::isa
