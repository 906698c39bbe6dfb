// libFuzzer entry point for the image verifier.
//
// Any byte string must get a clean answer from verify_image: OK or an error, never a
// crash, hang, out-of-bounds read or undefined behaviour. Whatever it accepts must
// also parse as an Image and disassemble, since devices and tools rely on that.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "npurt/isa/disasm.h"
#include "npurt/isa/image.h"
#include "npurt/isa/verifier.h"

namespace {

constexpr uint32_t kMaxLocalBytes = 1u << 20;

void check_accepted(std::span<const uint8_t> bytes) {
  npurt::StatusOr<npurt::isa::Image> image =
      npurt::isa::Image::from_bytes(std::vector<uint8_t>(bytes.begin(), bytes.end()), kMaxLocalBytes);
  // The verifier just accepted these bytes; refusing them now is a bug.
  if (!image.ok()) std::abort();
  if (npurt::isa::disassemble(*image).empty()) std::abort();
  const uint32_t num_insns = static_cast<uint32_t>(image->code().size());
  for (const npurt::isa::Insn& insn : image->code()) {
    if (npurt::isa::insn_structure_error(insn, num_insns) != nullptr) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  const npurt::Status status = npurt::isa::verify_image(bytes, kMaxLocalBytes);
  if (status.ok()) {
    check_accepted(bytes);
  } else if (status.message().empty()) {
    std::abort();  // every rejection must say why
  }
  return 0;
}
