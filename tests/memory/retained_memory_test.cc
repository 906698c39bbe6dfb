// Device memory someone outside the context may still write (an MPI request that
// timed out): retain_until_exit keeps its block allocated through free() and close(),
// and the device gives host code its bytes where memory is host-addressable.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "hal/sim_test_util.h"
#include "memory/memory_test_util.h"
#include "npurt/memory/memory_context.h"

namespace npurt::testing {
namespace {

// A buffer freed after retain_until_exit leaves its block alone: the next buffer of
// the same size gets other memory, and bytes written into the kept block later (as a
// late MPI write would) never reach it. Without the retain, the block is reused.
uint64_t next_buffer_lands_on_the_freed_block(bool retain) {
  MemoryRig rig;
  Buffer a = rig.buffer(4096, "a");
  const hal::DeviceAddr kept = a.device_address();
  if (retain) {
    EXPECT_TRUE(rig.ctx->retain_until_exit(a.view()).ok());
  }
  EXPECT_TRUE(a.free().ok());
  Buffer b = rig.buffer(4096, "b");
  return b.device_address() == kept ? 1 : 0;
}

TEST(RetainUntilExit, AFreedBuffersBlockIsNeverReused) {
  EXPECT_EQ(next_buffer_lands_on_the_freed_block(/*retain=*/false), 1u) << "the allocator reuses a freed block";
  EXPECT_EQ(next_buffer_lands_on_the_freed_block(/*retain=*/true), 0u);
}

TEST(RetainUntilExit, TheKeptBlockOutlivesFreeAndCloseAndIsCounted) {
  MemoryRig rig;
  Buffer a = rig.buffer(8192, "a");
  NPURT_ASSERT_OK(rig.ctx->retain_until_exit(a.view()));
  NPURT_ASSERT_OK(rig.ctx->retain_until_exit(a.view()));  // once is enough; counted once
  EXPECT_EQ(rig.ctx->stats().retained_bytes, 8192u);
  const hal::DeviceAddr kept = a.device_address();
  NPURT_ASSERT_OK(a.free());
  rig.ctx->close();
  // Still a live allocation of the device: host code may write it.
  StatusOr<uint8_t*> p = rig.device->host_address(kept, 8192, /*writes=*/true);
  NPURT_ASSERT_OK(p.status());
  std::memset(*p, 0x5A, 8192);
}

TEST(HostAddress, GivesTheDeviceBytesInsideOneLiveAllocationOnly) {
  MemoryRig rig;
  ASSERT_TRUE(rig.device->info().host_addressable_memory);
  Buffer a = rig.buffer(4096, "a");
  const std::vector<float> data = random_floats(1024, 3);
  write_floats(*rig.ctx, a.view(), data);
  NPURT_ASSERT_OK(rig.ctx->to_device(a.view()));
  StatusOr<uint8_t*> p = rig.device->host_address(a.device_address(), 4096, /*writes=*/false);
  NPURT_ASSERT_OK(p.status());
  std::vector<float> seen(1024);
  std::memcpy(seen.data(), *p, 4096);
  EXPECT_EQ(seen, data);
  StatusOr<uint8_t*> past = rig.device->host_address(a.device_address(), 4097, false);
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange) << past.status().to_string();
  StatusOr<uint8_t*> nowhere = rig.device->host_address(hal::DeviceAddr(0x10), 4, false);
  EXPECT_EQ(nowhere.status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace npurt::testing
