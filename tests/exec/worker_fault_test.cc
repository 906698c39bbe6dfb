// The Worker under device faults: a hung run times out and its slot recovers, a
// reset abandons every run in flight and later runs succeed, failed stream creates
// surface on the run, failed destroys are retried.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "hal/sim_test_util.h"
#include "npurt/exec/worker.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"

namespace npurt::exec {
namespace {

using hal::FaultPlan;
using hal::FaultSite;
using namespace npurt::testing;

constexpr size_t kN = 64 * 8;
constexpr uint64_t kBytes = kN * sizeof(float);

struct Rig {
  explicit Rig(WorkerOptions options) {
    worker = runtime->make_worker(options).value();
    x = buffer();
    y = buffer();
    write(x, hx);
    write(y, hy);
  }

  std::shared_ptr<Runtime> runtime = Runtime::create(make_sim({.num_cores = 4})).value();
  MemoryContext* memory = &runtime->memory();
  isa::Image image = elementwise_kernel("add", isa::BinOp::kAdd).value();
  CodeHandle code = runtime->registry().register_image(image).value();
  std::shared_ptr<Worker> worker;
  std::vector<float> hx = random_floats(kN, 1), hy = random_floats(kN, 2);
  Buffer x, y;

  Buffer buffer() { return memory->create_buffer(kBytes).value(); }
  void write(const Buffer& b, const std::vector<float>& v) {
    auto guard = memory->overwrite(b.view());
    ASSERT_TRUE(guard.ok());
    std::copy(v.begin(), v.end(), guard->as<float>().begin());
  }
  RunHandle add(const Buffer& out) {
    std::vector<LaunchArg> args = {x.view(), y.view(), out.view()};
    return worker->submit([this, args](RunContext& ctx) { return memory->launch(ctx.stream(), code, 8, args); },
                          {code});
  }
  // A run that must succeed, with the right sum.
  void expect_good_run() {
    Buffer out = buffer();
    Status s = add(out).wait();
    ASSERT_TRUE(s.ok()) << s.to_string();
    auto g = memory->read(out.view());
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(g->as<float>()[i], hx[i] + hy[i]);
  }
  void inject(FaultPlan p) { ASSERT_TRUE(runtime->device().set_fault_plan(std::move(p)).ok()); }
};

FaultPlan hang_next_launch() { return FaultPlan{}.fail({.site = FaultSite::kKernelHang, .nth = 1, .block = 2}); }

TEST(WorkerFaults, AHungRunTimesOutItsSlotRecoversAndItsOutputIsNeverHandedOut) {
  Rig rig({.depth = 1, .run_timeout = std::chrono::milliseconds(100)});
  rig.expect_good_run();  // the slot's stream exists and is primed: the next launch is the run's
  rig.inject(hang_next_launch());
  Buffer out = rig.buffer();
  Status s = rig.add(out).wait();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_TRUE(contains(s, "did not finish within 100 ms")) << s.to_string();
  EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
  EXPECT_TRUE(contains(s, "run 1 (slot 0)")) << s.to_string();
  EXPECT_FALSE(rig.memory->read(out.view()).ok());
  rig.inject({});
  rig.expect_good_run();
  const WorkerStats st = rig.worker->stats();
  EXPECT_EQ(st.runs_failed, 1u);
  EXPECT_GE(st.streams.unproven_retirements, 1u);
}

TEST(WorkerFaults, AResetAbandonsEveryRunInFlightAndLaterRunsSucceed) {
  Rig rig({.depth = 2});  // no timeout: only the reset ends the hung run
  rig.expect_good_run();
  rig.expect_good_run();
  Buffer done = rig.buffer();
  ASSERT_TRUE(rig.add(done).wait().ok());
  rig.inject(hang_next_launch());
  Buffer a = rig.buffer(), b = rig.buffer();
  RunHandle hung = rig.add(a);
  RunHandle other = rig.add(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(hung.done());
  ASSERT_TRUE(rig.worker->reset().ok());
  EXPECT_TRUE(hung.done() && other.done());
  Status s = hung.wait();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.to_string();
  EXPECT_TRUE(contains(s, "abandoned by a reset")) << s.to_string();
  EXPECT_EQ(other.wait().code(), StatusCode::kAborted);
  EXPECT_FALSE(rig.memory->read(a.view()).ok());
  rig.inject({});
  // Work finished before the reset is still there; later runs succeed on fresh streams.
  auto g = rig.memory->read(done.view());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->as<float>()[3], rig.hx[3] + rig.hy[3]);
  const uint64_t created = rig.worker->stats().streams.streams_created;
  rig.expect_good_run();
  rig.expect_good_run();
  EXPECT_EQ(rig.worker->stats().streams.streams_created, created + 2);
  EXPECT_EQ(rig.worker->stats().resets, 1u);
}

TEST(WorkerFaults, AFailedStreamCreateFailsThatRunOnly) {
  Rig rig({.depth = 1});
  rig.inject(FaultPlan{}.fail({.site = FaultSite::kCreateStream, .nth = 1}));
  Buffer out = rig.buffer();
  Status s = rig.add(out).wait();
  EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
  EXPECT_TRUE(contains(s, "create_stream")) << s.to_string();
  rig.expect_good_run();
}

// A destroy that fails leaves the stream with its slot; the slot's next run destroys
// it again before taking a fresh one, so nothing leaks.
TEST(WorkerFaults, AFailedStreamDestroyIsRetried) {
  Rig rig({.depth = 1, .stream_per_run = true});
  rig.expect_good_run();
  rig.inject(FaultPlan{}.fail({.site = FaultSite::kDestroyStream, .nth = 1}));
  rig.expect_good_run();  // its retirement's destroy fails; the run itself is fine
  EXPECT_TRUE(rig.worker->slot_state(0)->pending_destroy);
  rig.expect_good_run();  // retried here
  EXPECT_FALSE(rig.worker->slot_state(0)->pending_destroy);
  rig.worker->close();
  const StreamSlotStats st = rig.worker->stats().streams;
  EXPECT_EQ(st.destroy_failures, 1u);
  EXPECT_EQ(st.streams_created, st.streams_destroyed);
}

}  // namespace
}  // namespace npurt::exec
