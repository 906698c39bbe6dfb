// The simulated device's contract: memory, copies, streams, events, launches,
// faults and counters.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "npurt/base/hazards.h"
#include "sim_test_util.h"

namespace npurt {
namespace {

using namespace npurt::testing;
using hal::KernelArg;

// The add kernel's arguments: x, y and out, each `bytes` long.
std::vector<KernelArg> add_args(hal::DeviceAddr x, hal::DeviceAddr y, hal::DeviceAddr out,
                                uint64_t bytes = 256) {
  return {KernelArg::buffer(x, bytes), KernelArg::buffer(y, bytes), KernelArg::buffer(out, bytes)};
}

TEST(SimDevice, RejectsBadOptionsNamingTheField) {
  hal::SimOptions o;
  o.num_cores = 0;
  auto d = hal::create_sim_device(o);
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(contains(d.status(), "num_cores"));
  o = {};
  o.icache_line_bytes = 48;
  EXPECT_TRUE(contains(hal::create_sim_device(o).status(), "icache_line_bytes"));
}

TEST(SimDevice, CopiesRoundTripAndAreCounted) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  const auto data = random_floats(1000, 1);
  const auto before = dev->counters();
  const auto addr = put(*dev, s, data);
  auto back = get<float>(*dev, s, addr, data.size());
  EXPECT_EQ(back, data);
  const auto d = dev->counters() - before;
  EXPECT_EQ(d.h2d_bytes, 4000u);
  EXPECT_EQ(d.h2d_transfers, 1u);
  EXPECT_EQ(d.d2h_bytes, 4000u);
  EXPECT_EQ(d.d2h_transfers, 1u);

  auto other = dev->allocate(4000).value();
  NPURT_ASSERT_OK(dev->copy_on_device(s, other, addr, 4000));
  EXPECT_EQ(get<float>(*dev, s, other, 1000), data);
  EXPECT_EQ((dev->counters() - before).d2d_bytes, 4000u);
}

TEST(SimDevice, CopiesOutsideAllocationsAreRefused) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  auto a = dev->allocate(100).value();
  std::vector<uint8_t> host(200);
  Status st = dev->copy_to_device(s, a, host.data(), 101);
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(contains(st, "not inside one live device allocation"));
  EXPECT_EQ(dev->copy_to_host(s, host.data(), a + 50, 60).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(dev->copy_to_device(s, npurt::hal::DeviceAddr(12345), host.data(), 1).code(), StatusCode::kOutOfRange);
  NPURT_ASSERT_OK(dev->free(a));
  EXPECT_EQ(dev->copy_to_device(s, a, host.data(), 1).code(), StatusCode::kOutOfRange)
      << "a freed block is not a copy target";
  const auto live = dev->allocate(16).value();
  EXPECT_EQ(dev->copy_to_device(npurt::hal::StreamId(999), live, host.data(), 1).code(), StatusCode::kNotFound);
  NPURT_ASSERT_OK(dev->stream_synchronize(s));  // refused requests did not poison the stream
}

TEST(SimDevice, LaunchComputesOnEveryBlock) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  auto image = elementwise_kernel("add", isa::BinOp::kAdd);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const auto code = upload(*dev, *image);
  const size_t n = 64 * 20;  // 20 blocks on 8 cores: blocks share cores
  const auto x = random_floats(n, 2), y = random_floats(n, 3);
  const auto dx = put(*dev, s, x), dy = put(*dev, s, y);
  const auto dout = put(*dev, s, std::vector<float>(n, std::nanf("")));  // poisoned
  NPURT_ASSERT_OK(dev->launch(s, {code, 20, add_args(dx, dy, dout, n * 4)}));
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  const auto out = get<float>(*dev, s, dout, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] + y[i]) << i;
  EXPECT_EQ(dev->counters().launches, 1u);
  EXPECT_EQ(dev->counters().blocks, 20u);
}

TEST(SimDevice, LaunchArgumentsAreCheckedAgainstTheSignature) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  const auto code = upload(*dev, elementwise_kernel("add", isa::BinOp::kAdd).value());
  const auto buf = dev->allocate(256).value();
  // Wrong count: an execution-time error on the stream, naming the kernel.
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, {KernelArg::buffer(buf, 256)}}));
  Status st = dev->stream_synchronize(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(st, "kernel 'add' takes 3 arguments, launch passed 1")) << st.to_string();
  // A scalar where a buffer is expected.
  auto s2 = dev->create_stream().value();
  NPURT_ASSERT_OK(dev->launch(s2, {code, 1, {KernelArg::buffer(buf, 256), KernelArg::scalar_i64(1),
                                            KernelArg::buffer(buf, 256)}}));
  EXPECT_TRUE(contains(dev->stream_synchronize(s2), "argument 1 must be a buffer"));
  // A buffer range outside any allocation is refused at enqueue.
  auto s3 = dev->create_stream().value();
  EXPECT_EQ(dev->launch(s3, {code, 1, {KernelArg::buffer(buf, 512), KernelArg::buffer(buf, 256),
                                       KernelArg::buffer(buf, 256)}}).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(dev->launch(s3, {code, 0, {}}).code(), StatusCode::kInvalidArgument);
}

TEST(SimDevice, OutOfBoundsAccessFaultsTheStreamAndTheDeviceStaysUsable) {
  auto dev = make_sim();
  auto bad_stream = dev->create_stream().value();
  auto good_stream = dev->create_stream().value();
  const auto code = upload(*dev, elementwise_kernel("add", isa::BinOp::kAdd).value());
  const auto x = random_floats(64, 4);
  const auto dx = put(*dev, good_stream, x);
  const auto small = put(*dev, good_stream, std::vector<float>(16, 1.f));  // 64 B, kernel reads 256 B
  const auto dout = dev->allocate(256).value();
  NPURT_ASSERT_OK(dev->launch(bad_stream, {code, 1, {KernelArg::buffer(dx, 256), KernelArg::buffer(small, 64),
                                                      KernelArg::buffer(dout, 256)}}));
  Status st = dev->stream_synchronize(bad_stream);
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault);
  EXPECT_TRUE(contains(st, "out-of-bounds access to arg 1")) << st.to_string();
  EXPECT_TRUE(contains(st, "kernel 'add'")) << st.to_string();
  EXPECT_EQ(dev->counters().kernel_faults, 1u);
  // The failed stream stays failed; later work on it is refused with the same error.
  Status again = dev->copy_to_device(bad_stream, dout, x.data(), 4);
  EXPECT_EQ(again.code(), StatusCode::kDeviceFault);
  EXPECT_TRUE(contains(again, "error state"));
  EXPECT_FALSE(dev->stream_query(bad_stream).ok());
  NPURT_ASSERT_OK(dev->destroy_stream(bad_stream));
  // Other streams, the same kernel with good arguments, and new streams all work.
  const auto dy = put(*dev, good_stream, random_floats(64, 5));
  NPURT_ASSERT_OK(dev->launch(good_stream, {code, 1, add_args(dx, dy, dout)}));
  NPURT_ASSERT_OK(dev->stream_synchronize(good_stream));
  auto fresh = dev->create_stream().value();
  const auto out = get<float>(*dev, fresh, dout, 64);
  const auto y = get<float>(*dev, fresh, dy, 64);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(out[i], x[i] + y[i]);
}

TEST(SimDevice, StreamsRunAsynchronouslyAndInOrder) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  const auto code = upload(*dev, busy_kernel().value());
  const auto out = put(*dev, s, std::vector<float>{0.f});
  // A held stream, a kernel, then a copy that reads its result: enqueue returns at
  // once, the stream is not done while held, and the copy sees the kernel's write
  // (FIFO order).
  StreamGate gate(*dev, s);
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, {KernelArg::scalar_i64(1000), KernelArg::scalar_f32(7.f),
                                            KernelArg::buffer(out, 4)}}));
  float host = -1.f;
  NPURT_ASSERT_OK(dev->copy_to_host(s, &host, out, 4));
  auto done = dev->stream_query(s);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done) << "a held stream cannot be done";
  EXPECT_EQ(host, -1.f) << "the copy ran before the kernel it follows";
  gate.open();
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  EXPECT_TRUE(dev->stream_query(s).value());
  EXPECT_EQ(host, 7.f);
}

TEST(SimDevice, EventsOrderTwoStreams) {
  auto dev = make_sim();
  auto producer = dev->create_stream().value();
  auto consumer = dev->create_stream().value();
  const auto code = upload(*dev, busy_kernel().value());
  const auto out = put(*dev, producer, std::vector<float>{0.f});
  auto ev = dev->create_event().value();

  auto run = [&](bool wait, float value) {
    float host = -1.f;
    StreamGate gate(*dev, producer);  // holds the producer before its kernel
    EXPECT_TRUE(dev->launch(producer, {code, 1, {KernelArg::scalar_i64(1000), KernelArg::scalar_f32(value),
                                                 KernelArg::buffer(out, 4)}}).ok());
    EXPECT_TRUE(dev->record_event(producer, ev).ok());
    if (wait) {
      EXPECT_TRUE(dev->wait_event(consumer, ev).ok());
    }
    EXPECT_TRUE(dev->copy_to_host(consumer, &host, out, 4).ok());
    if (wait) {
      EXPECT_FALSE(dev->stream_query(consumer).value()) << "the consumer waits for the held producer";
    } else {
      EXPECT_TRUE(dev->stream_synchronize(consumer).ok());  // done while the producer is held
    }
    gate.open();
    EXPECT_TRUE(dev->stream_synchronize(consumer).ok());
    EXPECT_TRUE(dev->event_synchronize(ev).ok());
    EXPECT_TRUE(dev->event_query(ev).value());
    return host;
  };
  // Without the event the consumer's copy overtakes the held kernel (this is what
  // the event is for); with it the copy sees the kernel's write.
  EXPECT_EQ(run(false, 1.f), 0.f);
  EXPECT_EQ(run(true, 2.f), 2.f);
}

TEST(SimDevice, EventQueryIsNonBlocking) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  const auto code = upload(*dev, busy_kernel().value());
  const auto out = put(*dev, s, std::vector<float>{0.f});
  auto ev = dev->create_event().value();
  EXPECT_TRUE(dev->event_query(ev).value()) << "a never-recorded event is complete";
  StreamGate gate(*dev, s);
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, {KernelArg::scalar_i64(1000), KernelArg::scalar_f32(1.f),
                                            KernelArg::buffer(out, 4)}}));
  NPURT_ASSERT_OK(dev->record_event(s, ev));
  EXPECT_FALSE(dev->event_query(ev).value());
  gate.open();
  NPURT_ASSERT_OK(dev->event_synchronize(ev));
  EXPECT_TRUE(dev->event_query(ev).value());
  NPURT_ASSERT_OK(dev->destroy_event(ev));
  EXPECT_EQ(dev->event_query(ev).status().code(), StatusCode::kNotFound);
}

// An event recorded behind a queued command rides on that command: it completes with
// it, with its error, and no later than the stream counts the command done.
TEST(SimDevice, AnEventRecordedBehindAQueuedCommandCompletesWithIt) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  auto ok_event = dev->create_event().value();
  auto failed_event = dev->create_event().value();
  for (int round = 0; round < 200; ++round) {
    StreamGate gate(*dev, s);
    NPURT_ASSERT_OK(dev->enqueue_host_function(s, [](const Status&) { return ok_status(); }));
    NPURT_ASSERT_OK(dev->record_event(s, ok_event));
    NPURT_ASSERT_OK(dev->enqueue_host_function(s, [](const Status&) { return internal_error("host work failed"); }));
    NPURT_ASSERT_OK(dev->record_event(s, failed_event));
    ASSERT_FALSE(dev->event_query(ok_event).value());
    ASSERT_FALSE(dev->event_query(failed_event).value());
    gate.open();
    ASSERT_TRUE(contains(dev->stream_synchronize(s), "host work failed"));
    // Queried right after the stream is done: both events are done as well.
    ASSERT_TRUE(dev->event_query(ok_event).value());
    const StatusOr<bool> failed = dev->event_query(failed_event);
    ASSERT_FALSE(failed.ok());
    ASSERT_TRUE(contains(failed.status(), "host work failed")) << failed.status().to_string();
    // The stream stays in error: a fresh one for the next round.
    NPURT_ASSERT_OK(dev->destroy_stream(s));
    s = dev->create_stream().value();
  }
}

TEST(SimDevice, EventAfterAFaultReportsTheFaultToWaiters) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  auto consumer = dev->create_stream().value();
  const auto code = upload(*dev, elementwise_kernel("add", isa::BinOp::kAdd).value());
  const auto small = dev->allocate(4).value();
  auto ev = dev->create_event().value();
  // The faulting launch waits until the event and the wait are enqueued: a stream
  // already in error would refuse the record itself.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  NPURT_ASSERT_OK(dev->enqueue_host_function(s, [released](const Status&) {
    released.wait();
    return ok_status();
  }));
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, add_args(small, small, small, 4)}));
  NPURT_ASSERT_OK(dev->record_event(s, ev));
  NPURT_ASSERT_OK(dev->wait_event(consumer, ev));
  release.set_value();
  EXPECT_EQ(dev->event_synchronize(ev).code(), StatusCode::kDeviceFault);
  Status st = dev->stream_synchronize(consumer);
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << "a waiter must not run on a failed producer's data";
  EXPECT_TRUE(contains(st, "producer failed"));
}

TEST(SimDevice, StreamCountersCountCreatesAndDestroys) {
  auto dev = make_sim();
  for (int i = 0; i < 5; ++i) NPURT_ASSERT_OK(dev->destroy_stream(dev->create_stream().value()));
  EXPECT_EQ(dev->counters().streams_created, 5u);
  EXPECT_EQ(dev->counters().streams_destroyed, 5u);
  EXPECT_EQ(dev->destroy_stream(npurt::hal::StreamId(12345)).code(), StatusCode::kNotFound);
}

TEST(SimDevice, BarrierOrdersBlocksWithinOneLaunch) {
  using namespace isa;
  // Block i writes i+1 to slot i; after the barrier block i reads slot (i+1) % n.
  // Without the barrier the read could precede the neighbour's write.
  KernelBuilder b("rotate");
  const uint8_t buf = b.arg_buffer("buf", Access::kInOut, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg bid{0}, cnt{1}, off{2}, v{3}, nxt{4};
  const Tile t{0};
  b.block_id(bid);
  b.block_count(cnt);
  b.tdef(t, DType::kF32, 1, 1);
  b.alui(AluOp::kAdd, v, bid, 1);
  b.i2f(v, v);
  b.tfill(t, v);
  b.alui(AluOp::kMul, off, bid, 4);
  b.tst(t, buf, off, DType::kF32);
  b.barrier();
  b.alui(AluOp::kAdd, nxt, bid, 1);
  b.alu(AluOp::kRem, nxt, nxt, cnt);
  b.alui(AluOp::kMul, nxt, nxt, 4);
  b.tld(t, buf, nxt, DType::kF32);
  b.tst(t, out, off, DType::kF32);
  auto image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  ASSERT_TRUE(image->uses_barrier());

  auto dev = make_sim();
  auto s = dev->create_stream().value();
  const auto code = upload(*dev, *image);
  const auto dbuf = put(*dev, s, std::vector<float>(8, 0.f));
  const auto dout = put(*dev, s, std::vector<float>(8, -1.f));
  NPURT_ASSERT_OK(dev->launch(s, {code, 8, {KernelArg::buffer(dbuf, 32), KernelArg::buffer(dout, 32)}}));
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  const auto r = get<float>(*dev, s, dout, 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(r[i], static_cast<float>((i + 1) % 8 + 1)) << i;

  // A barrier kernel needs all of its blocks resident at once.
  NPURT_ASSERT_OK(dev->launch(s, {code, 9, {KernelArg::buffer(dbuf, 32), KernelArg::buffer(dout, 32)}}));
  EXPECT_TRUE(contains(dev->stream_synchronize(s), "grid barrier"));
}

// Block 0 alone runs a barrier (inside a loop only it enters), then every block runs
// a second one: block 0 waits at the first while the others wait at the second, so
// a grid barrier pairs two different places. The sanitizer names it; without it the
// launch runs (arrivals are counted, not places) and the device stays usable.
TEST(SimDevice, SanitizerReportsBlocksWaitingAtDifferentBarriers) {
  using namespace isa;
  KernelBuilder b("split_barrier");
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg bid{0}, only0{1}, off{2};
  const Tile t{0};
  b.block_id(bid);
  b.li(only0, 1);
  b.alu(AluOp::kSub, only0, only0, bid);
  b.alui(AluOp::kMax, only0, only0, 0);  // 1 on block 0, else 0
  b.loop_begin(only0);
  b.barrier();
  b.loop_end();
  b.barrier();
  b.tdef(t, DType::kF32, 1, 1);
  b.i2f(bid, bid);
  b.tfill(t, bid);
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, 4);
  b.tst(t, out, off, DType::kF32);
  auto image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  for (const bool sanitize : {true, false}) {
    hal::SimOptions o;
    o.sanitize = sanitize;
    auto dev = make_sim(o);
    auto s = dev->create_stream().value();
    const auto code = upload(*dev, *image);
    const auto dout = put(*dev, s, std::vector<float>(4, -1.f));
    NPURT_ASSERT_OK(dev->launch(s, {code, 4, {KernelArg::buffer(dout, 16)}}));
    const Status st = dev->stream_synchronize(s);
    if (!sanitize) {
      NPURT_ASSERT_OK(st);
      continue;
    }
    EXPECT_EQ(st.code(), StatusCode::kHazard) << st.to_string();
    EXPECT_TRUE(contains(st, "blocks wait at different barriers")) << st.to_string();
    EXPECT_TRUE(contains(st, "kernel 'split_barrier'")) << st.to_string();
    auto s2 = dev->create_stream().value();
    const auto add = upload(*dev, elementwise_kernel("add", isa::BinOp::kAdd).value());
    const auto dx = put(*dev, s2, random_floats(64, 7)), dy = put(*dev, s2, random_floats(64, 8));
    NPURT_ASSERT_OK(dev->launch(s2, {add, 1, add_args(dx, dy, dev->allocate(256).value())}));
    NPURT_ASSERT_OK(dev->stream_synchronize(s2));
  }
}

TEST(SimDevice, SanitizerReportsReadsOfNeverWrittenMemory) {
  hal::SimOptions o;
  o.sanitize = true;
  auto dev = make_sim(o);
  auto s = dev->create_stream().value();
  const auto code = upload(*dev, elementwise_kernel("add", isa::BinOp::kAdd).value());
  const auto dx = put(*dev, s, random_floats(64, 6));
  const auto dy = dev->allocate(256).value();  // never written
  const auto dout = dev->allocate(256).value();
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, add_args(dx, dy, dout)}));
  Status st = dev->stream_synchronize(s);
  EXPECT_EQ(st.code(), StatusCode::kHazard);
  EXPECT_TRUE(contains(st, "read of never-written global memory")) << st.to_string();
  EXPECT_TRUE(contains(st, "kernel 'add'"));
  EXPECT_EQ(dev->counters().hazard_uninit_read, 1u);

  // Written, it is fine; freed and reallocated, it is garbage again.
  auto s2 = dev->create_stream().value();
  const std::vector<float> y = random_floats(64, 7);
  NPURT_ASSERT_OK(dev->copy_to_device(s2, dy, y.data(), 256));
  NPURT_ASSERT_OK(dev->launch(s2, {code, 1, add_args(dx, dy, dout)}));
  NPURT_ASSERT_OK(dev->stream_synchronize(s2));
  NPURT_ASSERT_OK(dev->free(dy));
  const auto again = dev->allocate(256).value();
  ASSERT_EQ(again, dy);
  NPURT_ASSERT_OK(dev->launch(s2, {code, 1, add_args(dx, again, dout)}));
  EXPECT_EQ(dev->stream_synchronize(s2).code(), StatusCode::kHazard);
}

// A thread blocked in stream_synchronize runs the stream's queued host work itself
// when the stream's thread is idle: no hand-off there and back. Whether the waiter or
// the stream's thread takes a command is a race, which an idle, sleeping stream
// thread loses to a waiter already running; so this looks for it over many tries.
TEST(SimDevice, SynchronizeRunsQueuedHostWorkOnTheWaitingThread) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  int on_waiter = 0, ran = 0;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the stream's thread goes to sleep
    std::thread::id where;
    NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&](const Status&) {
      where = std::this_thread::get_id();
      ++ran;
      return ok_status();
    }));
    NPURT_ASSERT_OK(dev->stream_synchronize(s));
    if (where == std::this_thread::get_id()) ++on_waiter;
  }
  EXPECT_EQ(ran, 40) << "every host function runs once";
  EXPECT_GE(on_waiter, 1) << "no host function ran on the waiting thread";
}

// Returns whether the second of two host functions ran only after the first ended,
// when a waiter's thread calls stream_synchronize while the first (on the stream's
// thread) is still running.
bool second_waits_for_first(hal::Device& dev, hal::StreamId s) {
  std::atomic<bool> first_started{false}, first_done{false}, second_ran{false}, second_saw_first_done{false};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  EXPECT_TRUE(dev.enqueue_host_function(s, [&, released](const Status&) {
                   first_started = true;
                   released.wait();
                   first_done = true;
                   return ok_status();
                 }).ok());
  while (!first_started) std::this_thread::yield();  // the stream's thread runs it
  EXPECT_TRUE(dev.enqueue_host_function(s, [&](const Status&) {
                   second_saw_first_done = first_done.load();
                   second_ran = true;
                   return ok_status();
                 }).ok());
  std::thread waiter([&] { EXPECT_TRUE(dev.stream_synchronize(s).ok()); });
  // Give the waiter time to take the second function if it may (it must not).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!second_ran && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  release.set_value();
  waiter.join();
  EXPECT_TRUE(second_ran);
  return second_saw_first_done;
}

TEST(SimDevice, WaitersRunQueuedWorkInStreamOrder) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  EXPECT_TRUE(second_waits_for_first(*dev, s));
  // The check fails when the waiter ignores what is still executing.
  ScopedHazard naive(Hazard::kWaitersIgnoreStreamOrder);
  EXPECT_FALSE(second_waits_for_first(*dev, s));
}

// A thread lent to a stream runs its next command here, once, only when `wanted`
// holds, and never while another of the stream's commands executes.
TEST(SimDevice, ALentThreadRunsOnlyWhatTheStreamOrderAllows) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  auto yes = [](uint64_t) { return true; };
  EXPECT_EQ(dev->stream_position(s).value(), 0u) << "a fresh stream has been given nothing";
  auto empty = dev->run_next_command(s, yes);
  ASSERT_TRUE(empty.ok()) << empty.status().to_string();
  EXPECT_FALSE(*empty) << "an empty stream has nothing to run";
  EXPECT_FALSE(dev->run_next_command(hal::StreamId(987654), yes).ok()) << "an unknown stream is an error";

  // Held: the stream's thread executes the first host function; the second must wait.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first_started{false}, second_ran{false};
  NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&, released](const Status&) {
    first_started = true;
    released.wait();
    return ok_status();
  }));
  while (!first_started) std::this_thread::yield();
  std::thread::id where;
  NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&](const Status&) {
    where = std::this_thread::get_id();
    second_ran = true;
    return ok_status();
  }));
  auto behind = dev->run_next_command(s, yes);
  ASSERT_TRUE(behind.ok());
  EXPECT_FALSE(*behind) << "ran a command while an earlier one executed";
  EXPECT_FALSE(second_ran);
  release.set_value();
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  EXPECT_TRUE(second_ran);
  EXPECT_EQ(dev->stream_position(s).value(), 2u) << "two commands given";

  // Queued behind nothing: `wanted` decides, told the command's position, and a
  // command the lent thread took ran there. The stream's thread, asleep after a
  // pause, usually wakes later than this thread asks.
  int on_lent = 0;
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    int runs = 0;
    const uint64_t position = dev->stream_position(s).value();
    NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&](const Status&) {
      where = std::this_thread::get_id();
      ++runs;
      return ok_status();
    }));
    std::vector<uint64_t> asked;
    auto refused = dev->run_next_command(s, [&](uint64_t at) {
      asked.push_back(at);
      return false;
    });
    ASSERT_TRUE(refused.ok());
    EXPECT_FALSE(*refused) << "ran a command nobody wanted";
    for (uint64_t at : asked) EXPECT_EQ(at, position) << "the next command's position";
    auto ran = dev->run_next_command(s, yes);
    ASSERT_TRUE(ran.ok());
    NPURT_ASSERT_OK(dev->stream_synchronize(s));
    EXPECT_EQ(runs, 1);
    if (!*ran) continue;
    EXPECT_EQ(where, std::this_thread::get_id()) << "a command it took ran elsewhere";
    ++on_lent;
  }
  EXPECT_GE(on_lent, 1) << "the lent thread never ran a command";
}

// The check above fails when lent threads ignore what is executing.
TEST(SimDevice, ALentThreadThatIgnoresTheStreamOrderIsCaught) {
  auto dev = make_sim();
  auto s = dev->create_stream().value();
  ScopedHazard naive(Hazard::kWaitersIgnoreStreamOrder);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first_started{false}, first_done{false}, second_saw_first_done{true};
  NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&, released](const Status&) {
    first_started = true;
    released.wait();
    first_done = true;
    return ok_status();
  }));
  while (!first_started) std::this_thread::yield();
  NPURT_ASSERT_OK(dev->enqueue_host_function(s, [&](const Status&) {
    second_saw_first_done = first_done.load();
    return ok_status();
  }));
  auto ran = dev->run_next_command(s, [](uint64_t) { return true; });
  release.set_value();
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  ASSERT_TRUE(ran.ok());
  EXPECT_TRUE(*ran);
  EXPECT_FALSE(second_saw_first_done);
}

}  // namespace
}  // namespace npurt
