// LaunchArg: one argument of MemoryContext::launch(), a view or a scalar.
//
// Arguments are matched, in order, against the image's argument signature
// (isa::ArgSpec): a buffer argument takes a view, a scalar argument a scalar of the
// same type (f32 for kF32, integer for kI32). The access mode (in/out/inout) comes
// from the image. A caller that knows which access it means can say so with
// input()/output()/inout(), and a launch whose image disagrees is refused, which
// catches an output bound to the wrong argument before it overwrites anything.
//
// A LaunchArg is a value: it holds a View (sharing the buffer's state) or the
// scalar's bits, and may be copied and used from any thread.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>

#include "npurt/isa/image.h"
#include "npurt/memory/buffer.h"

namespace npurt {

class LaunchArg {
 public:
  enum class Kind : uint8_t { kView, kScalarI64, kScalarF32 };

  // A view, any access the image declares. Implicit so `{x, y, out}` reads naturally.
  LaunchArg(View view) : kind_(Kind::kView), view_(std::move(view)) {}  // NOLINT
  static LaunchArg input(View view) { return LaunchArg(std::move(view), isa::Access::kIn); }
  static LaunchArg output(View view) { return LaunchArg(std::move(view), isa::Access::kOut); }
  static LaunchArg inout(View view) { return LaunchArg(std::move(view), isa::Access::kInOut); }
  // An inout argument whose bytes the kernel writes before it reads any of them (a
  // fused kernel's intermediate): planned as an output, so its old bytes are neither
  // uploaded nor required to be good (garbage a failed command left there is fine).
  static LaunchArg written_first(View view) {
    LaunchArg a(std::move(view), isa::Access::kInOut);
    a.written_first_ = true;
    return a;
  }
  static LaunchArg scalar_i64(int64_t value) {
    return LaunchArg(Kind::kScalarI64, static_cast<uint64_t>(value));
  }
  static LaunchArg scalar_f32(float value) {
    return LaunchArg(Kind::kScalarF32, std::bit_cast<uint32_t>(value));
  }

  Kind kind() const { return kind_; }
  const View& view() const { return view_; }
  // The access the caller expects, if it said.
  std::optional<isa::Access> expected_access() const { return expected_; }
  bool is_written_first() const { return written_first_; }
  // Raw scalar bits as hal::KernelArg carries them.
  uint64_t scalar_bits() const { return bits_; }

 private:
  LaunchArg(View view, isa::Access access)
      : kind_(Kind::kView), view_(std::move(view)), expected_(access) {}
  LaunchArg(Kind kind, uint64_t bits) : kind_(kind), bits_(bits) {}

  Kind kind_;
  View view_;
  std::optional<isa::Access> expected_;
  bool written_first_ = false;
  uint64_t bits_ = 0;
};

}  // namespace npurt
