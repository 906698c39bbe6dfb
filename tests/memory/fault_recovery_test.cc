// What the memory context does with device faults (memory_context.h, "Faults"):
// nothing the host still holds is lost, and garbage a failed command left is never
// handed out. Faults come from the simulated NPU's injection (sim_device.h).
#include <gtest/gtest.h>

#include "memory/memory_test_util.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::testing {
namespace {

using hal::FaultPlan;
using hal::FaultSite;

constexpr uint64_t kN = kTile * 4;
constexpr uint64_t kBytes = kN * sizeof(float);

void inject(hal::Device& dev, FaultSite site, uint64_t nth = 1) {
  ASSERT_TRUE(dev.set_fault_plan(FaultPlan{}.fail({.site = site, .nth = nth})).ok());
}
void stop_injecting(hal::Device& dev) { ASSERT_TRUE(dev.set_fault_plan({}).ok()); }

TEST(FaultRecovery, AFailedUploadLeavesItsBytesHostNewerAndTheNextSyncSendsThem) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  const auto data = random_floats(kN, 1);
  write_floats(*rig.ctx, x.view(), data);
  inject(*rig.device, FaultSite::kCopyToDevice);
  Status s = rig.ctx->to_device(x.view());
  EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
  EXPECT_TRUE(contains(s, "buffer 'x'")) << s.to_string();
  stop_injecting(*rig.device);
  NPURT_ASSERT_OK(rig.ctx->to_device(x.view()));
  EXPECT_EQ(rig.device_floats(x, x.view()), data);
}

TEST(FaultRecovery, AFailedReadBackLeavesItsBytesDeviceNewerAndTheNextReadFetchesThem) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x"), out = rig.buffer(kBytes, "out");
  const auto data = random_floats(kN, 2);
  write_floats(*rig.ctx, x.view(), data);
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}));
  inject(*rig.device, FaultSite::kCopyToHost);
  auto failed = rig.ctx->read(out.view());
  EXPECT_TRUE(contains(failed.status(), "injected fault #")) << failed.status().to_string();
  stop_injecting(*rig.device);
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), data);
}

// The upload staged for a launch fails (garbage lands on the device) and the stream
// with it. The host's bytes were never touched, so the next launch must send them
// again. With the protection off (Hazard::kNoResendOfFailedUploads) the kernel copies the
// garbage: the check below fails, which is what shows it is a real check.
class LaunchUploads : public ::testing::TestWithParam<bool> {};

TEST_P(LaunchUploads, OfAFailedLaunchAreSentAgainByTheNextOne) {
  const bool resend = GetParam();
  MemoryRig rig(only_if(!resend, Hazard::kNoResendOfFailedUploads));
  Buffer x = rig.buffer(kBytes, "x"), out = rig.buffer(kBytes, "out"), out2 = rig.buffer(kBytes, "out2");
  const auto data = random_floats(kN, 3);
  write_floats(*rig.ctx, x.view(), data);
  inject(*rig.device, FaultSite::kCopyToDevice);
  {
    // Held until the launch is enqueued: a fault striking first would fail the launch
    // call itself (its completion event unrecordable) instead of its stream.
    StreamGate gate(*rig.device, rig.stream);
    NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}));
  }
  Status s = rig.device->stream_synchronize(rig.stream);
  EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
  stop_injecting(*rig.device);
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out2.view()}, rig.stream2));
  auto got = rig.ctx->read(out2.view());
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(floats_of(got->bytes()) == data, resend);
  EXPECT_EQ(read_floats(*rig.ctx, x.view()), data);  // the host's copy was never lost
}

INSTANTIATE_TEST_SUITE_P(Protection, LaunchUploads, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "resent" : "not_resent_WRONG"; });

TEST(FaultRecovery, OutputsOfAFailedKernelRaiseUntilRewritten) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x"), out = rig.buffer(kBytes, "out"), out2 = rig.buffer(kBytes, "out2");
  write_floats(*rig.ctx, x.view(), random_floats(kN, 4));
  inject(*rig.device, FaultSite::kKernel);
  {
    StreamGate gate(*rig.device, rig.stream);  // the fault strikes after the launch call
    NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}));
  }
  EXPECT_FALSE(rig.device->stream_synchronize(rig.stream).ok());  // faults are drawn as commands execute
  stop_injecting(*rig.device);
  auto r = rig.ctx->read(out.view());
  EXPECT_TRUE(contains(r.status(), "injected fault #")) << r.status().to_string();
  // Device work consuming them is refused too, on another (healthy) stream.
  Status consumed = rig.launch(MemoryRig::kCopy, {out.view(), out2.view()}, rig.stream2);
  EXPECT_TRUE(contains(consumed, "written by device work that failed")) << consumed.to_string();
  // A host overwrite makes them good again.
  const auto fresh = random_floats(kN, 5);
  write_floats(*rig.ctx, out.view(), fresh);
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), fresh);
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {out.view(), out2.view()}, rig.stream2));
  EXPECT_EQ(read_floats(*rig.ctx, out2.view()), fresh);
}

// The launch's completion event cannot be recorded: nothing could order later work
// after it, so the call stops its stream and the launch counts as failed; the error
// also names an earlier failure of that stream.
TEST(FaultRecovery, AnUnrecordableLaunchIsStoppedAndCountsAsFailed) {
  for (bool kernel_faults : {false, true}) {
    SCOPED_TRACE(kernel_faults ? "the kernel faults too" : "the kernel is fine");
    MemoryRig rig;
    Buffer x = rig.buffer(kBytes, "x"), out = rig.buffer(kBytes, "out"), out2 = rig.buffer(kBytes, "out2");
    const auto data = random_floats(kN, 6);
    write_floats(*rig.ctx, x.view(), data);
    FaultPlan p;
    p.fail({.site = FaultSite::kRecordEvent, .nth = 1});
    if (kernel_faults) p.fail({.site = FaultSite::kKernel, .nth = 1});
    NPURT_ASSERT_OK(rig.device->set_fault_plan(p));
    Status s = rig.launch(MemoryRig::kCopy, {x.view(), out.view()});
    EXPECT_TRUE(contains(s, "recording its completion")) << s.to_string();
    stop_injecting(*rig.device);
    EXPECT_FALSE(rig.ctx->read(out.view()).ok());
    EXPECT_FALSE(rig.device->stream_synchronize(rig.stream).ok());  // stopped: its owner replaces it
    // Its input was uploaded by the failed work: it is sent again and nothing is lost.
    NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out2.view()}, rig.stream2));
    EXPECT_EQ(read_floats(*rig.ctx, out2.view()), data);
  }
}

// Two launches on one stream; the first one's upload fails, so the second fails too.
// Learning the second's failure first (a read of its output) must not make the first
// count as a success: its uploads must be sent again.
TEST(FaultRecovery, LearningALaterFailureFirstStillMarksTheEarlierWorkFailed) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x"), y = rig.buffer(kBytes, "y"), z = rig.buffer(kBytes, "z");
  Buffer w = rig.buffer(kBytes, "w"), a = rig.buffer(kBytes, "a"), b = rig.buffer(kBytes, "b");
  Buffer c = rig.buffer(kBytes, "c");
  const auto hx = random_floats(kN, 8), hy = random_floats(kN, 9);
  write_floats(*rig.ctx, x.view(), hx);
  write_floats(*rig.ctx, y.view(), hy);
  write_floats(*rig.ctx, z.view(), hy);
  NPURT_ASSERT_OK(rig.ctx->to_device(z.view()));
  // A kernel on the other stream, held behind a gate, writes w; the first launch
  // reads it, so its stream waits there and both launches are enqueued before
  // anything fails.
  // The first launch's own stream is held too, so x's upload cannot fail before
  // both launch calls have returned.
  StreamGate gate(*rig.device, rig.stream2), gate1(*rig.device, rig.stream);
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kSlowCopy, {LaunchArg::scalar_i64(200000), z.view(), w.view()}, rig.stream2));
  inject(*rig.device, FaultSite::kCopyToDevice);  // x's upload
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kAdd, {x.view(), w.view(), a.view()}));
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {y.view(), b.view()}));
  gate.open();
  gate1.open();
  EXPECT_FALSE(rig.ctx->read(b.view()).ok());  // learns the second launch's failure
  stop_injecting(*rig.device);
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), c.view()}, rig.stream2));
  EXPECT_EQ(read_floats(*rig.ctx, c.view()), hx);
}

// After a device reset, the context's own transfers get a fresh stream: the reset
// costs no later call.
TEST(FaultRecovery, AfterAResetTransfersWorkAtOnce) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x"), out = rig.buffer(kBytes, "out");
  const auto data = random_floats(kN, 7);
  write_floats(*rig.ctx, x.view(), data);
  NPURT_ASSERT_OK(rig.ctx->to_device(x.view()));  // the transfer stream exists now
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}));
  NPURT_ASSERT_OK(rig.ctx->synchronize());
  NPURT_ASSERT_OK(rig.device->reset());
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), data);
}

}  // namespace
}  // namespace npurt::testing
