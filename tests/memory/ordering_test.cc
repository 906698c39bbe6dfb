// Ordering: work touching overlapping ranges takes effect in
// submission order across streams, and buffers are never freed under running work.
//
// A kernel on one stream is held behind a StreamGate (memory_test_util.h) while the
// host and a second stream act on the same bytes, so it is unfinished when they act
// however fast or loaded the machine is. Each hazard is also run with
// Hazard::kUnorderedConflicts on, where it must go wrong: proof that the
// test would catch a missing wait.

#include <gtest/gtest.h>

#include <vector>

#include "memory/memory_test_util.h"

namespace npurt::testing {
namespace {

constexpr uint64_t kBytes = 4 * kTileBytes;

// Iterations of the slow kernel's spin loop before it reads its input; the gate, not
// the spin, keeps it unfinished, so a short one does.
constexpr int64_t kSpin = 10'000;

// Run unordered, a hazard races on device memory on purpose: the host or one
// stream touches bytes a kernel on another still reads or writes. Those runs are the
// tests of suite OrderingWithoutWaits; ThreadSanitizer rightly reports their races,
// so its run (make test-tsan) excludes that suite by name, and every other build
// shows the hazards go wrong unordered.

std::vector<Hazard> ordering(bool on) { return only_if(!on, Hazard::kUnorderedConflicts); }

Status slow_copy(MemoryRig& rig, const View& in, const View& out, hal::StreamId stream) {
  return rig.launch(MemoryRig::kSlowCopy, {LaunchArg::scalar_i64(kSpin), in, out}, stream);
}

// Unordered, nothing makes a kernel wait for the uploads before it: the gate opens
// once `bytes` were copied to the device since the rig was made (the uploads not
// queued behind the gate itself), so the kernel runs after them, as the hazard needs.
void open_once_uploaded(StreamGate& gate, uint64_t bytes) {
  gate.open_once([bytes](const hal::Counters& c) { return c.h2d_bytes >= bytes; });
}

// A hazard run ordered must give the right result after exactly one wait (on the
// host or on the device), and run unordered the wrong one. `run` reports the wait
// counter it was asked about.
using Hazard = std::vector<float> (*)(bool ordered, std::vector<float>* want, uint64_t* waits);

void expect_ordered(Hazard run) {
  std::vector<float> want;
  uint64_t waits = 0;
  EXPECT_EQ(run(true, &want, &waits), want);
  EXPECT_EQ(waits, 1u);
}

void expect_wrong_unordered(Hazard run, const char* broken) {
  std::vector<float> want;
  uint64_t waits = 0;
  EXPECT_NE(run(false, &want, &waits), want) << broken;
}

// Write-after-read: an upload on stream B must wait for a kernel on stream A that
// still has to read the old bytes.
struct WarResult {
  std::vector<float> slow_saw, fast_saw, old_values, new_values;
  uint64_t device_waits = 0;
};

WarResult upload_while_a_kernel_reads(bool ordered) {
  MemoryRig rig(ordering(ordered));
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out_a = rig.buffer(kBytes, "out_a");
  Buffer out_b = rig.buffer(kBytes, "out_b");
  WarResult r;
  r.old_values = ints(kBytes / 4, 1);
  r.new_values = ints(kBytes / 4, 2);
  write_floats(*rig.ctx, x.view(), r.old_values);
  EXPECT_TRUE(rig.ctx->to_device(x.view()).ok());
  StreamGate gate(*rig.device, rig.stream);
  EXPECT_TRUE(slow_copy(rig, x.view(), out_a.view(), rig.stream).ok());
  write_floats(*rig.ctx, x.view(), r.new_values);
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {x.view(), out_b.view()}, rig.stream2).ok());
  if (ordered) {
    gate.open();  // the upload's wait was enqueued while the reader was unfinished
  } else {
    open_once_uploaded(gate, 2 * kBytes);  // the old bytes, then the new
  }
  // What the kernels wrote, read from device memory once everything completed.
  r.slow_saw = rig.device_floats(out_a, out_a.view());
  r.fast_saw = rig.device_floats(out_b, out_b.view());
  r.device_waits = rig.ctx->stats().device_waits;
  return r;
}

TEST(Ordering, UploadWaitsForAKernelStillReadingTheOldBytes) {
  const WarResult ok = upload_while_a_kernel_reads(true);
  EXPECT_EQ(ok.slow_saw, ok.old_values);
  EXPECT_EQ(ok.fast_saw, ok.new_values);
  EXPECT_EQ(ok.device_waits, 1u);  // stream 2 waited for the reader on stream 1
}

TEST(OrderingWithoutWaits, UploadOvertakesAKernelStillReadingTheOldBytes) {
  const WarResult broken = upload_while_a_kernel_reads(false);
  EXPECT_EQ(broken.slow_saw, broken.new_values) << "without waits the upload overtakes the reader";
}

// Read-after-write on the host: a read-back waits for the kernel that writes it.
std::vector<float> read_while_a_kernel_writes(bool ordered, std::vector<float>* want,
                                              uint64_t* host_waits) {
  MemoryRig rig(ordering(ordered));
  Buffer src = rig.buffer(kBytes, "src");
  Buffer out = rig.buffer(kBytes, "out");
  *want = ints(kBytes / 4, 3);
  write_floats(*rig.ctx, src.view(), *want);
  StreamGate gate(*rig.device, rig.stream);
  EXPECT_TRUE(slow_copy(rig, src.view(), out.view(), rig.stream).ok());
  if (ordered) gate.open_when_the_host_blocks();  // the read-back blocks behind the gate
  std::vector<float> got = read_floats(*rig.ctx, out.view());
  gate.open();
  *host_waits = rig.ctx->stats().host_waits;
  return got;
}

TEST(Ordering, ReadBackWaitsForTheKernelThatWritesIt) { expect_ordered(read_while_a_kernel_writes); }

TEST(OrderingWithoutWaits, ReadBackPrecedesTheKernelThatWritesIt) {
  expect_wrong_unordered(read_while_a_kernel_writes, "without waits the read-back precedes the kernel");
}

// Read-after-write across streams: a kernel on B reads what a kernel on A writes.
std::vector<float> consume_on_another_stream(bool ordered, std::vector<float>* want,
                                             uint64_t* device_waits) {
  MemoryRig rig(ordering(ordered));
  Buffer src = rig.buffer(kBytes, "src");
  Buffer mid = rig.buffer(kBytes, "mid");
  Buffer out = rig.buffer(kBytes, "out");
  *want = ints(kBytes / 4, 4);
  write_floats(*rig.ctx, src.view(), *want);
  write_floats(*rig.ctx, mid.view(), std::vector<float>(kBytes / 4, -1.f));
  EXPECT_TRUE(rig.ctx->to_device(mid.view()).ok());
  StreamGate gate(*rig.device, rig.stream);
  EXPECT_TRUE(slow_copy(rig, src.view(), mid.view(), rig.stream).ok());
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {mid.view(), out.view()}, rig.stream2).ok());
  *device_waits = rig.ctx->stats().device_waits;
  // Unordered, the consumer does not wait: let it read before the writer runs.
  if (!ordered) {
    EXPECT_TRUE(rig.device->stream_synchronize(rig.stream2).ok());
  }
  gate.open();
  return read_floats(*rig.ctx, out.view());
}

TEST(Ordering, KernelOnAnotherStreamWaitsForTheWriter) { expect_ordered(consume_on_another_stream); }

TEST(OrderingWithoutWaits, KernelOnAnotherStreamReadsBeforeTheWriter) {
  expect_wrong_unordered(consume_on_another_stream, "without waits the consumer reads the old bytes");
}

// Write-after-write: the host's newer bytes, uploaded while a kernel that writes the
// same range is still running, must end up on the device.
std::vector<float> upload_over_a_running_writer(bool ordered, std::vector<float>* want,
                                                uint64_t* host_waits) {
  MemoryRig rig(ordering(ordered));
  Buffer src = rig.buffer(kBytes, "src");
  Buffer x = rig.buffer(kBytes, "x");
  write_floats(*rig.ctx, src.view(), ints(kBytes / 4, 5));
  StreamGate gate(*rig.device, rig.stream);
  EXPECT_TRUE(slow_copy(rig, src.view(), x.view(), rig.stream).ok());
  *want = ints(kBytes / 4, 6);
  write_floats(*rig.ctx, x.view(), *want);  // overwrite: newest bytes on the host
  if (ordered) gate.open_when_the_host_blocks();  // the upload blocks behind the gate
  EXPECT_TRUE(rig.ctx->to_device(x.view()).ok());
  if (ordered) {
    gate.open();
  } else {
    open_once_uploaded(gate, kBytes);  // x (src's upload is queued behind the gate, on the kernel's stream)
  }
  *host_waits = rig.ctx->stats().host_waits;
  return rig.device_floats(x, x.view());
}

TEST(Ordering, UploadWaitsForAnEarlierWriterOfTheSameBytes) { expect_ordered(upload_over_a_running_writer); }

TEST(OrderingWithoutWaits, AnEarlierWriterOverwritesTheUpload) {
  expect_wrong_unordered(upload_over_a_running_writer, "without waits the kernel overwrites the upload");
}

TEST(Ordering, DisjointViewsOfOneBufferDoNotWaitForEachOther) {
  MemoryRig rig;
  Buffer x = rig.buffer(2 * kBytes, "x");
  Buffer out = rig.buffer(2 * kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(2 * kBytes / 4, 7));
  ASSERT_TRUE(rig.ctx->to_device(x.view()).ok());
  // The first half's writer stays unfinished until the host blocks on it: however
  // fast the cores, the last read below has to wait for it.
  StreamGate gate(*rig.device, rig.stream);
  ASSERT_TRUE(slow_copy(rig, sub(x, 0, kBytes), sub(out, 0, kBytes), rig.stream).ok());
  const uint64_t waits = rig.ctx->stats().device_waits;
  ASSERT_TRUE(
      rig.launch(MemoryRig::kCopy, {sub(x, kBytes, kBytes), sub(out, kBytes, kBytes)}, rig.stream2)
          .ok());
  EXPECT_EQ(rig.ctx->stats().device_waits, waits);
  // Reading the second half waits for its own writer only, never for the slow
  // kernel writing the first half; reading everything waits for that one too.
  const std::vector<float> all = ints(2 * kBytes / 4, 7);
  const uint64_t host_waits = rig.ctx->stats().host_waits;
  EXPECT_EQ(read_floats(*rig.ctx, sub(out, kBytes, kBytes)),
            std::vector<float>(all.begin() + kBytes / 4, all.end()));
  EXPECT_EQ(rig.ctx->stats().host_waits, host_waits + 1);
  gate.open_when_the_host_blocks();
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), all);
  EXPECT_EQ(rig.ctx->stats().host_waits, host_waits + 2);
}

TEST(Ordering, FreeingABufferInUseIsDeferredUntilTheWorkCompletes) {
  MemoryRig rig;
  Buffer out = rig.buffer(kBytes, "out");
  const std::vector<float> want = ints(kBytes / 4, 8);
  hal::DeviceAddr old_addr{};
  // The copy stays unfinished behind the gate until the host waits for it, however
  // fast the device runs it: y is allocated while x's bytes are still in use.
  StreamGate gate(*rig.device, rig.stream);
  {
    Buffer x = rig.buffer(kBytes, "x");
    old_addr = x.device_address();
    write_floats(*rig.ctx, x.view(), want);
    ASSERT_TRUE(slow_copy(rig, x.view(), out.view(), rig.stream).ok());
    const View kept = x.view();
    ASSERT_TRUE(x.free().ok());
    EXPECT_FALSE(x.valid());
    EXPECT_EQ(rig.ctx->stats().pending_frees, 1u);
    // Using the freed buffer is an error, not a crash.
    auto r = rig.ctx->read(kept);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(contains(r.status(), "'x'")) << r.status().to_string();
    EXPECT_TRUE(contains(r.status(), "freed")) << r.status().to_string();
  }
  // The allocator recycles the most recently freed block first: had the free not
  // been deferred, this buffer would land on x's bytes while the kernel reads them.
  Buffer y = rig.buffer(kBytes, "y");
  EXPECT_NE(y.device_address(), old_addr);
  gate.open_when_the_host_blocks();
  write_floats(*rig.ctx, y.view(), std::vector<float>(kBytes / 4, -5.f));
  ASSERT_TRUE(rig.ctx->to_device(y.view()).ok());
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), want);
  ASSERT_TRUE(rig.ctx->synchronize().ok());
  EXPECT_EQ(rig.ctx->stats().pending_frees, 0u);
  Buffer z = rig.buffer(kBytes, "z");
  EXPECT_EQ(z.device_address(), old_addr) << "the deferred free happened";
}

TEST(Ordering, AFailedKernelsOutputReportsTheFailureAndCanBeOverwritten) {
  MemoryRig rig;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  write_floats(*rig.ctx, x.view(), ints(kBytes / 4, 9));
  // Twice the grid the views hold: the extra blocks fault on their bounds check.
  const LaunchArg args[] = {x.view(), out.view()};
  const Kernel& copy = rig.kernels[MemoryRig::kCopy];
  // The fault may strike before the launch has recorded its completion event; the
  // launch then reports it itself. Either way the output is known to be bad.
  const Status launched = rig.ctx->launch(rig.stream, copy.code, 2 * kBytes / kTileBytes, args);
  if (!launched.ok()) {
    EXPECT_EQ(launched.code(), StatusCode::kDeviceFault) << launched.to_string();
  }
  auto r = rig.ctx->read(out.view());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeviceFault) << r.status().to_string();
  EXPECT_TRUE(contains(r.status(), "'out'")) << r.status().to_string();
  // Still an error on the next read, and for a kernel that would consume them:
  // the bytes are garbage.
  EXPECT_EQ(rig.ctx->read(out.view()).status().code(), StatusCode::kDeviceFault);
  Buffer out2 = rig.buffer(kBytes, "out2");
  const Status consume = rig.launch(MemoryRig::kCopy, {out.view(), out2.view()}, rig.stream2);
  EXPECT_EQ(consume.code(), StatusCode::kDeviceFault) << consume.to_string();
  EXPECT_TRUE(contains(consume, "written by device work that failed")) << consume.to_string();
  // The host replaces them; the device and the context stay usable on another stream.
  write_floats(*rig.ctx, out.view(), ints(kBytes / 4, 10));
  EXPECT_EQ(read_floats(*rig.ctx, out.view()), ints(kBytes / 4, 10));
  ASSERT_TRUE(rig.launch(MemoryRig::kCopy, {out.view(), out2.view()}, rig.stream2).ok());
  EXPECT_EQ(read_floats(*rig.ctx, out2.view()), ints(kBytes / 4, 10));
}

// Events are recycled: the number a context holds is bounded by the work in flight,
// not by the number of launches.
TEST(Ordering, EventCountStaysBounded) {
  MemoryRig rig;
  Buffer a = rig.buffer(kBytes, "a");
  Buffer b = rig.buffer(kBytes, "b");
  write_floats(*rig.ctx, a.view(), ints(kBytes / 4, 11));
  for (int i = 0; i < 400; ++i) {
    // A host read now and then, as a real loop has, bounds the work in flight.
    if (i % 16 == 0) {
      EXPECT_EQ(read_floats(*rig.ctx, a.view()), ints(kBytes / 4, 11));
    }
    const bool even = i % 2 == 0;
    ASSERT_TRUE(rig.launch(MemoryRig::kCopy,
                           {even ? a.view() : b.view(), even ? b.view() : a.view()},
                           even ? rig.stream : rig.stream2)
                    .ok());
  }
  EXPECT_EQ(read_floats(*rig.ctx, a.view()), ints(kBytes / 4, 11));
  const MemoryStats s = rig.ctx->stats();
  EXPECT_EQ(s.fences_recorded, 400u);
  EXPECT_LE(s.events_created, 40u);
  EXPECT_GT(s.device_waits, 0u);  // every launch conflicts with the one before
}

}  // namespace
}  // namespace npurt::testing
