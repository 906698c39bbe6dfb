// Image verification: the gate every image passes before a device accepts it.
//
// Images are treated as hostile input. The verifier reads them only through a
// bounded reader, does all size arithmetic in 64 bits (so offset + size cannot wrap),
// and checks every header field, argument record and instruction operand. An image
// that passes can be executed by a core without any instruction ever naming a
// register, tile, argument, sub-op or loop target that does not exist; what remains
// for the core to check at run time are data-dependent values (GM offsets and
// strides, dynamic tile shapes, local offsets in registers).
//
// The rules, in the order they are checked (docs/isa.md has the full list):
//   1. header (read_image_layout in image.h): magic, version, reserved fields and
//      unknown flags zero, every section inside total_bytes, code 16-byte aligned,
//      non-empty, a multiple of 16; total_bytes equals the number of bytes given;
//   2. sections (header, args, strings, code, constants) do not overlap;
//   3. the kernel name and every argument name lie inside the strings section;
//   4. argument records: valid kind/access/dtype, reserved bytes zero, scalars are
//      kF32 or kI32 with access kIn;
//   5. every instruction: the context-free structure check below, then memory
//      operands against the argument signature, SPECIAL argument indices,
//      LOOP/ENDLOOP pairing and depth, static TDEF offsets (element-aligned) and
//      extents (inside local memory and header.local_bytes);
//   6. the kImageUsesBarrier header flag is set iff the code contains a BARRIER;
//   7. header.local_bytes <= max_local_bytes.
//
// Error codes: kInvalidArgument for a malformed image; kResourceExhausted when a
// well-formed image needs more local memory than `max_local_bytes`. Messages name
// the field or the instruction ("insn 12 (TLD): operand b: arg index 5 >= num_args 3").
//
// Everything here is a pure function of its inputs and thread-safe.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "npurt/base/status.h"
#include "npurt/isa/isa.h"

namespace npurt::isa {

static_assert(std::endian::native == std::endian::little,
              "images are little-endian and are read by copying bytes into structs");

// A bounded reader over untrusted bytes. Every read is checked against the span;
// a read that does not fit returns a zero value and records an error naming `what`.
// Only the first error is kept, so a parser can do a run of reads and check once.
// Does not own the bytes: they must outlive the reader.
class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  T read(uint64_t offset, std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    T value{};
    if (!in_bounds(offset, sizeof(T), what)) return value;
    std::memcpy(&value, bytes_.data() + offset, sizeof(T));
    return value;
  }

  // The bytes [offset, offset + size); empty (and an error) if they do not fit.
  std::span<const uint8_t> slice(uint64_t offset, uint64_t size, std::string_view what);

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

 private:
  bool in_bounds(uint64_t offset, uint64_t size, std::string_view what);

  std::span<const uint8_t> bytes_;
  Status status_;
};

// One problem found by the context-free instruction check.
struct InsnIssue {
  const char* what = nullptr;  // static text, e.g. "operand b: scalar register out of range"
  int64_t value = 0;           // the offending byte / sub-op / flags / immediate
  bool ok() const { return what == nullptr; }
};

// Checks one instruction without any image context: known opcode; every operand
// byte is the kind the opcode expects (scalar register < 32, kNoReg only where isa.h
// allows an optional register, tile < 16, argument index < kMaxArgs or kConstArg
// for loads) and unused operand bytes, sub-op, flags and immediate are zero; sub-op
// and flags valid for the opcode; LOOP/ENDLOOP targets < num_insns. Arguments
// against the real signature, loop pairing and local memory need the image and are
// checked by verify_image only.
InsnIssue check_insn_structure(const Insn& insn, uint32_t num_insns);

// The same check for a core that decodes bytes it cannot trust (a stale instruction
// cache line may hold another image's code): nullptr if the instruction is
// structurally valid, else a static string describing the first problem.
const char* insn_structure_error(const Insn& insn, uint32_t num_insns);

// The scalar registers one instruction reads and writes, as masks (bit r: register r),
// from the same operand rules as check_insn_structure. A structurally invalid
// instruction uses none.
struct RegisterUse {
  uint32_t reads = 0;
  uint32_t writes = 0;
};
RegisterUse register_use(const Insn& insn);

// The registers that some run of `code` (structurally valid, loops balanced) may read
// before writing them: the ones whose value on entry matters. A write inside a loop
// counts for the rest of that body only, since the body may run zero times.
uint32_t registers_read_first(std::span<const Insn> code);

// Verifies a complete image (bytes.size() must equal header.total_bytes) for a
// device whose cores have `max_local_bytes` of local memory.
Status verify_image(std::span<const uint8_t> bytes, uint32_t max_local_bytes);

}  // namespace npurt::isa
