// Shared by the memory system tests: a simulated device with the kernels they
// launch already uploaded, a memory context, and helpers that read device memory
// directly (the ground truth, independent of any coherence policy).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "exec/exec_factory.h"
#include "hal/sim_test_util.h"
#include "npurt/base/hazards.h"
#include "npurt/memory/memory_context.h"

namespace npurt::testing {

inline constexpr uint32_t kTile = 64;  // floats per kernel block
inline constexpr uint64_t kTileBytes = kTile * sizeof(float);

// out = in, one tile per block; `scaled`: out = x * s (an f32 scalar after the
// buffers); `spin`: first spins `count` iterations (an integer scalar before the
// buffers), holding its stream busy before it reads its input and writes `out`.
inline StatusOr<isa::Image> tile_copy_kernel(const char* name, bool scaled, bool spin) {
  using namespace isa;
  KernelBuilder b(name);
  const uint8_t count = spin ? b.arg_scalar("count", DType::kI32) : 0;
  const uint8_t in = b.arg_buffer(scaled ? "x" : "in", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const uint8_t s = scaled ? b.arg_scalar("s", DType::kF32) : 0;
  const Reg off{0}, bid{1}, r{2};
  const Tile t{0};
  if (spin) {
    b.arg_value(r, count);
    b.loop_begin(r);
    b.nop();
    b.loop_end();
  }
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, kTileBytes);
  if (scaled) b.arg_value(r, s);
  b.tdef(t, DType::kF32, 1, kTile, 0);
  b.tld(t, in, off, DType::kF32);
  if (scaled) b.tsop(BinOp::kMul, t, t, r);
  b.tst(t, out, off, DType::kF32);
  b.exit();
  return b.build();
}

// acc += x (acc is inout).
inline StatusOr<isa::Image> accumulate_kernel() {
  using namespace isa;
  KernelBuilder b("accumulate");
  const uint8_t acc = b.arg_buffer("acc", Access::kInOut, DType::kF32);
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const Reg off{0}, bid{1};
  const Tile ta{0}, tx{1};
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, kTileBytes);
  b.tdef(ta, DType::kF32, 1, kTile, 0);
  b.tdef(tx, DType::kF32, 1, kTile, kTileBytes);
  b.tld(ta, acc, off, DType::kF32);
  b.tld(tx, x, off, DType::kF32);
  b.tbin(BinOp::kAdd, ta, ta, tx);
  b.tst(ta, acc, off, DType::kF32);
  b.exit();
  return b.build();
}

// The hazard `h` where `on`, else none: a MemoryRig's first argument.
inline std::vector<Hazard> only_if(bool on, Hazard h) { return on ? std::vector<Hazard>{h} : std::vector<Hazard>{}; }

struct Kernel {
  isa::Image image;
  exec::CodeHandle code;
};

// A device, its kernels, a context and two streams. Kernels are registered before
// any stream exists (a stream may be reused only if no code was uploaded since its
// creation); the context's internal stream never launches.
struct MemoryRig {
  std::shared_ptr<hal::Device> device;
  std::shared_ptr<exec::CodeRegistry> registry;
  std::vector<Kernel> kernels;
  std::unique_ptr<MemoryContext> ctx;
  hal::StreamId stream{};
  hal::StreamId stream2{};

  enum Which { kCopy, kAdd, kScale, kAccumulate, kSlowCopy };

  // `hazards` (base/hazards.h) are on while the context is made, which keeps them.
  explicit MemoryRig(const std::vector<Hazard>& hazards = {}, hal::SimOptions sim = {}) {
    device = make_sim(sim);
    registry = std::make_shared<exec::CodeRegistry>(ExecFactory::key(), device);
    for (auto built : {tile_copy_kernel("copy", false, false),
                       elementwise_kernel("add", isa::BinOp::kAdd, kTile),
                       tile_copy_kernel("scale", true, false), accumulate_kernel(),
                       tile_copy_kernel("slow_copy", false, true)}) {
      if (!built.ok()) {
        ADD_FAILURE() << built.status().to_string();
        return;
      }
      StatusOr<exec::CodeHandle> code = registry->register_image(*built);
      if (!code.ok()) {
        ADD_FAILURE() << code.status().to_string();
        return;
      }
      kernels.push_back(Kernel{std::move(built).value(), std::move(code).value()});
    }
    std::vector<std::unique_ptr<ScopedHazard>> on;
    for (Hazard h : hazards) on.push_back(std::make_unique<ScopedHazard>(h));
    auto c = MemoryContext::create(device);
    if (!c.ok()) {
      ADD_FAILURE() << c.status().to_string();
      return;
    }
    ctx = std::move(c).value();
    stream = *device->create_stream();
    stream2 = *device->create_stream();
  }
  ~MemoryRig() {
    ctx.reset();
    if (device) {
      device->destroy_stream(stream).ignore();
      device->destroy_stream(stream2).ignore();
    }
  }

  // Launches (plans) kernel `k` over `args` with one block per tile of the first view.
  Status launch(Which k, std::vector<LaunchArg> args, hal::StreamId on = {}) {
    return ctx->launch(on ? on : stream, kernels[k].code, grid(args), args);
  }
  StatusOr<LaunchPlan> plan(Which k, std::vector<LaunchArg> args, hal::StreamId on = {}) {
    return ctx->plan_launch(on ? on : stream, kernels[k].image, grid(args), args);
  }
  static uint32_t grid(std::span<const LaunchArg> args) {
    for (const LaunchArg& a : args) {
      if (a.kind() == LaunchArg::Kind::kView) {
        return static_cast<uint32_t>(std::max<uint64_t>(1, a.view().size() / kTileBytes));
      }
    }
    return 1;
  }

  Buffer buffer(uint64_t bytes, const char* name, bool tracked = false,
                WriteTrackingMechanism mechanism = WriteTrackingMechanism::kAuto) {
    BufferOptions o;
    o.name = name;
    o.track_writes = tracked;
    o.mechanism = mechanism;
    auto b = ctx->create_buffer(bytes, o);
    if (!b.ok()) {
      ADD_FAILURE() << b.status().to_string();
      return Buffer();
    }
    return std::move(b).value();
  }

  // What the device holds for `view` now, read straight from device memory after
  // all known work completed.
  std::vector<float> device_floats(const Buffer& b, const View& v) {
    EXPECT_TRUE(ctx->synchronize().ok());
    std::vector<float> out(v.size() / sizeof(float));
    Status s = device->copy_to_host(stream, out.data(), b.device_address() + v.offset(), v.size());
    if (s.ok()) s = device->stream_synchronize(stream);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return out;
  }

  // Device counters once every operation the context enqueued has executed.
  hal::Counters counters() {
    const Status s = ctx->synchronize();
    EXPECT_TRUE(s.ok()) << s.to_string();
    return device->counters();
  }
};

inline void put_floats(std::span<uint8_t> bytes, const std::vector<float>& values) {
  ASSERT_EQ(bytes.size(), values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
}

inline std::vector<float> floats_of(std::span<const uint8_t> bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// Guarded host helpers; failures fail the test.
inline void write_floats(MemoryContext& ctx, const View& v, const std::vector<float>& values,
                         bool overwrite = true) {
  auto g = overwrite ? ctx.overwrite(v) : ctx.write(v);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  put_floats(g->bytes(), values);
}

inline std::vector<float> read_floats(MemoryContext& ctx, const View& v) {
  auto g = ctx.read(v);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return {};
  return floats_of(g->bytes());
}

// Small integers as floats: sums are exact, so device and host agree bit for bit.
inline std::vector<float> ints(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>((static_cast<int>(i) * 7 + seed * 13) % 97 + 1);
  }
  return v;
}

// The write-tracking mechanisms this machine offers.
inline std::vector<WriteTrackingMechanism> tracking_mechanisms() {
  std::vector<WriteTrackingMechanism> out{WriteTrackingMechanism::kMprotect};
  if (PageWriteTracker::userfaultfd_support().ok()) {
    out.push_back(WriteTrackingMechanism::kUserfaultfd);
  }
  return out;
}

inline View sub(const Buffer& b, uint64_t offset, uint64_t length) {
  auto v = b.view(offset, length);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return v.ok() ? *v : View();
}

}  // namespace npurt::testing
