// Launch plans (launch_plan.h): what a launch uploads, waits for, reads and writes,
// inspected before it runs. Planning is pure: it enqueues nothing and changes no
// state, and launch() does what the plan said.

#include <gtest/gtest.h>

#include <vector>

#include "memory/memory_test_util.h"

namespace npurt::testing {
namespace {

constexpr uint64_t kBytes = 4 * kTileBytes;
using Upload = LaunchPlan::Upload;
using Binding = LaunchPlan::Binding;
using isa::Access;

std::vector<Hazard> with(bool naive, bool ordered = true) {
  std::vector<Hazard> on = only_if(naive, Hazard::kNaiveCoherence);
  if (!ordered) on.push_back(Hazard::kUnorderedConflicts);
  return on;
}

LaunchPlan plan_of(MemoryRig& rig, MemoryRig::Which k, std::vector<LaunchArg> args,
                   hal::StreamId on = {}) {
  auto p = rig.plan(k, std::move(args), on);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return p.ok() ? *p : LaunchPlan{};
}

TEST(LaunchPlan, AViewWrittenByTheHostPlansExactlyItsBytes) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(kBytes / 4, 1));
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  write_floats(*rig.ctx, sub(x, kTileBytes, 2 * kTileBytes), ints(2 * kTile, 2));

  const LaunchPlan p = plan_of(rig, MemoryRig::kCopy, {x.view(), out.view()});
  EXPECT_EQ(p.uploads, (std::vector<Upload>{{"x", {kTileBytes, 3 * kTileBytes}}}));
  EXPECT_EQ(p.bindings, (std::vector<Binding>{{"x", {0, kBytes}, Access::kIn},
                                              {"out", {0, kBytes}, Access::kOut}}));
  EXPECT_EQ(p.waits, 0u);

  const hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, p.upload_bytes());
  EXPECT_TRUE(plan_of(rig, MemoryRig::kCopy, {x.view(), out.view()}).uploads.empty());
}

// Both views of an arena are written, one is synced: the other's bytes are still
// planned. The naive policy's shared dirty flag loses them, and its plan shows it.
std::vector<Upload> plan_after_a_sibling_sync(bool naive) {
  MemoryRig rig(with(naive));
  Buffer arena = rig.buffer(2 * kBytes, "arena");
  Buffer out = rig.buffer(kBytes, "out");
  const View a = sub(arena, 0, kBytes), b = sub(arena, kBytes, kBytes);
  write_floats(*rig.ctx, arena.view(), std::vector<float>(2 * kBytes / 4, 0.f));
  EXPECT_TRUE(rig.ctx->to_device(arena.view()).ok());
  write_floats(*rig.ctx, a, ints(kBytes / 4, 3));
  write_floats(*rig.ctx, b, ints(kBytes / 4, 4));
  EXPECT_TRUE(rig.ctx->to_device(b).ok());
  EXPECT_TRUE(plan_of(rig, MemoryRig::kCopy, {b, out.view()}).uploads.empty());
  return plan_of(rig, MemoryRig::kCopy, {a, out.view()}).uploads;
}

TEST(LaunchPlan, ASiblingViewsSyncDoesNotPlanTheOther) {
  EXPECT_EQ(plan_after_a_sibling_sync(/*naive=*/false),
            (std::vector<Upload>{{"arena", {0, kBytes}}}));
  EXPECT_TRUE(plan_after_a_sibling_sync(/*naive=*/true).empty())
      << "the naive policy should let B's sync swallow A's mark";
}

TEST(LaunchPlan, AByteBoundTwiceIsPlannedOnce) {
  MemoryRig rig;
  Buffer x = rig.buffer(2 * kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(2 * kBytes / 4, 5));
  const View lo = sub(x, 0, kBytes), hi = sub(x, kBytes / 2, kBytes);
  const LaunchPlan p = plan_of(rig, MemoryRig::kAdd, {lo, hi, out.view()});
  EXPECT_EQ(p.uploads, (std::vector<Upload>{{"x", {0, kBytes + kBytes / 2}}}));
  EXPECT_EQ(p.bindings, (std::vector<Binding>{{"x", {0, kBytes}, Access::kIn},
                                              {"x", {kBytes / 2, kBytes + kBytes / 2}, Access::kIn},
                                              {"out", {0, kBytes}, Access::kOut}}));
}

// A launch reading what a launch on another stream writes plans one wait, and
// enqueues it; on the same stream the stream orders them; without ordering (WRONG
// on purpose) there is none. The writer is held unfinished behind a gate: a writer
// known to be done needs no wait, and how fast it runs must not decide the test.
size_t planned_waits(bool ordered, bool other_stream) {
  MemoryRig rig(with(/*naive=*/false, ordered));
  Buffer src = rig.buffer(kBytes, "src");
  Buffer mid = rig.buffer(kBytes, "mid");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, src.view(), ints(kBytes / 4, 6));
  StreamGate gate(*rig.device, rig.stream);
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), mid.view()}, rig.stream).ok());
  const hal::StreamId on = other_stream ? rig.stream2 : rig.stream;
  const LaunchPlan p = plan_of(rig, MemoryRig::kCopy, {mid.view(), out.view()}, on);
  const uint64_t before = rig.ctx->stats().device_waits;
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {mid.view(), out.view()}, on).ok());
  EXPECT_EQ(rig.ctx->stats().device_waits - before, p.waits) << "the launch waits as planned";
  gate.open();
  if (ordered) {
    EXPECT_EQ(read_floats(*rig.ctx, out.view()), ints(kBytes / 4, 6));
  }
  EXPECT_TRUE(rig.ctx->synchronize().ok());
  return p.waits;
}

TEST(LaunchPlan, ALaunchAfterAWriterOfItsInputOnAnotherStreamPlansOneWait) {
  EXPECT_EQ(planned_waits(true, true), 1u);
  EXPECT_EQ(planned_waits(true, false), 0u);
  EXPECT_EQ(planned_waits(false, true), 0u);
}

TEST(LaunchPlan, PlanningTwiceGivesTheSamePlanAndChangesNothing) {
  for (bool naive : {false, true}) {
    SCOPED_TRACE(naive ? "naive coherence" : "exact coherence");
    MemoryRig rig(with(naive));
    Buffer src = rig.buffer(kBytes, "src");
    Buffer acc = rig.buffer(kBytes, "acc");
    Buffer x = rig.buffer(kBytes, "x");
    write_floats(*rig.ctx, src.view(), ints(kBytes / 4, 7));
    write_floats(*rig.ctx, x.view(), ints(kBytes / 4, 8));
    StreamGate gate(*rig.device, rig.stream);  // acc's writer stays unfinished
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), acc.view()}, rig.stream).ok());
    const MemoryStats stats = rig.ctx->stats();

    const LaunchPlan first =
        plan_of(rig, MemoryRig::kAccumulate, {acc.view(), x.view()}, rig.stream2);
    const LaunchPlan second =
        plan_of(rig, MemoryRig::kAccumulate, {acc.view(), x.view()}, rig.stream2);
    EXPECT_EQ(first, second);
    EXPECT_EQ(rig.ctx->stats(), stats);
    EXPECT_FALSE(first.uploads.empty());
    EXPECT_EQ(first.waits, 1u);  // acc's writer, on the other stream
    gate.open();
    const hal::Counters enqueued = rig.counters();
    EXPECT_EQ(enqueued.launches, 1u);
    EXPECT_EQ(enqueued.h2d_bytes, kBytes);  // src, for the first launch
  }
}

TEST(LaunchPlan, TrackedRawWritesArePlannedByPage) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = rig.buffer(4 * page, "t", /*tracked=*/true);
  Buffer out = rig.buffer(4 * page, "out");
  write_floats(*rig.ctx, t.view(), std::vector<float>(page, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  t.host_data()[page + 5] = 1;

  const LaunchPlan p = plan_of(rig, MemoryRig::kCopy, {t.view(), out.view()});
  EXPECT_EQ(p.uploads, (std::vector<Upload>{{"t", {page, 2 * page}}}));
  // The raw write is recorded once, when first seen; planning again changes nothing.
  const MemoryStats stats = rig.ctx->stats();
  EXPECT_EQ(stats.tracked_pages_collected, 1u);
  EXPECT_EQ(plan_of(rig, MemoryRig::kCopy, {t.view(), out.view()}), p);
  EXPECT_EQ(rig.ctx->stats(), stats);
}

TEST(LaunchPlan, BadBindingsAreTheErrorsLaunchReturnsAndEnqueueNothing) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  const Status planned = rig.plan(MemoryRig::kCopy, {x.view()}).status();
  const Status launched = rig.launch(MemoryRig::kCopy, {x.view()});
  EXPECT_EQ(planned.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(planned.to_string(), launched.to_string());
  EXPECT_EQ(rig.counters().launches, 0u);
}

}  // namespace
}  // namespace npurt::testing
