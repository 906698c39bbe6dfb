// Device-level costs of the simulated NPU, each next to its physical floor measured
// in the same process:
//   * launch overhead (enqueue only; submit + wait round trip) vs. a two-thread
//     atomic ping-pong, the cheapest possible cross-thread round trip here;
//   * DMA host->device and device->host bandwidth vs. plain memcpy of the same size;
//   * tile matrix multiply (TMMA executed by simulated cores) vs. the f32 FMA peak.
#include <benchmark/benchmark.h>

#include "samples.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "fma_peak.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/builder.h"

namespace {

using namespace npurt;

double pingpong_us();

struct Sim {
  std::shared_ptr<hal::Device> dev;
  hal::StreamId stream{};
  hal::DeviceAddr empty_kernel{};

  Sim() {
    pingpong_us();  // measure the floor before any simulator thread exists
    hal::SimOptions o;
    o.global_memory_bytes = 512ull << 20;
    dev = std::move(hal::create_sim_device(o)).value();
    stream = dev->create_stream().value();
    isa::KernelBuilder b("empty");
    b.exit();
    const isa::Image image = b.build().value();
    empty_kernel = dev->allocate(image.bytes().size()).value();
    if (!dev->upload_code(empty_kernel, image).ok()) std::abort();
  }
  ~Sim() { dev->destroy_stream(stream).ignore(); }
};

Sim& sim() {
  static Sim s;
  return s;
}

// Median of `reps` timings of fn(), in seconds.
template <typename F>
double median_seconds(int reps, F fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

// Round trip of a spinning two-thread ping-pong: the floor for any host thread
// handing work to another and being told it is done.
double pingpong_us() {
  static const double us = [] {
    std::atomic<uint64_t> ping{0}, pong{0};
    std::atomic<bool> stop{false};
    std::thread peer([&] {
      uint64_t seen = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        const uint64_t p = ping.load(std::memory_order_acquire);
        if (p != seen) {
          seen = p;
          pong.store(p, std::memory_order_release);
        }
      }
    });
    constexpr int kRounds = 20000;
    const double s = median_seconds(5, [&] {
      for (int i = 0; i < kRounds; ++i) {
        const uint64_t v = ping.load() + 1;
        ping.store(v, std::memory_order_release);
        while (pong.load(std::memory_order_acquire) != v) {
        }
      }
    });
    stop = true;
    peer.join();
    return s / kRounds * 1e6;
  }();
  return us;
}

using bench::sample_alternately;
using bench::Samples;

void BM_LaunchEnqueue(benchmark::State& state) {
  Sim& s = sim();
  const hal::LaunchParams p{s.empty_kernel, 1, {}};
  constexpr int kBatch = 64;
  Samples samples;
  for (auto _ : state) {
    samples.time([&] {
      for (int i = 0; i < kBatch; ++i) {
        if (!s.dev->launch(s.stream, p).ok()) state.SkipWithError("launch failed");
      }
    });
    state.PauseTiming();  // drain the queue; not part of the enqueue cost
    if (!s.dev->stream_synchronize(s.stream).ok()) state.SkipWithError("sync failed");
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.counters["median_enqueue_us"] = samples.median() / kBatch * 1e6;
  state.counters["target_us"] = 2.0;
}
BENCHMARK(BM_LaunchEnqueue);

void BM_LaunchRoundTrip(benchmark::State& state) {
  Sim& s = sim();
  const hal::LaunchParams p{s.empty_kernel, static_cast<uint32_t>(state.range(0)), {}};
  Samples samples;
  for (auto _ : state) {
    samples.time([&] {
      if (!s.dev->launch(s.stream, p).ok() || !s.dev->stream_synchronize(s.stream).ok()) {
        state.SkipWithError("launch failed");
      }
    });
  }
  const double us = samples.median() * 1e6;
  state.counters["median_roundtrip_us"] = us;
  state.counters["floor_pingpong_us"] = pingpong_us();
  state.counters["ratio_to_floor"] = us / pingpong_us();
  state.counters["target_us"] = 10.0;
}
BENCHMARK(BM_LaunchRoundTrip)->Arg(1)->Arg(8)->ArgName("grid");

// ---- DMA vs memcpy ----

// DMA and the memcpy peer are sampled alternately in the same loop so that both see
// the same machine (other processes, frequency, memory traffic).
void dma(benchmark::State& state, bool to_device) {
  Sim& s = sim();
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> host(bytes, 3), peer_src(bytes, 4), peer_dst(bytes, 5);
  const hal::DeviceAddr dev = s.dev->allocate(bytes).value();
  // Touch the device pages once so neither side pays first-touch faults in the loop.
  if (!s.dev->copy_to_device(s.stream, dev, host.data(), bytes).ok()) std::abort();
  s.dev->stream_synchronize(s.stream).ignore();
  auto transfer = [&] {
    Status st = to_device ? s.dev->copy_to_device(s.stream, dev, host.data(), bytes)
                          : s.dev->copy_to_host(s.stream, host.data(), dev, bytes);
    if (st.ok()) st = s.dev->stream_synchronize(s.stream);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  };
  auto [dma_samples, memcpy_samples] = sample_alternately(state, transfer, [&] {
    std::memcpy(peer_dst.data(), peer_src.data(), bytes);
    benchmark::DoNotOptimize(peer_dst.data());
  });
  s.dev->free(dev).ignore();
  const double gbps = bytes / dma_samples.median() / 1e9;
  const double peer = bytes / memcpy_samples.median() / 1e9;
  state.counters["median_dma_GBps"] = gbps;
  state.counters["median_memcpy_GBps"] = peer;
  state.counters["ratio_to_memcpy"] = gbps / peer;
}

void BM_DmaToDevice(benchmark::State& state) { dma(state, true); }
void BM_DmaToHost(benchmark::State& state) { dma(state, false); }
BENCHMARK(BM_DmaToDevice)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_DmaToHost)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->UseRealTime();

// ---- tile matrix multiply on the device vs. the FMA peak ----

// One kernel per block: C (64x64 f32) += A (64x64) * B (64x64) `count` times on
// tiles resident in local memory, so the loop measures TMMA itself.
hal::DeviceAddr tmma_kernel(hal::Device& dev, isa::DType in_type) {
  using namespace isa;
  constexpr int kN = 64;
  KernelBuilder b(in_type == DType::kF32 ? "tmma_f32" : "tmma_bf16");
  const uint8_t count = b.arg_scalar("count", DType::kI32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg n{0}, one{1}, off{2};
  const Tile a{0}, bt{1}, c{2}, af{3};
  const uint32_t esz = static_cast<uint32_t>(dtype_size(in_type));
  b.arg_value(n, count);
  b.li(one, 0x3c23d70a);  // 0.01f: keeps the accumulator finite
  b.tdef(af, DType::kF32, kN, kN, 0);
  b.tfill(af, one);
  b.tdef(a, in_type, kN, kN, kN * kN * 4);
  b.tcvt(a, af);
  b.tdef(bt, in_type, kN, kN, kN * kN * (4 + esz));
  b.tcvt(bt, af);
  b.tdef(c, DType::kF32, kN, kN, kN * kN * (4 + 2 * esz));
  b.tfill(c, one);
  b.loop_begin(n);
  b.tmma(c, a, bt, kAccumulate);
  b.loop_end();
  b.block_id(off);
  b.alui(AluOp::kMul, off, off, kN * kN * 4);
  b.tst(c, out, off, DType::kF32);
  const Image image = b.build().value();
  const hal::DeviceAddr addr = dev.allocate(image.bytes().size()).value();
  if (!dev.upload_code(addr, image).ok()) std::abort();
  return addr;
}

void BM_TileMatmulOnDevice(benchmark::State& state) {
  const auto in_type = static_cast<isa::DType>(state.range(0));
  const uint32_t grid = static_cast<uint32_t>(state.range(1));
  hal::SimOptions o;
  o.global_memory_bytes = 64ull << 20;
  auto dev = std::move(hal::create_sim_device(o)).value();
  const hal::DeviceAddr code = tmma_kernel(*dev, in_type);
  const hal::StreamId stream = dev->create_stream().value();  // after the upload: no stale lines
  const hal::DeviceAddr out = dev->allocate(grid * 64 * 64 * 4).value();
  constexpr int64_t kCount = 200;
  const hal::LaunchParams p{code, grid, {hal::KernelArg::scalar_i64(kCount), hal::KernelArg::buffer(out, grid * 64 * 64 * 4)}};
  Samples samples;
  for (auto _ : state) {
    samples.time([&] {
      if (!dev->launch(stream, p).ok() || !dev->stream_synchronize(stream).ok()) state.SkipWithError("launch failed");
    });
  }
  dev->destroy_stream(stream).ignore();
  const double flops = 2.0 * 64 * 64 * 64 * kCount * grid;
  const double gflops = flops / samples.median() / 1e9;
  // The simulator runs cores on min(grid, host threads) host threads.
  const double threads = std::min<double>(grid, std::max(1u, std::thread::hardware_concurrency()));
  state.counters["median_GFLOPs"] = gflops;
  state.counters["fma_peak_GFLOPs"] = bench::fma_peak_gflops() * threads;
  state.counters["ratio_to_peak"] = gflops / (bench::fma_peak_gflops() * threads);
}
BENCHMARK(BM_TileMatmulOnDevice)
    ->ArgNames({"dtype", "grid"})
    ->Args({static_cast<int64_t>(isa::DType::kF32), 1})
    ->Args({static_cast<int64_t>(isa::DType::kBF16), 1})
    ->Args({static_cast<int64_t>(isa::DType::kF32), 2})
    ->UseRealTime();

}  // namespace

