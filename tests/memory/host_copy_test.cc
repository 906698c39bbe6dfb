// MemoryContext::drop_host_copy: the host gives its copy of bytes back to the system
// and the device keeps the only one, without losing or staling a byte.

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <vector>

#include "hal/sim_test_util.h"
#include "memory/memory_test_util.h"
#include "npurt/memory/memory_context.h"

namespace npurt::testing {
namespace {

const uint64_t kPage = PageWriteTracker::page_size();

// Whether each page of b's mirror is resident in the process's memory (mincore).
std::vector<bool> resident_pages(const Buffer& b) {
  const uint64_t pages = (b.size() + kPage - 1) / kPage;
  std::vector<unsigned char> v(pages);
  EXPECT_EQ(mincore(b.host_data(), pages * kPage, v.data()), 0);
  std::vector<bool> out(pages);
  for (uint64_t i = 0; i < pages; ++i) out[i] = (v[i] & 1) != 0;
  return out;
}

// Floats from the host's mirror through the raw pointer, no sync.
std::vector<float> raw_floats(const Buffer& b) {
  return floats_of({b.host_data(), b.size()});
}

TEST(DropHostCopy, TheDeviceKeepsTheOnlyCopyAndAReadFetchesItBack) {
  MemoryRig rig;
  const uint64_t n = 3 * kPage / 4 + 25;  // 3 pages and a part of a fourth
  Buffer x = rig.buffer(n * 4, "weights"), out = rig.buffer(n * 4, "out");
  const std::vector<float> data = random_floats(n, 11);
  write_floats(*rig.ctx, x.view(), data);  // host-newer: never sent yet
  EXPECT_EQ(resident_pages(x), std::vector<bool>(4, true));

  hal::Counters before = rig.counters();
  NPURT_ASSERT_OK(rig.ctx->drop_host_copy(x.view()));
  EXPECT_EQ((rig.counters() - before).h2d_bytes, n * 4) << "the host-newer bytes go to the device first";
  EXPECT_EQ(rig.ctx->stats().host_bytes_dropped, 4 * kPage);  // the last page is the buffer's alone
  EXPECT_EQ(resident_pages(x), std::vector<bool>(4, false));
  EXPECT_EQ(raw_floats(x), std::vector<float>(n, 0.f)) << "the host holds nothing now";
  EXPECT_EQ(rig.device_floats(x, x.view()), data);

  // The device reads its copy: nothing to send.
  before = rig.counters();
  NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {sub(x, 0, 3 * kPage), sub(out, 0, 3 * kPage)}));
  EXPECT_EQ((rig.counters() - before).h2d_bytes, 0u);
  // A read brings the bytes back, once.
  before = rig.counters();
  EXPECT_EQ(read_floats(*rig.ctx, x.view()), data);
  EXPECT_EQ((rig.counters() - before).d2h_bytes, n * 4);
  before = rig.counters();
  EXPECT_EQ(read_floats(*rig.ctx, x.view()), data);
  EXPECT_EQ((rig.counters() - before).d2h_bytes, 0u);
  const std::vector<float> copied = read_floats(*rig.ctx, out.view());
  ASSERT_EQ(copied.size(), n);
  EXPECT_EQ(std::vector<float>(copied.begin(), copied.begin() + 3 * kPage / 4),
            std::vector<float>(data.begin(), data.begin() + 3 * kPage / 4));
}

TEST(DropHostCopy, OnlyWholePagesInsideTheViewAreGivenBack) {
  MemoryRig rig;
  const uint64_t n = kPage;  // 4 pages
  Buffer x = rig.buffer(n * 4, "x");
  const std::vector<float> data = random_floats(n, 12);
  write_floats(*rig.ctx, x.view(), data);
  NPURT_ASSERT_OK(rig.ctx->to_device(x.view()));
  // Bytes [100, 2 pages + 100) hold page 1 whole and parts of pages 0 and 2.
  NPURT_ASSERT_OK(rig.ctx->drop_host_copy(sub(x, 100, 2 * kPage)));
  EXPECT_EQ(resident_pages(x), (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(rig.ctx->stats().host_bytes_dropped, kPage);
  const hal::Counters before = rig.counters();
  EXPECT_EQ(read_floats(*rig.ctx, x.view()), data);
  EXPECT_EQ((rig.counters() - before).d2h_bytes, kPage) << "the page given back, and nothing else";
  // A view inside one page gives nothing back and moves nothing.
  NPURT_ASSERT_OK(rig.ctx->drop_host_copy(sub(x, 8, 64)));
  EXPECT_EQ(rig.ctx->stats().host_bytes_dropped, kPage);
}

// A launch's upload of the bytes is still in flight when the host drops them, and it
// fails: the host must wait for it and send the bytes again, or the device keeps the
// garbage the failed copy left and the host has nothing left to repair it with. With
// the protection off (Hazard::kNoResendOfFailedUploads) the check below fails.
class DropAfterAFailedUpload : public ::testing::TestWithParam<bool> {};

TEST_P(DropAfterAFailedUpload, SendsTheBytesAgainFirst) {
  const bool resend = GetParam();
  MemoryRig rig(only_if(!resend, Hazard::kNoResendOfFailedUploads));
  const uint64_t n = kPage;
  Buffer x = rig.buffer(n * 4, "x"), out = rig.buffer(n * 4, "out"), out2 = rig.buffer(n * 4, "out2");
  const std::vector<float> data = random_floats(n, 13);
  write_floats(*rig.ctx, x.view(), data);
  NPURT_ASSERT_OK(rig.device->set_fault_plan(hal::FaultPlan{}.fail({.site = hal::FaultSite::kCopyToDevice})));
  {
    StreamGate gate(*rig.device, rig.stream);  // the launch's upload waits behind it
    NPURT_ASSERT_OK(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}));
  }
  const Status dropped = rig.ctx->drop_host_copy(x.view());
  EXPECT_TRUE(dropped.ok() || !resend) << dropped.to_string();
  NPURT_ASSERT_OK(rig.device->set_fault_plan({}));
  EXPECT_FALSE(rig.device->stream_synchronize(rig.stream).ok());  // the injected fault struck
  const Status launched = rig.launch(MemoryRig::kCopy, {x.view(), out2.view()}, rig.stream2);
  EXPECT_TRUE(launched.ok() || !resend) << launched.to_string();
  auto got = rig.ctx->read(out2.view());
  EXPECT_EQ(launched.ok() && got.ok() && floats_of(got->bytes()) == data, resend);
  auto kept = rig.ctx->read(x.view());
  EXPECT_EQ(kept.ok() && floats_of(kept->bytes()) == data, resend);
}

INSTANTIATE_TEST_SUITE_P(Protection, DropAfterAFailedUpload, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "resent" : "not_resent_WRONG"; });

// Tracked mode: the pages given back stay watched, so a raw write into them is
// caught; the device's newer bytes win (memory_context.h, "Tracked mode").
TEST(DropHostCopy, TrackedPagesGivenBackStillCatchRawWrites) {
  for (WriteTrackingMechanism m : tracking_mechanisms()) {
    SCOPED_TRACE(write_tracking_mechanism_name(m));
    MemoryRig rig;
    const uint64_t n = kPage / 2;  // 2 pages
    Buffer x = rig.buffer(n * 4, "x", /*tracked=*/true, m);
    const std::vector<float> data = random_floats(n, 14);
    write_floats(*rig.ctx, x.view(), data);
    NPURT_ASSERT_OK(rig.ctx->drop_host_copy(x.view()));
    EXPECT_EQ(resident_pages(x), (std::vector<bool>{false, false}));
    reinterpret_cast<float*>(x.host_data())[3] = 42.f;  // raw, into device-newer bytes
    NPURT_ASSERT_OK(rig.ctx->to_device(x.view()));
    EXPECT_EQ(rig.ctx->stats().tracked_conflict_pages, 1u) << "the write was caught";
    EXPECT_EQ(rig.device_floats(x, x.view()), data);
    EXPECT_EQ(read_floats(*rig.ctx, x.view()), data);
  }
}

TEST(DropHostCopy, BadViewsAreNamedAndChangeNothing) {
  MemoryRig rig;
  Buffer x = rig.buffer(kPage, "gone");
  const View v = x.view();
  NPURT_ASSERT_OK(x.free());
  const Status s = rig.ctx->drop_host_copy(v);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_TRUE(contains(s, "drop_host_copy")) << s.to_string();
  EXPECT_FALSE(rig.ctx->drop_host_copy(View()).ok());
  EXPECT_EQ(rig.ctx->stats().host_bytes_dropped, 0u);
}

}  // namespace
}  // namespace npurt::testing
