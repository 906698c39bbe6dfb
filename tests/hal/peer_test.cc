// The stream commands of several devices: copies into a peer's memory, waits on a
// peer's events, and host functions in stream order.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <numeric>
#include <vector>

#include "hal/sim_test_util.h"
#include "npurt/hal/handles.h"

namespace npurt::hal {
namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), seed);
  return v;
}

std::vector<uint8_t> read_back(Device& d, StreamId s, DeviceAddr addr, size_t n) {
  std::vector<uint8_t> out(n, 0xee);
  EXPECT_TRUE(d.copy_to_host(s, out.data(), addr, n).ok());
  EXPECT_TRUE(d.stream_synchronize(s).ok());
  return out;
}

TEST(Peers, CopyToPeerMovesExactlyTheBytesAndCountsThem) {
  auto a = npurt::testing::make_sim(), b = npurt::testing::make_sim();
  EXPECT_TRUE(a->can_access_peer(*b));
  DeviceBlock src = DeviceBlock::allocate(a, 8192).value(), dst = DeviceBlock::allocate(b, 8192).value();
  Stream sa = Stream::create(a).value(), sb = Stream::create(b).value();
  const std::vector<uint8_t> bytes = pattern(8192, 3), poison(8192, 0xab);
  NPURT_ASSERT_OK(a->copy_to_device(sa.id(), src.addr(), bytes.data(), bytes.size()));
  NPURT_ASSERT_OK(b->copy_to_device(sb.id(), dst.addr(), poison.data(), poison.size()));
  NPURT_ASSERT_OK(b->stream_synchronize(sb.id()));
  const Counters before = a->counters();
  NPURT_ASSERT_OK(a->copy_to_peer(sa.id(), b, dst.addr() + 100, src.addr() + 200, 5000));
  NPURT_ASSERT_OK(a->stream_synchronize(sa.id()));
  const std::vector<uint8_t> got = read_back(*b, sb.id(), dst.addr(), 8192);
  std::vector<uint8_t> want = poison;
  std::memcpy(want.data() + 100, bytes.data() + 200, 5000);
  EXPECT_EQ(got, want);
  const Counters d = a->counters() - before;
  EXPECT_EQ(d.peer_transfers, 1u);
  EXPECT_EQ(d.peer_bytes, 5000u);
}

TEST(Peers, BadPeerRangesAreRefusedAndNothingIsEnqueued) {
  auto a = npurt::testing::make_sim(), b = npurt::testing::make_sim();
  DeviceBlock src = DeviceBlock::allocate(a, 4096).value(), dst = DeviceBlock::allocate(b, 4096).value();
  Stream sa = Stream::create(a).value();
  const Status past = a->copy_to_peer(sa.id(), b, dst.addr() + 1, src.addr(), 4096);
  EXPECT_EQ(past.code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.message().find("copy_to_peer destination (on the peer)"), std::string::npos) << past.to_string();
  // An address of the peer's is not one of this device's.
  const Status wrong_side = a->copy_to_peer(sa.id(), b, dst.addr(), dst.addr() + 8192, 16);
  EXPECT_EQ(wrong_side.code(), StatusCode::kOutOfRange) << wrong_side.to_string();
  EXPECT_EQ(a->counters().peer_transfers, 0u);
  EXPECT_TRUE(a->stream_synchronize(sa.id()).ok());
}

// Device b's copy out of its buffer waits for device a's event, recorded after a's
// copy into it: b reads a's bytes, not the poison.
TEST(Peers, AStreamWaitsForAPeersEvent) {
  auto a = npurt::testing::make_sim(), b = npurt::testing::make_sim();
  DeviceBlock on_b = DeviceBlock::allocate(b, 4096).value(), staged = DeviceBlock::allocate(a, 4096).value();
  Stream sa = Stream::create(a).value(), sb = Stream::create(b).value();
  Event done = Event::create(a).value();
  const std::vector<uint8_t> bytes = pattern(4096, 9), poison(4096, 0x5a);
  NPURT_ASSERT_OK(b->copy_to_device(sb.id(), on_b.addr(), poison.data(), poison.size()));
  NPURT_ASSERT_OK(b->stream_synchronize(sb.id()));
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  NPURT_ASSERT_OK(a->enqueue_host_function(sa.id(), [go](const Status&) {
    go.wait();  // a's stream is held until the waits are all enqueued
    return ok_status();
  }));
  NPURT_ASSERT_OK(a->copy_to_device(sa.id(), staged.addr(), bytes.data(), bytes.size()));
  NPURT_ASSERT_OK(a->copy_to_peer(sa.id(), b, on_b.addr(), staged.addr(), bytes.size()));
  NPURT_ASSERT_OK(a->record_event(sa.id(), done.id()));
  NPURT_ASSERT_OK(b->wait_peer_event(sb.id(), *a, done.id()));
  std::vector<uint8_t> got(4096, 0);
  NPURT_ASSERT_OK(b->copy_to_host(sb.id(), got.data(), on_b.addr(), got.size()));
  EXPECT_FALSE(*b->stream_query(sb.id())) << "b ran ahead of a's event";
  release.set_value();
  NPURT_ASSERT_OK(b->stream_synchronize(sb.id()));
  EXPECT_EQ(got, bytes);
}

TEST(Peers, AWaitOnAFailedPeerFailsTheStream) {
  auto a = npurt::testing::make_sim(), b = npurt::testing::make_sim();
  Stream sa = Stream::create(a).value(), sb = Stream::create(b).value();
  Event e = Event::create(a).value();
  // The failure waits until the event and the wait are enqueued: a stream already in
  // error would refuse the record itself.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  NPURT_ASSERT_OK(a->enqueue_host_function(sa.id(), [released](const Status&) {
    released.wait();
    return device_fault("injected");
  }));
  NPURT_ASSERT_OK(a->record_event(sa.id(), e.id()));
  NPURT_ASSERT_OK(b->wait_peer_event(sb.id(), *a, e.id()));
  release.set_value();
  const Status s = b->stream_synchronize(sb.id());
  EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << s.to_string();
  EXPECT_NE(s.message().find("injected"), std::string::npos) << s.to_string();
}

TEST(HostFunctions, RunInStreamOrderAndAreToldOfEarlierFailures) {
  auto a = npurt::testing::make_sim();
  Stream s = Stream::create(a).value();
  DeviceBlock block = DeviceBlock::allocate(a, 64).value();
  std::vector<int> order;
  const std::vector<uint8_t> bytes = pattern(64, 1);
  std::vector<uint8_t> seen(64, 0);
  NPURT_ASSERT_OK(a->copy_to_device(s.id(), block.addr(), bytes.data(), bytes.size()));
  NPURT_ASSERT_OK(a->enqueue_host_function(s.id(), [&](const Status&) {
    order.push_back(1);
    return ok_status();
  }));
  NPURT_ASSERT_OK(a->copy_to_host(s.id(), seen.data(), block.addr(), seen.size()));
  NPURT_ASSERT_OK(a->enqueue_host_function(s.id(), [&](const Status&) {
    order.push_back(seen == bytes ? 2 : -2);  // the copy before it has completed
    return device_fault("host work failed");
  }));
  Status told;
  NPURT_ASSERT_OK(a->enqueue_host_function(s.id(), [&](const Status& earlier) {
    told = earlier;
    order.push_back(3);
    return ok_status();
  }));
  const Status st = a->stream_synchronize(s.id());
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault);
  EXPECT_NE(st.message().find("host function: host work failed"), std::string::npos) << st.to_string();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(told.code(), StatusCode::kDeviceFault) << "the third was not told of the failure";
  EXPECT_EQ(a->counters().host_functions, 2u) << "a function told of a failure does not run as work";
  EXPECT_FALSE(a->enqueue_host_function(s.id(), {}).ok());
}

}  // namespace
}  // namespace npurt::hal
