// Regression tests for each production variant of the stale-data bug.
//
// Every scenario runs twice: under the exact policy, where it must produce the right
// result (and move exactly the stale bytes), and with its protection removed (the
// naive residency-flag policy, or tracking off), where it must produce the wrong
// result. The second run proves the test catches the bug it is named after.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "memory/memory_test_util.h"
#include "npurt/memory/memory_context.h"

namespace npurt::testing {
namespace {

// The exact coherence, or the naive flags (Hazard::kNaiveCoherence).
enum class Policy { kExact, kNaive };
constexpr Policy kExact = Policy::kExact;
constexpr Policy kNaive = Policy::kNaive;

std::vector<Hazard> with(Policy policy) { return only_if(policy == kNaive, Hazard::kNaiveCoherence); }

std::vector<float> add(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// The production runtime's "initial upload": the whole arena, zero-filled, is
// made resident on the device once.
void initial_upload(MemoryContext& ctx, const Buffer& arena) {
  write_floats(ctx, arena.view(), std::vector<float>(arena.size() / sizeof(float), 0.f));
  ASSERT_TRUE(ctx.to_device(arena.view()).ok());
}

// ---- 1. Inputs written through views of an input arena ---------------------------------
//
// Raw writes into two views of an arena that was uploaded once, declared per view;
// then a dispatch. The kernel must see both inputs, not the initial upload's zeros.

struct InputArenaResult {
  std::vector<float> got, want;
  uint64_t h2d_bytes = 0;
};

InputArenaResult inputs_through_views(Policy policy, bool tracked_raw_writes) {
  MemoryRig rig(with(policy));
  constexpr uint64_t kBytes = 4 * kTileBytes;
  Buffer arena = rig.buffer(3 * kBytes, "input arena", tracked_raw_writes);
  Buffer out = rig.buffer(kBytes, "out");
  const View x = sub(arena, 0, kBytes), y = sub(arena, kBytes, kBytes);
  initial_upload(*rig.ctx, arena);

  const std::vector<float> xs = ints(kBytes / 4, 1), ys = ints(kBytes / 4, 2);
  const hal::Counters before = rig.counters();
  std::memcpy(x.data(), xs.data(), kBytes);
  std::memcpy(y.data(), ys.data(), kBytes);
  if (!tracked_raw_writes) {
    EXPECT_TRUE(rig.ctx->mark_host_written(x).ok());
    EXPECT_TRUE(rig.ctx->mark_host_written(y).ok());
  }
  EXPECT_TRUE(rig.launch(MemoryRig::kAdd, {x, y, out.view()}).ok());
  InputArenaResult r;
  r.got = read_floats(*rig.ctx, out.view());
  r.want = add(xs, ys);
  r.h2d_bytes = (rig.counters() - before).h2d_bytes;
  return r;
}

TEST(StaleDataRegression, InputsWrittenThroughArenaViewsReachTheKernel) {
  const InputArenaResult exact = inputs_through_views(kExact, false);
  EXPECT_EQ(exact.got, exact.want);
  EXPECT_EQ(exact.h2d_bytes, 2 * 4 * kTileBytes);  // exactly the two views

  const InputArenaResult naive = inputs_through_views(kNaive, false);
  EXPECT_NE(naive.got, naive.want) << "the naive policy should lose one view's write";
}

TEST(StaleDataRegression, TrackedRawWritesThroughArenaViewsReachTheKernel) {
  const InputArenaResult exact = inputs_through_views(kExact, true);
  EXPECT_EQ(exact.got, exact.want);
  EXPECT_EQ(exact.h2d_bytes, 2 * 4 * kTileBytes);  // both views lie in page 0

  const InputArenaResult naive = inputs_through_views(kNaive, true);
  EXPECT_NE(naive.got, naive.want) << "the naive policy should run on the initial zeros";
  EXPECT_EQ(naive.got, std::vector<float>(naive.got.size(), 0.f));
}

// ---- 2. Sibling views -------------------------------------------------------------------
//
// Write view A, sync sibling view B: A's write must still reach the device.

struct SiblingResult {
  std::vector<float> kernel_saw, device_holds, want;
};

SiblingResult sibling_sync(Policy policy) {
  MemoryRig rig(with(policy));
  constexpr uint64_t kBytes = 2 * kTileBytes;
  Buffer arena = rig.buffer(2 * kBytes, "arena");
  Buffer out = rig.buffer(kBytes, "out");
  const View a = sub(arena, 0, kBytes), b = sub(arena, kBytes, kBytes);
  initial_upload(*rig.ctx, arena);

  SiblingResult r;
  r.want = ints(kBytes / 4, 3);
  write_floats(*rig.ctx, a, r.want, /*overwrite=*/false);
  EXPECT_TRUE(rig.ctx->to_device(b).ok());
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {a, out.view()}).ok());
  r.kernel_saw = read_floats(*rig.ctx, out.view());
  r.device_holds = rig.device_floats(arena, a);
  return r;
}

TEST(StaleDataRegression, SyncingASiblingKeepsTheOtherViewsWrite) {
  const SiblingResult exact = sibling_sync(kExact);
  EXPECT_EQ(exact.kernel_saw, exact.want);
  EXPECT_EQ(exact.device_holds, exact.want);

  const SiblingResult naive = sibling_sync(kNaive);
  EXPECT_NE(naive.kernel_saw, naive.want)
      << "the naive policy should let B's sync swallow A's mark";
}

// ---- 3. Looped dispatch with a host read of the output between calls ------------------------

int correct_loops(Policy policy, uint64_t* d2h_bytes) {
  MemoryRig rig(with(policy));
  constexpr uint64_t kBytes = 4 * kTileBytes;
  Buffer in = rig.buffer(kBytes, "in");
  Buffer out = rig.buffer(kBytes, "out");
  const hal::Counters before = rig.counters();
  int correct = 0;
  for (int call = 0; call < 8; ++call) {
    const std::vector<float> xs = ints(kBytes / 4, call);
    write_floats(*rig.ctx, in.view(), xs);
    const float s = static_cast<float>(call + 2);
    EXPECT_TRUE(
        rig.launch(MemoryRig::kScale, {in.view(), out.view(), LaunchArg::scalar_f32(s)}).ok());
    std::vector<float> want(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) want[i] = xs[i] * s;
    correct += read_floats(*rig.ctx, out.view()) == want ? 1 : 0;
  }
  *d2h_bytes = (rig.counters() - before).d2h_bytes;
  return correct;
}

TEST(StaleDataRegression, EveryLoopedCallReturnsItsOwnOutput) {
  uint64_t d2h = 0;
  EXPECT_EQ(correct_loops(kExact, &d2h), 8);
  EXPECT_EQ(d2h, 8 * 4 * kTileBytes);  // one read-back per call, nothing else

  EXPECT_EQ(correct_loops(kNaive, &d2h), 1)
      << "the naive policy should return call 0's output again";
}

// ---- 4. A view upload must not overwrite a sibling's newer device data -------------------

struct SiblingDeviceResult {
  std::vector<float> device_a, device_b, host_b, want_a, want_b;
  uint64_t h2d_bytes = 0;
};

SiblingDeviceResult upload_next_to_device_data(Policy policy) {
  MemoryRig rig(with(policy));
  constexpr uint64_t kBytes = 2 * kTileBytes;
  Buffer x = rig.buffer(2 * kBytes, "x");
  Buffer src = rig.buffer(kBytes, "src");
  const View a = sub(x, 0, kBytes), b = sub(x, kBytes, kBytes);

  SiblingDeviceResult r;
  r.want_b = ints(kBytes / 4, 5);
  r.want_a = ints(kBytes / 4, 6);
  write_floats(*rig.ctx, src.view(), r.want_b);
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), b}).ok());  // B: device-newer
  EXPECT_TRUE(rig.ctx->synchronize().ok());
  const hal::Counters before = rig.counters();
  write_floats(*rig.ctx, a, r.want_a);  // overwrite: no fetch
  EXPECT_TRUE(rig.ctx->to_device(a).ok());
  r.h2d_bytes = (rig.counters() - before).h2d_bytes;
  r.device_a = rig.device_floats(x, a);
  r.device_b = rig.device_floats(x, b);
  r.host_b = read_floats(*rig.ctx, b);
  return r;
}

TEST(StaleDataRegression, AViewUploadKeepsASiblingsNewerDeviceBytes) {
  const SiblingDeviceResult exact = upload_next_to_device_data(kExact);
  EXPECT_EQ(exact.device_a, exact.want_a);
  EXPECT_EQ(exact.device_b, exact.want_b);
  EXPECT_EQ(exact.host_b, exact.want_b);
  EXPECT_EQ(exact.h2d_bytes, 2 * kTileBytes);  // A only

  const SiblingDeviceResult naive = upload_next_to_device_data(kNaive);
  EXPECT_NE(naive.device_b, naive.want_b) << "the naive whole-buffer upload should clobber B";
}

// ---- 5. Weights written once into a resident arena ----------------------------------------
//
// The scratch arena (two weights and an intermediate) is made resident at "compile"
// time; the weights are loaded afterwards through raw pointers and declared. Ten
// dispatches of out = (x + w1) + w2 must all be right, the weights must be sent
// exactly once, and the intermediate never.

struct WeightsResult {
  int correct = 0;
  uint64_t first_dispatch_h2d = 0;
  uint64_t later_dispatches_h2d = 0;
};

WeightsResult weights_once(Policy policy) {
  MemoryRig rig(with(policy));
  constexpr uint64_t kBytes = 4 * kTileBytes;
  Buffer scratch = rig.buffer(3 * kBytes, "scratch");
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  const View w1 = sub(scratch, 0, kBytes), w2 = sub(scratch, kBytes, kBytes),
             acc = sub(scratch, 2 * kBytes, kBytes);
  initial_upload(*rig.ctx, scratch);

  const std::vector<float> w1s = ints(kBytes / 4, 7), w2s = ints(kBytes / 4, 8);
  std::memcpy(w1.data(), w1s.data(), kBytes);
  std::memcpy(w2.data(), w2s.data(), kBytes);
  EXPECT_TRUE(rig.ctx->mark_host_written(w1).ok());
  EXPECT_TRUE(rig.ctx->mark_host_written(w2).ok());

  WeightsResult r;
  for (int call = 0; call < 10; ++call) {
    const hal::Counters before = rig.counters();
    const std::vector<float> xs = ints(kBytes / 4, 20 + call);
    write_floats(*rig.ctx, x.view(), xs);
    EXPECT_TRUE(rig.launch(MemoryRig::kAdd, {x.view(), w1, acc}).ok());
    EXPECT_TRUE(rig.launch(MemoryRig::kAdd, {acc, w2, out.view()}).ok());
    r.correct += read_floats(*rig.ctx, out.view()) == add(add(xs, w1s), w2s) ? 1 : 0;
    const uint64_t h2d = (rig.counters() - before).h2d_bytes - kBytes;  // minus x
    (call == 0 ? r.first_dispatch_h2d : r.later_dispatches_h2d) += h2d;
  }
  return r;
}

TEST(StaleDataRegression, WeightsInAResidentArenaAreSentOnceAndNeverAgain) {
  const WeightsResult exact = weights_once(kExact);
  EXPECT_EQ(exact.correct, 10);
  EXPECT_EQ(exact.first_dispatch_h2d, 2 * 4 * kTileBytes);  // w1 and w2, once
  EXPECT_EQ(exact.later_dispatches_h2d, 0u);

  const WeightsResult naive = weights_once(kNaive);
  EXPECT_EQ(naive.correct, 0) << "the naive policy should never send w2";
}

// ---- 6. Tracked mode: raw writes by every means are caught ----------------------------------

struct TrackedResult {
  std::vector<float> got, want;
  uint64_t h2d_bytes = 0;
  uint64_t expected_h2d_bytes = 0;
};

TrackedResult raw_writes(bool tracking, WriteTrackingMechanism mechanism) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  constexpr size_t kPages = 16;
  const uint64_t bytes = kPages * page;
  Buffer t = rig.buffer(bytes, "tracked", tracking, mechanism);
  Buffer out = rig.buffer(bytes, "out");
  const size_t n = bytes / sizeof(float);
  std::vector<float> model(n, 0.f);
  write_floats(*rig.ctx, t.view(), model);
  EXPECT_TRUE(rig.ctx->to_device(t.view()).ok());

  float* raw = reinterpret_cast<float*>(t.host_data());
  std::set<size_t> pages;
  // memcpy into pages 1 and 2.
  const std::vector<float> block = ints(page / sizeof(float) * 2, 9);
  std::memcpy(raw + page / sizeof(float), block.data(), block.size() * sizeof(float));
  std::copy(block.begin(), block.end(),
            model.begin() + static_cast<ptrdiff_t>(page / sizeof(float)));
  pages.insert({1, 2});
  // numpy-style strided writes: every third float of some rows of a 2-D view
  // starting at page 5, rows of 300 floats (rows straddle pages).
  const size_t origin = 5 * page / sizeof(float);
  for (size_t r = 0; r < 8; r += 2) {
    for (size_t c = 0; c < 300; c += 3) {
      const size_t i = origin + r * 300 + c;
      raw[i] = static_cast<float>(r * 1000 + c);
      model[i] = raw[i];
      pages.insert(i * sizeof(float) / page);
    }
  }
  // Another thread writes three floats into page 12.
  const size_t other = 12 * page / sizeof(float) + 17;
  std::thread writer([&] {
    for (size_t k = 0; k < 3; ++k) raw[other + k] = 42.f + static_cast<float>(k);
  });
  writer.join();
  for (size_t k = 0; k < 3; ++k) model[other + k] = 42.f + static_cast<float>(k);
  pages.insert(12);

  const hal::Counters before = rig.counters();
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {t.view(), out.view()}).ok());
  TrackedResult r;
  r.got = read_floats(*rig.ctx, out.view());
  r.h2d_bytes = (rig.counters() - before).h2d_bytes;
  r.want = model;
  r.expected_h2d_bytes = pages.size() * page;
  return r;
}

// Each tracked-mode test runs under every mechanism the machine offers.
class TrackedMode : public ::testing::TestWithParam<WriteTrackingMechanism> {
 protected:
  Buffer tracked(MemoryRig& rig, uint64_t bytes, const char* name) {
    Buffer b = rig.buffer(bytes, name, true, GetParam());
    EXPECT_TRUE(b.tracked());
    return b;
  }
};

TEST_P(TrackedMode, CatchesMemcpyStridedAndOtherThreadWritesAndSendsOnlyThosePages) {
  const TrackedResult exact = raw_writes(true, GetParam());
  EXPECT_EQ(exact.got, exact.want);
  EXPECT_EQ(exact.h2d_bytes, exact.expected_h2d_bytes) << "exactly the written pages";
  EXPECT_LT(exact.h2d_bytes, 16 * PageWriteTracker::page_size());

  const TrackedResult untracked = raw_writes(false, GetParam());
  EXPECT_NE(untracked.got, untracked.want) << "without tracking the writes are lost";
  EXPECT_EQ(untracked.h2d_bytes, 0u);
}

// ---- Tracked mode: the runtime's own writes are not raw writes -----------------------------

TEST_P(TrackedMode, GuardWritesAndDownloadsLeaveNoSpuriousDirtyPages) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = tracked(rig, 4 * page, "tracked");
  Buffer src = rig.buffer(4 * page, "src");
  Buffer out = rig.buffer(4 * page, "out");
  write_floats(*rig.ctx, t.view(), std::vector<float>(page, 1.f));
  write_floats(*rig.ctx, src.view(), ints(page, 4));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());

  // A guard write of one tile in the middle of page 1: exactly that tile is sent.
  const View middle = sub(t, page + 3 * kTileBytes, kTileBytes);
  write_floats(*rig.ctx, middle, ints(kTile, 5), /*overwrite=*/false);
  hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {t.view(), out.view()}).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kTileBytes);

  // A kernel writes page 2; reading it back downloads into the protected mirror,
  // which must not make the page look host-written.
  const View p2 = sub(t, 2 * page, page);
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {sub(src, 2 * page, page), p2}).ok());
  EXPECT_EQ(read_floats(*rig.ctx, p2), floats_of({src.host_data() + 2 * page, page}));
  before = rig.counters();
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {t.view(), out.view()}).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, 0u);
  EXPECT_EQ(rig.ctx->stats().tracked_conflict_pages, 0u);
}

TEST_P(TrackedMode, RawWritesNextToAGuardAreRecordedByteExactly) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = tracked(rig, 2 * page, "tracked");
  Buffer out = rig.buffer(2 * page, "out");
  write_floats(*rig.ctx, t.view(), std::vector<float>(2 * page / 4, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());

  const View v = sub(t, kTileBytes, kTileBytes);
  {
    auto g = rig.ctx->write(v);
    ASSERT_TRUE(g.ok());
    put_floats(g->bytes(), ints(kTile, 6));
    // While the guard is held, a raw write lands on the same page, outside the view
    // (a value none of whose bytes is zero, so all four differ from before).
    reinterpret_cast<float*>(t.host_data())[5 * kTile + 1] = 1.1f;  // after the view
    reinterpret_cast<float*>(t.host_data())[10] = 1.1f;             // before it
  }
  const hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {t.view(), out.view()}).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kTileBytes + 2 * sizeof(float));
  const std::vector<float> got = read_floats(*rig.ctx, out.view());
  EXPECT_EQ(got[5 * kTile + 1], 1.1f);
  EXPECT_EQ(got[10], 1.1f);
  EXPECT_EQ(std::vector<float>(got.begin() + kTile, got.begin() + 2 * kTile), ints(kTile, 6));
}

// Tracking turned on while a write guard is held: the guard has no copy of its
// page to compare with, so what was written on its pages is taken page-granular.
TEST_P(TrackedMode, EnablingTrackingDuringAGuardLosesNoWrite) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = rig.buffer(2 * page, "late");
  write_floats(*rig.ctx, t.view(), std::vector<float>(2 * page / 4, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  {
    auto g = rig.ctx->write(sub(t, 0, kTileBytes));
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(t.enable_tracking(GetParam()).ok());
    g->as<float>()[0] = 1.f;
    reinterpret_cast<float*>(t.host_data())[700] = 2.f;  // same page, outside the view
  }
  const hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, page);  // the page, once
  const std::vector<float> dev = rig.device_floats(t, t.view());
  EXPECT_EQ(dev[0], 1.f);
  EXPECT_EQ(dev[700], 2.f);
}

// Dirty pages that also hold device-newer bytes keep the device's bytes there (the
// documented rule) and are counted.
TEST_P(TrackedMode, RawWritesBesideDeviceNewerBytesKeepTheDevicesBytes) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = tracked(rig, page, "tracked");
  Buffer src = rig.buffer(kTileBytes, "src");
  write_floats(*rig.ctx, t.view(), std::vector<float>(page / 4, 0.f));
  write_floats(*rig.ctx, src.view(), ints(kTile, 7));
  const View head = sub(t, 0, kTileBytes);
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), head}).ok());  // head: device-newer
  reinterpret_cast<float*>(t.host_data())[3 * kTile] = 5.f;  // same page, host-valid bytes
  const std::vector<float> all = read_floats(*rig.ctx, t.view());
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + kTile), ints(kTile, 7));
  EXPECT_EQ(all[3 * kTile], 5.f);
  EXPECT_EQ(rig.ctx->stats().tracked_conflict_pages, 1u);
  // The raw write is uploaded when something reads it.
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  EXPECT_EQ(rig.device_floats(t, t.view())[3 * kTile], 5.f);
}

// ---- Tracked mode: one scan for several launches -----------------------------------------
//
// Inside MemoryContext::scan_raw_writes_once (a sequence's kernels) a tracked buffer's
// pages are scanned once, at its first use: raw writes made before the scope must
// reach a later launch in it whose view the first launch did not read, and one made
// inside it must be caught at the first use after it.

TEST_P(TrackedMode, RawWritesBeforeAScanOnceScopeReachEveryLaunchInIt) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = tracked(rig, 4 * page, "tracked");
  Buffer out_x = rig.buffer(kTileBytes, "out x"), out_y = rig.buffer(kTileBytes, "out y");
  write_floats(*rig.ctx, t.view(), std::vector<float>(page, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  const View x = sub(t, 0, kTileBytes), y = sub(t, 3 * page, kTileBytes);  // pages apart
  put_floats({x.data(), kTileBytes}, ints(kTile, 11));
  put_floats({y.data(), kTileBytes}, ints(kTile, 12));
  {
    const MemoryContext::RawWriteScan scan = rig.ctx->scan_raw_writes_once();
    const MemoryContext::RawWriteScan inner = rig.ctx->scan_raw_writes_once();  // changes nothing
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {x, out_x.view()}).ok());
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {y, out_y.view()}).ok());
  }
  EXPECT_EQ(read_floats(*rig.ctx, out_x.view()), ints(kTile, 11));
  EXPECT_EQ(read_floats(*rig.ctx, out_y.view()), ints(kTile, 12));
}

TEST_P(TrackedMode, ARawWriteInsideAScanOnceScopeIsCaughtAtTheFirstUseAfterIt) {
  MemoryRig rig;
  const uint64_t page = PageWriteTracker::page_size();
  Buffer t = tracked(rig, 2 * page, "tracked");
  Buffer out = rig.buffer(kTileBytes, "out");
  write_floats(*rig.ctx, t.view(), std::vector<float>(page / 2, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(t.view()).ok());
  const View y = sub(t, page, kTileBytes);
  {
    const MemoryContext::RawWriteScan scan = rig.ctx->scan_raw_writes_once();
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {sub(t, 0, kTileBytes), out.view()}).ok());
    put_floats({y.data(), kTileBytes}, ints(kTile, 13));  // outside the contract: after the scan
  }
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {y, out.view()}).ok());
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), ints(kTile, 13));
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, TrackedMode, ::testing::ValuesIn(tracking_mechanisms()),
                         [](const auto& info) {
                           return std::string(write_tracking_mechanism_name(info.param));
                         });

}  // namespace
}  // namespace npurt::testing
