// Owning handles: each gives its object back when it goes, keeps its device alive
// meanwhile, and moves without giving anything back twice.
#include "npurt/hal/handles.h"

#include <gtest/gtest.h>

#include <utility>

#include "hal/sim_test_util.h"

namespace npurt::hal {
namespace {

TEST(Handles, GiveTheirObjectsBackWhenTheyGo) {
  std::shared_ptr<Device> dev = npurt::testing::make_sim();
  const Counters before = dev->counters();
  DeviceAddr addr{};
  EventId event_id{};
  StreamId stream_id{};
  {
    DeviceBlock block = DeviceBlock::allocate(dev, 4096).value();
    Stream stream = Stream::create(dev).value();
    Event event = Event::create(dev).value();
    addr = block.addr();
    event_id = event.id();
    stream_id = stream.id();
    EXPECT_TRUE(addr);
    EXPECT_EQ(block.bytes(), 4096u);
    NPURT_ASSERT_OK(dev->record_event(stream.id(), event.id()));
    NPURT_ASSERT_OK(dev->event_synchronize(event.id()));
  }
  const Counters d = dev->counters() - before;
  EXPECT_EQ(d.streams_created, 1u);
  EXPECT_EQ(d.streams_destroyed, 1u);
  // The block was freed: the allocator hands the same address out again.
  DeviceBlock again = DeviceBlock::allocate(dev, 4096).value();
  EXPECT_EQ(again.addr(), addr);
  EXPECT_FALSE(dev->event_query(event_id).ok()) << "the event was destroyed";
  EXPECT_FALSE(dev->stream_query(stream_id).ok()) << "the stream was destroyed";
}

TEST(Handles, KeepTheDeviceAliveAndMoveOnce) {
  std::weak_ptr<Device> watch;
  DeviceBlock block;
  Stream stream;
  {
    std::shared_ptr<Device> dev = npurt::testing::make_sim();
    watch = dev;
    block = DeviceBlock::allocate(dev, 256).value();
    stream = Stream::create(dev).value();
  }
  ASSERT_FALSE(watch.expired()) << "the handles keep the device";
  Stream moved = std::move(stream);
  EXPECT_FALSE(stream.valid());
  EXPECT_TRUE(moved.valid());
  NPURT_ASSERT_OK(moved.release());
  EXPECT_FALSE(moved.valid());
  NPURT_ASSERT_OK(moved.release());  // empty: nothing to give back
  EXPECT_FALSE(watch.expired()) << "the block still holds it";
  block = DeviceBlock();
  EXPECT_TRUE(watch.expired()) << "the last handle went";
}

TEST(Handles, AFailedCreationIsTheDevicesError) {
  std::shared_ptr<Device> dev = npurt::testing::make_sim();
  StatusOr<DeviceBlock> huge = DeviceBlock::allocate(dev, 1ull << 40);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().to_string();
}

}  // namespace
}  // namespace npurt::hal
