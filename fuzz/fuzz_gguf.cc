// libFuzzer entry point for the GGUF reader.
//
// Any byte string must get a clean answer from GgufFile::parse: a file or an error
// with a message, never a crash, hang, out-of-bounds read or undefined behaviour.
// Whatever it accepts must hand out views that lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "npurt/models/gguf.h"

namespace {

bool inside(std::span<const uint8_t> outer, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return n == 0 || (b >= outer.data() && n <= outer.size() &&
                    static_cast<size_t>(b - outer.data()) <= outer.size() - n);
}

void check_accepted(const npurt::models::GgufFile& f, std::span<const uint8_t> bytes) {
  for (const npurt::models::GgufTensor& t : f.tensors()) {
    // The parser promised these bounds; a view outside the input is a bug.
    if (t.data.size() != t.bytes || !inside(bytes, t.data.data(), t.data.size())) std::abort();
    if (t.offset % f.alignment() != 0) std::abort();
    if (f.tensor(t.name) != &t) std::abort();
  }
  for (std::string_view key : f.keys()) {
    if (!inside(bytes, key.data(), key.size()) || f.find(key) == nullptr) std::abort();
    // Exercise the getters on every key: each must answer, whatever the type.
    f.get_uint(key).status().ignore();
    f.get_float(key).status().ignore();
    f.get_string(key).status().ignore();
    f.get_string_array(key).status().ignore();
    f.get_float_array(key).status().ignore();
    f.get_int_array(key).status().ignore();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> bytes(data, size);
  npurt::StatusOr<npurt::models::GgufFile> f = npurt::models::GgufFile::parse(bytes);
  if (f.ok()) {
    check_accepted(*f, bytes);
  } else if (f.status().message().empty()) {
    std::abort();  // every rejection must say why
  }
  return 0;
}
