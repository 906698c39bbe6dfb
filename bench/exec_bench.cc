// Worker costs on the simulated NPU, each next to its peer measured in the same
// process, interleaved iteration by iteration so drift affects both alike:
//   * run latency (submit -> wait, small kernel) with publication-aware stream reuse
//     vs. a fresh stream per run (the always-safe policy reuse replaces);
//   * throughput of back-to-back runs at pipeline depth 1 vs. depth 2, for a kernel
//     whose input upload takes about as long as its execution: depth 2 uploads run
//     N+1's input while run N computes.
// Medians come from per-iteration wall times (Google Benchmark reports means).
// The pipeline benchmark also measures its host floor: how much two plain host
// threads (a memcpy of the run's input and a compute loop of the same length)
// overlap on this machine. The simulator's DMA and cores are host threads, so depth 2
// cannot beat what the host itself allows.
#include <benchmark/benchmark.h>

#include "must.h"
#include "samples.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "npurt/exec/code_registry.h"
#include "npurt/runtime/runtime.h"
#include "npurt/exec/worker.h"
#include "npurt/runtime/runtime.h"
#include "isa/elementwise_kernel.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/builder.h"

namespace {

using namespace npurt;
using hal::KernelArg;

using npurt::bench::must;
using npurt::bench::sample_alternately;
using npurt::bench::Samples;

// out = x + y over `tiles_per_block` tiles of 1024 f32 per block, `reps` times over.
isa::Image stream_add_kernel() {
  using namespace isa;
  constexpr int kTile = 1024;
  KernelBuilder b("stream_add");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t y = b.arg_buffer("y", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const uint8_t tiles = b.arg_scalar("tiles_per_block", DType::kI32);
  const uint8_t reps = b.arg_scalar("reps", DType::kI32);
  const Reg n{0}, r{1}, bid{2}, base{3}, off{4}, n_inner{5};
  const Tile tx{0}, ty{1};
  b.arg_value(n, tiles);
  b.arg_value(r, reps);
  b.block_id(bid);
  b.alu(AluOp::kMul, base, bid, n);
  b.alui(AluOp::kMul, base, base, kTile * 4);
  b.tdef(tx, DType::kF32, 1, kTile, 0);
  b.tdef(ty, DType::kF32, 1, kTile, kTile * 4);
  b.loop_begin(r);
  b.mov(off, base);
  b.mov(n_inner, n);
  b.loop_begin(n_inner);
  b.tld(tx, x, off, DType::kF32);
  b.tld(ty, y, off, DType::kF32);
  b.tbin(BinOp::kAdd, tx, tx, ty);
  b.tst(tx, out, off, DType::kF32);
  b.alui(AluOp::kAdd, off, off, kTile * 4);
  b.loop_end();
  b.loop_end();
  return must(b.build());
}

isa::Image small_add_kernel() {
  return must(isa::elementwise_builder("small_add", isa::BinOp::kAdd, 64).build());
}

// ---- latency: reuse vs. a fresh stream per run ----

void BM_RunLatencyReuseVsStreamPerRun(benchmark::State& state) {
  auto runtime = must(Runtime::create("sim"));
  const std::shared_ptr<hal::Device>& dev = runtime->shared_device();
  exec::WorkerOptions reuse_opts, fresh_opts;
  fresh_opts.stream_per_run = true;
  auto reuse = must(runtime->make_worker(reuse_opts));
  auto fresh = must(runtime->make_worker(fresh_opts));
  const exec::CodeHandle code = must(runtime->registry().register_image(small_add_kernel()));

  constexpr uint64_t kN = 64 * 8, kBytes = kN * 4;
  std::vector<float> hx(kN, 1.f), result(kN);
  const hal::DeviceAddr x = must(dev->allocate(kBytes)), out = must(dev->allocate(kBytes));
  {
    const hal::StreamId s = must(dev->create_stream());
    must(dev->copy_to_device(s, x, hx.data(), kBytes));
    must(dev->stream_synchronize(s));
    must(dev->destroy_stream(s));
  }
  auto run_once = [&](exec::Worker& w) {
    must(w.submit(
              [&](exec::RunContext& ctx) -> Status {
                NPURT_RETURN_IF_ERROR(ctx.launch(code, 8,
                                                 {KernelArg::buffer(x, kBytes), KernelArg::buffer(x, kBytes),
                                                  KernelArg::buffer(out, kBytes)}));
                return ctx.copy_to_host(result.data(), out, kBytes);
              },
              {code})
             .wait());
  };
  for (int i = 0; i < 20; ++i) {  // warm up both: first streams, caches
    run_once(*reuse);
    run_once(*fresh);
  }
  auto [reuse_t, fresh_t] =
      sample_alternately(state, [&] { run_once(*reuse); }, [&] { run_once(*fresh); });
  const double reuse_us = reuse_t.median() * 1e6, fresh_us = fresh_t.median() * 1e6;
  state.counters["median_reuse_us"] = reuse_us;
  state.counters["median_stream_per_run_us"] = fresh_us;
  state.counters["ratio_stream_per_run_to_reuse"] = fresh_us / reuse_us;
  const exec::WorkerStats rs = reuse->stats();
  state.counters["reuse_streams_created"] = static_cast<double>(rs.streams.streams_created);
  state.counters["stream_per_run_streams_created"] =
      static_cast<double>(fresh->stats().streams.streams_created);
}
BENCHMARK(BM_RunLatencyReuseVsStreamPerRun)->Iterations(2000)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- throughput: depth 1 vs. depth 2 ----

struct PipelineRig {
  static constexpr uint64_t kTileBytes = 1024 * 4;
  static constexpr uint32_t kGrid = 8;
  static constexpr uint32_t kTilesPerBlock = 32;  // 8 x 32 x 4 KiB = 1 MiB per input
  static constexpr uint64_t kInputBytes = kGrid * kTilesPerBlock * kTileBytes;
  static constexpr uint64_t kReadbackBytes = 4096;

  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<hal::Device> dev;
  exec::CodeHandle code;
  std::vector<float> host_x, host_y;
  struct SlotBufs {
    hal::DeviceAddr x{}, y{}, out{};
    std::vector<float> result;
  };
  std::vector<SlotBufs> slots;
  int64_t reps = 1;
  double upload_us = 0, kernel_us = 0;

  PipelineRig() {
    hal::SimOptions o;
    o.global_memory_bytes = 256ull << 20;
    // One host thread runs a launch's cores, another a copy stream: the simulator's
    // "compute engine" and "DMA engine" each get a CPU even on a 2-CPU machine.
    o.host_threads = 1;
    runtime = must(Runtime::create(must(hal::create_sim_device(o))));
    dev = runtime->shared_device();
    code = must(runtime->registry().register_image(stream_add_kernel()));
    host_x.assign(kInputBytes / 4, 0.5f);
    host_y.assign(kInputBytes / 4, 0.25f);
    for (int i = 0; i < 2; ++i) {
      slots.push_back({must(dev->allocate(kInputBytes)), must(dev->allocate(kInputBytes)),
                       must(dev->allocate(kInputBytes)), std::vector<float>(kReadbackBytes / 4)});
    }
    calibrate();
  }

  // Both inputs of a run, host -> device.
  Status upload(hal::StreamId s, const SlotBufs& b) const {
    NPURT_RETURN_IF_ERROR(dev->copy_to_device(s, b.x, host_x.data(), kInputBytes));
    return dev->copy_to_device(s, b.y, host_y.data(), kInputBytes);
  }

  // Picks `reps` so the kernel takes about as long as uploading its inputs (it
  // never gets shorter than one pass).
  void calibrate() {
    const hal::StreamId s = must(dev->create_stream());
    auto time_us = [&](auto fn) {
      Samples t;
      for (int i = 0; i < 15; ++i) t.time(fn);
      return t.median() * 1e6;
    };
    upload_us = time_us([&] {
      must(upload(s, slots[0]));
      must(dev->stream_synchronize(s));
    });
    auto kernel_once = [&] {
      must(dev->launch(s, launch_params(slots[0])));
      must(dev->stream_synchronize(s));
    };
    reps = 1;
    const double one = time_us(kernel_once);
    reps = std::max<int64_t>(1, std::llround(upload_us / std::max(one, 1e-3)));
    kernel_us = time_us(kernel_once);
    must(dev->destroy_stream(s));
  }

  hal::LaunchParams launch_params(const SlotBufs& b) const {
    return {code.address(), kGrid,
            {KernelArg::buffer(b.x, kInputBytes), KernelArg::buffer(b.y, kInputBytes),
             KernelArg::buffer(b.out, kInputBytes), KernelArg::scalar_i64(kTilesPerBlock),
             KernelArg::scalar_i64(reps)}};
  }

  exec::RunHandle submit(exec::Worker& w) {
    return w.submit(
        [this](exec::RunContext& ctx) -> Status {
          SlotBufs& b = slots[ctx.slot()];
          NPURT_RETURN_IF_ERROR(ctx.copy_to_device(b.x, host_x.data(), kInputBytes));
          NPURT_RETURN_IF_ERROR(ctx.copy_to_device(b.y, host_y.data(), kInputBytes));
          const hal::LaunchParams p = launch_params(b);
          NPURT_RETURN_IF_ERROR(ctx.launch(code, p.grid, p.args));
          return ctx.copy_to_host(b.result.data(), b.out, kReadbackBytes);
        },
        {code});
  }
};

// Serial time / parallel time of a memcpy of `bytes` and a compute loop that takes
// as long: 2 on a host with two idle cores, 1 when the threads cannot run at once.
double host_overlap_ratio(uint64_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes);
  auto copy = [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  };
  uint64_t iters = 1000;
  auto work = [&] {
    double acc = 0;
    for (uint64_t i = 0; i < iters; ++i) {
      acc = acc * 0.999 + static_cast<double>(i);
      benchmark::DoNotOptimize(acc);
    }
  };
  Samples c, w;
  for (int i = 0; i < 15; ++i) {
    c.time(copy);
    w.time(work);
  }
  iters = std::max<uint64_t>(1, static_cast<uint64_t>(iters * c.median() / std::max(w.median(), 1e-9)));
  Samples serial, parallel;
  for (int i = 0; i < 31; ++i) {
    serial.time([&] {
      copy();
      work();
    });
    parallel.time([&] {
      std::thread t(copy);
      work();
      t.join();
    });
  }
  return serial.median() / parallel.median();
}

void BM_PipelineDepth1VsDepth2(benchmark::State& state) {
  PipelineRig rig;
  exec::WorkerOptions d1, d2;
  d1.depth = 1;
  d2.depth = 2;
  auto w1 = must(rig.runtime->make_worker(d1));
  auto w2 = must(rig.runtime->make_worker(d2));
  constexpr int kBatch = 16;
  auto batch = [&](exec::Worker& w) {
    std::vector<exec::RunHandle> runs;
    for (int i = 0; i < kBatch; ++i) runs.push_back(rig.submit(w));
    for (auto& r : runs) must(r.wait());
  };
  batch(*w1);
  batch(*w2);
  auto [t1, t2] = sample_alternately(state, [&] { batch(*w1); }, [&] { batch(*w2); });
  const double run1_us = t1.median() / kBatch * 1e6, run2_us = t2.median() / kBatch * 1e6;
  state.counters["upload_us"] = rig.upload_us;
  state.counters["kernel_us"] = rig.kernel_us;
  state.counters["depth1_us_per_run"] = run1_us;
  state.counters["depth2_us_per_run"] = run2_us;
  state.counters["depth1_runs_per_s"] = 1e6 / run1_us;
  state.counters["depth2_runs_per_s"] = 1e6 / run2_us;
  state.counters["throughput_ratio_depth2_to_depth1"] = run1_us / run2_us;
  state.counters["ideal_ratio"] =
      (rig.upload_us + rig.kernel_us) / std::max(rig.upload_us, rig.kernel_us);
  state.counters["host_overlap_ratio"] = host_overlap_ratio(2 * PipelineRig::kInputBytes);
}
BENCHMARK(BM_PipelineDepth1VsDepth2)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
