// Small helpers shared by the simulator tests: a device, resident images, and
// host<->device round trips that fail the test with the Status text on error.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
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
// (scalar arg 1, f32) to element 0 of buffer arg 2: kernel work of a chosen length
// (behind a StreamGate, work that stays in flight).
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

// Holds a stream at a host function until open() (or destruction): work enqueued
// behind it stays unfinished for as long as a test needs, so a test of waits on
// unfinished work does not depend on how fast the simulator runs. Declare it after
// the rig, so it opens before the rig's streams go.
class StreamGate {
 public:
  StreamGate(hal::Device& device, hal::StreamId stream) : device_(device) {
    const Status s = device.enqueue_host_function(stream, [state = state_](const Status&) {
      std::unique_lock<std::mutex> lock(state->mu);
      state->cv.wait(lock, [&] { return state->open; });
      return ok_status();
    });
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate() {
    open();
    if (opener_.joinable()) opener_.join();
  }

  void open() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->open = true;
    }
    state_->cv.notify_all();
  }

  // Opens once a host thread blocks on unfinished device work (the device's
  // host_blocked_waits grows past its value now): for a test whose host side must
  // wait behind the gate.
  void open_when_the_host_blocks() {
    const uint64_t before = device_.counters().host_blocked_waits;
    open_once([before](const hal::Counters& c) { return c.host_blocked_waits > before; });
  }

  // Opens, from a thread of its own, once the device's counters satisfy `ready` (polled
  // every millisecond). Gives up after a minute and opens anyway, so a test whose
  // condition never comes fails instead of hanging.
  void open_once(std::function<bool(const hal::Counters&)> ready) {
    opener_ = std::thread([this, ready = std::move(ready)] {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
      while (!ready(device_.counters()) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      open();
    });
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
  };
  hal::Device& device_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::thread opener_;
};

}  // namespace npurt::testing
