// libFuzzer entry point for the assembler.
//
// Any text must get a clean answer from assemble: an image or an error whose message
// names a line and column, never a crash, hang, out-of-bounds read or undefined
// behaviour. Whatever it accepts must survive the round trip the assembler exists
// for: its listing assembles again, to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "npurt/isa/assembler.h"
#include "npurt/isa/disasm.h"

namespace {

// Small, so an input that declares a huge tile is refused quickly rather than
// accepted with a large local-memory claim; the limit is not what is under test.
constexpr uint32_t kMaxLocalBytes = 1u << 20;

void check_round_trip(const npurt::isa::Image& image) {
  const std::string text = npurt::isa::disassemble(image);
  npurt::StatusOr<npurt::isa::Image> again = npurt::isa::assemble(text, kMaxLocalBytes);
  if (!again.ok()) std::abort();  // the listing of an accepted image must assemble
  const auto a = image.bytes(), b = again->bytes();
  if (a.size() != b.size() || !std::equal(a.begin(), a.end(), b.begin())) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  npurt::StatusOr<npurt::isa::Image> image = npurt::isa::assemble(text, kMaxLocalBytes);
  if (image.ok()) {
    check_round_trip(*image);
  } else if (image.status().message().rfind("line ", 0) != 0) {
    std::abort();  // every rejection names its place
  }
  return 0;
}
