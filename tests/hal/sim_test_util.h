// Small helpers shared by the simulator tests: a device, resident images, and
// host<->device round trips that fail the test with the Status text on error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "npurt/base/math.h"
#include "isa/elementwise_kernel.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/builder.h"

namespace npurt::testing {

#define NPURT_ASSERT_OK(expr)                                      \
  do {                                                             \
    const ::npurt::Status npurt_s_ = (expr);                       \
    ASSERT_TRUE(npurt_s_.ok()) << #expr << ": " << npurt_s_.to_string(); \
  } while (0)

inline std::shared_ptr<hal::Device> make_sim(hal::SimOptions o = {}) {
  o.global_memory_bytes = std::min<uint64_t>(o.global_memory_bytes, 64ull << 20);
  auto d = hal::create_sim_device(o);
  if (!d.ok()) ADD_FAILURE() << d.status().to_string();
  return std::move(d).value();
}

// Allocates a block for `image`, uploads it and returns its address.
inline hal::DeviceAddr upload(hal::Device& dev, const isa::Image& image) {
  auto addr = dev.allocate(image.bytes().size());
  if (!addr.ok()) {
    ADD_FAILURE() << addr.status().to_string();
    return hal::DeviceAddr{};
  }
  Status s = dev.upload_code(*addr, image);
  if (!s.ok()) ADD_FAILURE() << s.to_string();
  return *addr;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A device buffer holding `data`, copied synchronously.
template <typename T>
hal::DeviceAddr put(hal::Device& dev, hal::StreamId s, const std::vector<T>& data) {
  auto addr = dev.allocate(data.size() * sizeof(T));
  if (!addr.ok()) {
    ADD_FAILURE() << addr.status().to_string();
    return hal::DeviceAddr{};
  }
  Status st = dev.copy_to_device(s, *addr, data.data(), data.size() * sizeof(T));
  if (st.ok()) st = dev.stream_synchronize(s);
  if (!st.ok()) ADD_FAILURE() << st.to_string();
  return *addr;
}

template <typename T>
std::vector<T> get(hal::Device& dev, hal::StreamId s, hal::DeviceAddr addr, size_t n) {
  std::vector<T> out(n);
  Status st = dev.copy_to_host(s, out.data(), addr, n * sizeof(T));
  if (st.ok()) st = dev.stream_synchronize(s);
  if (!st.ok()) ADD_FAILURE() << st.to_string();
  return out;
}

// A device buffer and its size, as a launch argument.
struct DeviceBuffer {
  hal::DeviceAddr addr{};
  size_t bytes = 0;
  hal::KernelArg arg() const { return hal::KernelArg::buffer(addr, bytes); }
};

// Builds, uploads and runs one kernel per call on a simulated device. Every image
// gets a block of its own that is never freed, so no address is recycled and the
// long-lived stream can never hold stale instruction lines of an earlier image.
class KernelRunner {
 public:
  explicit KernelRunner(hal::SimOptions options = {})
      : dev_(make_sim(options)), stream_(dev_->create_stream().value()) {}

  hal::Device& dev() { return *dev_; }

  template <typename T>
  DeviceBuffer input(const std::vector<T>& v) {
    return {put(*dev_, stream_, v), v.size() * sizeof(T)};
  }
  template <typename T>
  std::vector<T> read(const DeviceBuffer& b) {
    return get<T>(*dev_, stream_, b.addr, b.bytes / sizeof(T));
  }

  // The launch's outcome. A failed stream is replaced by a new one.
  Status run(const isa::KernelBuilder& b, std::vector<hal::KernelArg> args, uint32_t grid = 1) {
    StatusOr<isa::Image> image = b.build(dev_->info().local_memory_bytes);
    if (!image.ok()) return image.status();
    const hal::DeviceAddr code = upload(*dev_, *image);
    Status st = dev_->launch(stream_, {code, grid, std::move(args)});
    if (st.ok()) st = dev_->stream_synchronize(stream_);
    if (!st.ok()) {
      dev_->destroy_stream(stream_).ignore();
      stream_ = dev_->create_stream().value();
    }
    return st;
  }

 private:
  std::shared_ptr<hal::Device> dev_;
  hal::StreamId stream_;
};

inline bool contains(const Status& s, std::string_view text) {
  return s.message().find(text) != std::string::npos;
}

// out[i] = x[i] <op> y[i] over n f32 elements (n a multiple of `tile`), one tile per
// block: the kernel the scheduling and hazard tests use.
inline StatusOr<isa::Image> elementwise_kernel(std::string name, isa::BinOp op, uint32_t tile = 64) {
  isa::KernelBuilder b = isa::elementwise_builder(std::move(name), op, tile);
  b.exit();
  return b.build();
}

// A kernel that spins `count` loop iterations (scalar arg 0), then writes `value`
// (scalar arg 1, f32) to element 0 of buffer arg 2: used to hold a stream busy.
inline StatusOr<isa::Image> busy_kernel() {
  using namespace isa;
  KernelBuilder b("busy");
  const uint8_t count = b.arg_scalar("count", DType::kI32);
  const uint8_t value = b.arg_scalar("value", DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg n{0}, v{1}, zero{2};
  const Tile t{0};
  b.arg_value(n, count);
  b.arg_value(v, value);
  b.li(zero, 0);
  b.loop_begin(n);
  b.nop();
  b.loop_end();
  b.tdef(t, DType::kF32, 1, 1);
  b.tfill(t, v);
  b.tst(t, out, zero, DType::kF32);
  return b.build();
}

}  // namespace npurt::testing
