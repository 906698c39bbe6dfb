// How fast the Worker gets over a hung kernel, each figure next to its peer measured
// in the same process:
//   * timeout: from a hung run's deadline (its callable's return + run_timeout) to
//     its RunHandle reporting kDeadlineExceeded, next to a plain run's latency (the
//     least a run can take to be noticed and retired);
//   * reset: from Worker::reset() on a hung run to the next successful run's result,
//     next to a run on a fresh stream (the stream creation and priming a reset makes
//     every slot pay once).
// Medians come from per-iteration wall times.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "isa/elementwise_kernel.h"
#include "must.h"
#include "npurt/exec/worker.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/runtime/runtime.h"
#include "samples.h"

namespace {

using namespace npurt;
using namespace npurt::bench;
using hal::KernelArg;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::milliseconds(20);
constexpr uint64_t kN = 64 * 8, kBytes = kN * 4;

struct FaultRig {
  std::shared_ptr<Runtime> runtime = must(Runtime::create("sim", {.cores = 4}));
  hal::Device& dev = runtime->device();
  exec::CodeHandle code =
      must(runtime->registry().register_image(must(isa::elementwise_builder("add", isa::BinOp::kAdd, 64).build())));
  hal::DeviceAddr x = must(dev.allocate(kBytes)), out = must(dev.allocate(kBytes));
  std::vector<float> result = std::vector<float>(kN);

  exec::RunHandle submit(exec::Worker& w) {
    return w.submit(
        [this](exec::RunContext& ctx) -> Status {
          NPURT_RETURN_IF_ERROR(ctx.launch(
              code, 8, {KernelArg::buffer(x, kBytes), KernelArg::buffer(x, kBytes), KernelArg::buffer(out, kBytes)}));
          return ctx.copy_to_host(result.data(), out, kBytes);
        },
        {code});
  }
  void hang_next_launch() {
    must(dev.set_fault_plan(hal::FaultPlan{}.fail({.site = hal::FaultSite::kKernelHang, .nth = 1})));
  }
  void stop_faults() { must(dev.set_fault_plan({})); }
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void BM_HungRunDeadlineToError(benchmark::State& state) {
  FaultRig rig;
  auto worker = must(rig.runtime->make_worker({.depth = 1, .run_timeout = kTimeout}));
  must(rig.submit(*worker).wait());  // the slot's stream exists and is primed
  Samples late, plain;
  for (auto _ : state) {
    rig.hang_next_launch();
    exec::RunHandle hung = rig.submit(*worker);
    const Clock::time_point deadline = Clock::now() + kTimeout;  // submit() returns once staged
    const Status s = hung.wait();
    late.seconds.push_back(std::chrono::duration<double>(Clock::now() - deadline).count());
    if (s.code() != StatusCode::kDeadlineExceeded) state.SkipWithError(s.to_string().c_str());
    rig.stop_faults();
    must(rig.submit(*worker).wait());  // its slot takes a fresh stream: not timed
    plain.time([&] { must(rig.submit(*worker).wait()); });
  }
  report_ratio(state, "median_deadline_to_error_us", late.median() * 1e6, "median_plain_run_us",
               plain.median() * 1e6, "ratio_to_plain_run");
}
BENCHMARK(BM_HungRunDeadlineToError)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ResetToNextSuccessfulRun(benchmark::State& state) {
  FaultRig rig;
  auto worker = must(rig.runtime->make_worker({.depth = 1}));
  auto fresh = must(rig.runtime->make_worker({.depth = 1, .stream_per_run = true}));
  must(rig.submit(*worker).wait());
  must(rig.submit(*fresh).wait());
  Samples recovery, fresh_run;
  for (auto _ : state) {
    rig.hang_next_launch();
    exec::RunHandle hung = rig.submit(*worker);
    while (must(rig.dev.fault_stats()).injected[static_cast<size_t>(hal::FaultSite::kKernelHang)] == 0) {
      std::this_thread::yield();  // until the kernel is spinning
    }
    rig.stop_faults();
    const Clock::time_point t0 = Clock::now();
    must(worker->reset());
    must(rig.submit(*worker).wait());
    recovery.seconds.push_back(seconds_since(t0));
    if (hung.wait().code() != StatusCode::kAborted) state.SkipWithError("the hung run was not abandoned");
    fresh_run.time([&] { must(rig.submit(*fresh).wait()); });
  }
  report_ratio(state, "median_reset_to_next_result_us", recovery.median() * 1e6, "median_fresh_stream_run_us",
               fresh_run.median() * 1e6, "ratio_to_fresh_stream_run");
}
BENCHMARK(BM_ResetToNextSuccessfulRun)->Iterations(30)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
