// Buffers, views, guards and launch binding: the API contract, exact byte counts,
// and bad input reported as errors that name the problem.

#include "npurt/memory/memory_context.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "memory/memory_test_util.h"

namespace npurt::testing {
namespace {

constexpr uint64_t kBytes = 4 * kTileBytes;

// ---- buffers and views -----------------------------------------------------------------

TEST(Buffer, HasAPageAlignedZeroFilledMirrorAndADeviceAllocation) {
  MemoryRig rig;
  Buffer b = rig.buffer(1000, "b");
  EXPECT_EQ(b.size(), 1000u);
  EXPECT_EQ(b.name(), "b");
  EXPECT_TRUE(b.device_address());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.host_data()) % PageWriteTracker::page_size(), 0u);
  EXPECT_EQ(b.host_data()[999], 0);
  EXPECT_FALSE(b.tracked());
  EXPECT_EQ(rig.ctx->stats().buffers_live, 1u);
}

TEST(Buffer, BadSizesAndAlignmentsAreErrors) {
  MemoryRig rig;
  auto zero = rig.ctx->create_buffer(0, {.name = "empty"});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(zero.status(), "'empty'")) << zero.status().to_string();

  auto misaligned = rig.ctx->create_buffer(64, {.name = "odd", .alignment = 3});
  ASSERT_FALSE(misaligned.ok());
  EXPECT_EQ(misaligned.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(misaligned.status(), "alignment 3")) << misaligned.status().to_string();

  auto huge = rig.ctx->create_buffer(1ull << 40, {.name = "huge"});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().to_string();
  EXPECT_TRUE(contains(huge.status(), "'huge'")) << huge.status().to_string();

  auto overflow = rig.ctx->create_buffer(~uint64_t{0}, {.name = "overflow"});
  ASSERT_FALSE(overflow.ok());
  EXPECT_EQ(overflow.status().code(), StatusCode::kInvalidArgument);

  // The context and the device are still fine.
  Buffer ok = rig.buffer(kBytes, "ok");
  write_floats(*rig.ctx, ok.view(), ints(kBytes / 4, 1));
  ASSERT_TRUE(rig.ctx->to_device(ok.view()).ok());
  EXPECT_EQ(rig.device_floats(ok, ok.view()), ints(kBytes / 4, 1));
}

TEST(View, AViewOfAViewIsAViewOfTheRoot) {
  MemoryRig rig;
  Buffer b = rig.buffer(1024, "b");
  auto v = b.view(256, 512);
  ASSERT_TRUE(v.ok());
  auto w = v->subview(128, 64);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->offset(), 384u);
  EXPECT_EQ(w->size(), 64u);
  EXPECT_EQ(w->data(), b.host_data() + 384);
  EXPECT_TRUE(w->same_buffer(b.view()));
  EXPECT_TRUE(w->overlaps(*v));
  EXPECT_FALSE(w->overlaps(*b.view(0, 384)));
  EXPECT_TRUE(b.view(1024, 0).ok());  // empty view at the end
}

TEST(View, OutOfRangeViewsAreErrorsNamingTheBuffer) {
  MemoryRig rig;
  Buffer b = rig.buffer(1024, "arena");
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{1000, 100},
                                {1025, 0},
                                {0, 1025},
                                {~uint64_t{0}, 2},
                                {8, ~uint64_t{0}}}) {
    auto v = b.view(offset, length);
    ASSERT_FALSE(v.ok()) << offset << " " << length;
    EXPECT_EQ(v.status().code(), StatusCode::kOutOfRange);
    EXPECT_TRUE(contains(v.status(), "'arena'")) << v.status().to_string();
  }
  auto v = b.view(256, 256);
  ASSERT_TRUE(v.ok());
  auto w = v->subview(200, 100);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(contains(w.status(), "[256, 512)")) << w.status().to_string();
}

TEST(View, DetachedAndForeignViewsAreErrors) {
  MemoryRig rig;
  MemoryRig other;
  Buffer mine = rig.buffer(kBytes, "mine");
  Buffer theirs = other.buffer(kBytes, "theirs");

  auto detached = rig.ctx->read(View());
  ASSERT_FALSE(detached.ok());
  EXPECT_EQ(detached.status().code(), StatusCode::kFailedPrecondition);

  auto foreign = rig.ctx->read(theirs.view());
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(foreign.status(), "another memory context")) << foreign.status().to_string();

  const Status launch = rig.launch(MemoryRig::kCopy, {mine.view(), theirs.view()});
  EXPECT_EQ(launch.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(launch, "argument 1 ('out')")) << launch.to_string();
}

TEST(Buffer, ViewsOfAFreedBufferAreErrorsAndTheDeviceStaysUsable) {
  MemoryRig rig;
  Buffer b = rig.buffer(kBytes, "gone");
  Buffer out = rig.buffer(kBytes, "out");
  const View v = b.view();
  ASSERT_TRUE(b.free().ok());
  ASSERT_TRUE(b.free().ok());  // idempotent
  EXPECT_EQ(rig.ctx->stats().buffers_live, 1u);
  for (const Status& s :
       {rig.ctx->read(v).status(), rig.ctx->write(v).status(), rig.ctx->overwrite(v).status(),
        rig.ctx->to_device(v), rig.ctx->to_host(v), rig.ctx->mark_host_written(v),
        rig.launch(MemoryRig::kCopy, {v, out.view()})}) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
    EXPECT_TRUE(contains(s, "buffer 'gone'")) << s.to_string();
    EXPECT_TRUE(contains(s, "freed")) << s.to_string();
  }
  EXPECT_EQ(v.data()[0], 0);  // the mirror is still mapped while the view exists
  Buffer in = rig.buffer(kBytes, "in");
  write_floats(*rig.ctx, in.view(), ints(kBytes / 4, 2));
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {in.view(), out.view()}).ok());
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), ints(kBytes / 4, 2));
}

TEST(Buffer, MovingAssignsOwnership) {
  MemoryRig rig;
  Buffer a = rig.buffer(kBytes, "a");
  Buffer b = rig.buffer(kBytes, "b");
  const View old_b = b.view();
  b = std::move(a);  // frees the old b
  EXPECT_EQ(b.name(), "a");
  EXPECT_FALSE(a.valid());  // NOLINT: moved-from is empty by contract
  EXPECT_EQ(rig.ctx->to_device(old_b).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(rig.ctx->stats().buffers_live, 1u);
}

TEST(MemoryContext, BuffersMayOutliveTheContext) {
  auto rig = std::make_unique<MemoryRig>();
  Buffer b = rig->buffer(kBytes, "survivor");
  const View v = b.view();
  write_floats(*rig->ctx, v, ints(kBytes / 4, 3));
  ASSERT_TRUE(rig->ctx->to_device(v).ok());
  std::unique_ptr<MemoryContext> ctx = std::move(rig->ctx);
  ctx.reset();  // frees the device memory of every buffer
  // Views and buffers now report the destroyed context; destroying them is safe.
  auto r = b.enable_tracking();
  EXPECT_EQ(r.code(), StatusCode::kFailedPrecondition) << r.to_string();
  EXPECT_TRUE(contains(r, "memory context is closed")) << r.to_string();
  EXPECT_TRUE(b.free().ok());
  rig.reset();
}

// ---- host access and explicit syncs -------------------------------------------------------

TEST(HostAccess, OverwriteDoesNotFetchAndWriteFetchesOnlyDeviceNewerBytes) {
  MemoryRig rig;
  Buffer src = rig.buffer(kBytes, "src");
  Buffer x = rig.buffer(2 * kBytes, "x");
  write_floats(*rig.ctx, src.view(), ints(kBytes / 4, 4));
  write_floats(*rig.ctx, x.view(), std::vector<float>(2 * kBytes / 4, 1.f));
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), sub(x, kBytes, kBytes)}).ok());

  hal::Counters before = rig.counters();
  { ASSERT_TRUE(rig.ctx->overwrite(x.view()).ok()); }
  EXPECT_EQ((rig.counters() - before).d2h_bytes, 0u);

  // The overwrite made all of x host-newer again: nothing to fetch now.
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {src.view(), sub(x, kBytes, kBytes)}).ok());
  before = rig.counters();
  {
    auto g = rig.ctx->write(x.view());
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(std::vector<float>(g->as<float>().begin() + kBytes / 4, g->as<float>().end()),
              ints(kBytes / 4, 4));
    g->as<float>()[0] = 7.f;
  }
  const hal::Counters moved = rig.counters() - before;
  EXPECT_EQ(moved.d2h_bytes, kBytes);  // the device-newer half only
  EXPECT_EQ(moved.d2h_transfers, 1u);
  before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes,
            2 * kBytes);  // write() made the whole view host-newer
  EXPECT_EQ(rig.device_floats(x, x.view())[0], 7.f);
}

TEST(HostAccess, ExplicitSyncsMoveOnlyTheStaleBytesOfTheView) {
  MemoryRig rig;
  Buffer x = rig.buffer(4 * kBytes, "x");
  write_floats(*rig.ctx, x.view(), ints(kBytes, 5));
  hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(sub(x, kBytes, kBytes)).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kBytes);
  before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(sub(x, 0, 3 * kBytes)).ok());  // overlaps the synced part
  EXPECT_EQ((rig.counters() - before).h2d_bytes, 2 * kBytes);
  EXPECT_EQ((rig.counters() - before).h2d_transfers, 2u);
  before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());  // nothing stale the second time
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kBytes);
  before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_host(x.view()).ok());  // both valid: nothing to fetch
  EXPECT_EQ((rig.counters() - before).d2h_bytes, 0u);
  EXPECT_EQ(rig.device_floats(x, x.view()), ints(kBytes, 5));
}

TEST(HostAccess, MarkHostWrittenDeclaresRawWrites) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  write_floats(*rig.ctx, x.view(), std::vector<float>(kBytes / 4, 0.f));
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  reinterpret_cast<float*>(x.host_data())[70] = 3.f;
  const View tile = sub(x, kTileBytes, kTileBytes);
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  EXPECT_EQ(rig.device_floats(x, x.view())[70], 0.f) << "undeclared raw writes are not seen";
  ASSERT_TRUE(rig.ctx->mark_host_written(tile).ok());
  const hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kTileBytes);
  EXPECT_EQ(rig.device_floats(x, x.view())[70], 3.f);
}

TEST(HostAccess, AReleasedGuardOfAFreedBufferRecordsNothing) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  auto g = rig.ctx->write(x.view());
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(x.free().ok());
  g->bytes()[0] = 1;  // the mirror outlives the buffer while the guard holds it
  g->release();
  EXPECT_FALSE(g->active());
}

// ---- launch binding --------------------------------------------------------------------

TEST(Launch, InputsUploadedOutputsDeviceNewerAndSteadyStateMovesNothing) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer y = rig.buffer(kBytes, "y");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(kBytes / 4, 6));
  write_floats(*rig.ctx, y.view(), ints(kBytes / 4, 7));
  hal::Counters before = rig.counters();
  ASSERT_TRUE(rig.launch(MemoryRig::kAdd, {x.view(), y.view(), out.view()}).ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, 2 * kBytes);
  std::vector<float> want(kBytes / 4);
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = ints(kBytes / 4, 6)[i] + ints(kBytes / 4, 7)[i];
  }
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), want);

  before = rig.counters();
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(rig.launch(MemoryRig::kAdd, {x.view(), y.view(), out.view()}).ok());
  }
  const hal::Counters steady = rig.counters() - before;
  EXPECT_EQ(steady.h2d_bytes, 0u);
  EXPECT_EQ(steady.d2h_bytes, 0u);
  EXPECT_EQ(steady.launches, 10u);
}

TEST(Launch, BytesBoundTwiceAreUploadedOnce) {
  MemoryRig rig;
  Buffer x = rig.buffer(2 * kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(2 * kBytes / 4, 8));
  const hal::Counters before = rig.counters();
  // x[0, kBytes) + x[kBytes/2, 3kBytes/2): overlapping inputs.
  ASSERT_TRUE(
      rig.launch(MemoryRig::kAdd, {sub(x, 0, kBytes), sub(x, kBytes / 2, kBytes), out.view()})
          .ok());
  EXPECT_EQ((rig.counters() - before).h2d_bytes, kBytes + kBytes / 2);
  EXPECT_EQ((rig.counters() - before).h2d_transfers, 1u);
  const std::vector<float> xs = ints(2 * kBytes / 4, 8);
  const std::vector<float> got = read_floats(*rig.ctx, out.view());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], xs[i] + xs[i + kBytes / 8]) << i;
}

TEST(Launch, InoutArgumentsAreSyncedAndBecomeDeviceNewer) {
  MemoryRig rig;
  Buffer acc = rig.buffer(kBytes, "acc");
  Buffer x = rig.buffer(kBytes, "x");
  write_floats(*rig.ctx, acc.view(), std::vector<float>(kBytes / 4, 1.f));
  write_floats(*rig.ctx, x.view(), std::vector<float>(kBytes / 4, 2.f));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(rig.launch(MemoryRig::kAccumulate, {acc.view(), x.view()}).ok());
  }
  EXPECT_EQ(read_floats(*rig.ctx, acc.view()), std::vector<float>(kBytes / 4, 11.f));
  // Host edit between launches: synced again before the next one.
  { rig.ctx->write(acc.view())->as<float>()[0] = 100.f; }
  ASSERT_TRUE(rig.launch(MemoryRig::kAccumulate, {acc.view(), x.view()}).ok());
  EXPECT_EQ(read_floats(*rig.ctx, acc.view())[0], 102.f);
}

TEST(Launch, ArgumentMismatchesAreErrorsAndEnqueueNothing) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(kBytes / 4, 9));
  const Kernel& scale = rig.kernels[MemoryRig::kScale];
  auto launch = [&](std::vector<LaunchArg> args, uint32_t grid = 4) {
    return rig.ctx->launch(rig.stream, scale.code, grid, args);
  };
  struct Case {
    Status status;
    StatusCode code;
    const char* text;
  };
  const Case cases[] = {
      {launch({x.view(), out.view()}), StatusCode::kInvalidArgument, "declares 3 arguments, got 2"},
      {launch({LaunchArg::scalar_f32(1), out.view(), LaunchArg::scalar_f32(2)}),
       StatusCode::kInvalidArgument, "argument 0 ('x') is a buffer, got a scalar"},
      {launch({x.view(), out.view(), out.view()}), StatusCode::kInvalidArgument,
       "argument 2 ('s') is a scalar, got a view"},
      {launch({x.view(), out.view(), LaunchArg::scalar_i64(2)}), StatusCode::kInvalidArgument,
       "argument 2 ('s') is a f32 scalar, got an integer"},
      {launch({LaunchArg::output(x.view()), out.view(), LaunchArg::scalar_f32(2)}),
       StatusCode::kInvalidArgument,
       "argument 0 ('x') is bound as 'out' but the image declares 'in'"},
      {launch({*x.view(0, 6), out.view(), LaunchArg::scalar_f32(2)}), StatusCode::kInvalidArgument,
       "view of 6 bytes is not a whole number of f32 elements (4 bytes)"},
      {launch({*x.view(0, 0), out.view(), LaunchArg::scalar_f32(2)}), StatusCode::kInvalidArgument,
       "argument 0 ('x'): empty view"},
      {launch({View(), out.view(), LaunchArg::scalar_f32(2)}), StatusCode::kFailedPrecondition,
       "not attached"},
      {launch({x.view(), out.view(), LaunchArg::scalar_f32(2)}, 0), StatusCode::kInvalidArgument,
       "empty grid"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), c.code) << c.status.to_string();
    EXPECT_TRUE(contains(c.status, c.text)) << c.status.to_string() << "\nwanted: " << c.text;
    EXPECT_TRUE(contains(c.status, "launch of 'scale'")) << c.status.to_string();
  }
  const MemoryStats s = rig.ctx->stats();
  EXPECT_EQ(s.launches, 0u);
  EXPECT_EQ(s.h2d_bytes, 0u);
  // A correct launch after all that works.
  ASSERT_TRUE(
      launch({LaunchArg::input(x.view()), LaunchArg::output(out.view()), LaunchArg::scalar_f32(2)})
          .ok());
  std::vector<float> want = ints(kBytes / 4, 9);
  for (float& v : want) v *= 2;
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), want);
}

TEST(Launch, WorksOnAnyStreamTheCallerPasses) {
  MemoryRig rig;
  Buffer a = rig.buffer(kBytes, "a");
  Buffer b = rig.buffer(kBytes, "b");
  write_floats(*rig.ctx, a.view(), ints(kBytes / 4, 10));
  auto fresh = rig.device->create_stream();
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE(
      rig.launch(MemoryRig::kScale, {a.view(), b.view(), LaunchArg::scalar_f32(3)}, *fresh).ok());
  ASSERT_TRUE(
      rig.launch(MemoryRig::kScale, {b.view(), a.view(), LaunchArg::scalar_f32(2)}, rig.stream2)
          .ok());
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {a.view(), b.view()}, rig.stream).ok());
  std::vector<float> want = ints(kBytes / 4, 10);
  for (float& v : want) v *= 6;
  EXPECT_EQ(read_floats(*rig.ctx, b.view()), want);
  ASSERT_TRUE(rig.ctx->synchronize().ok());
  ASSERT_TRUE(rig.device->destroy_stream(*fresh).ok());
  // Fences recorded on the destroyed stream are complete; nothing refers to it.
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {b.view(), a.view()}).ok());
  EXPECT_EQ(read_floats(*rig.ctx, a.view()), want);
}

TEST(Launch, HostMayRewriteInputsAsSoonAsLaunchReturns) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out1 = rig.buffer(kBytes, "out1");
  Buffer out2 = rig.buffer(kBytes, "out2");
  for (int round = 0; round < 20; ++round) {
    write_floats(*rig.ctx, x.view(), ints(kBytes / 4, round));
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {x.view(), out1.view()}).ok());
    // Raw rewrite right away, declared: the launch above must still see the old bytes.
    std::vector<float> next = ints(kBytes / 4, round + 100);
    std::memcpy(x.host_data(), next.data(), kBytes);
    ASSERT_TRUE(rig.ctx->mark_host_written(x.view()).ok());
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {x.view(), out2.view()}).ok());
    ASSERT_EQ(read_floats(*rig.ctx, out1.view()), ints(kBytes / 4, round));
    ASSERT_EQ(read_floats(*rig.ctx, out2.view()), next);
  }
}

// The threading contract: any thread, any stream, one context. Four threads share a
// read-only input (so its bytes have readers on four streams at once) and each
// rewrites its own inputs, partly through tracked raw writes, every iteration.
TEST(MemoryContext, ConcurrentCallersOnOneContext) {
  MemoryRig rig;
  std::vector<hal::StreamId> streams{rig.stream, rig.stream2};
  while (streams.size() < 4) streams.push_back(*rig.device->create_stream());
  Buffer shared = rig.buffer(kBytes, "shared");
  write_floats(*rig.ctx, shared.view(), ints(kBytes / 4, 1));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Buffer mine = rig.buffer(kBytes, "mine", /*tracked=*/t % 2 == 1);
      Buffer out = rig.buffer(kBytes, "out");
      for (int i = 0; i < 30; ++i) {
        const std::vector<float> xs = ints(kBytes / 4, 100 * t + i);
        if (t % 2 == 1) {
          std::memcpy(mine.host_data(), xs.data(), kBytes);  // caught by tracking
        } else {
          write_floats(*rig.ctx, mine.view(), xs);
        }
        const LaunchArg args[] = {shared.view(), mine.view(), out.view()};
        const Kernel& add = rig.kernels[MemoryRig::kAdd];
        if (!rig.ctx->launch(streams[t], add.code, kBytes / kTileBytes, args).ok()) {
          ++failures;
        }
        const std::vector<float> got = read_floats(*rig.ctx, out.view());
        for (size_t k = 0; k < got.size(); ++k) {
          if (got[k] != xs[k] + ints(kBytes / 4, 1)[k]) {
            ++failures;
            break;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(rig.ctx->synchronize().ok());
  for (size_t i = 2; i < streams.size(); ++i) {
    ASSERT_TRUE(rig.device->destroy_stream(streams[i]).ok());
  }
}

}  // namespace
}  // namespace npurt::testing
