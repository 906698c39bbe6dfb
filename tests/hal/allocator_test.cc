#include "hal/sim/allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace npurt::sim {
namespace {

constexpr uint64_t kBase = 0x10000;

TEST(GmAllocator, FreedBlockOfSameSizeIsRecycledAtTheSameAddress) {
  GmAllocator a(kBase, 1 << 20);
  const uint64_t x = a.allocate(1000, 256).value();
  const uint64_t y = a.allocate(5000, 256).value();  // keeps x from merging with the tail
  ASSERT_TRUE(a.free(x).ok());
  EXPECT_EQ(a.allocate(900, 256).value(), x) << "best fit must reuse the freed block";
  (void)y;
}

TEST(GmAllocator, BestFitPrefersTheSmallestBlockThatFits) {
  GmAllocator a(kBase, 1 << 20);
  const uint64_t big = a.allocate(4096, 256).value();
  a.allocate(256, 256).value();  // separator
  const uint64_t small = a.allocate(1024, 256).value();
  a.allocate(256, 256).value();  // separator
  ASSERT_TRUE(a.free(big).ok());
  ASSERT_TRUE(a.free(small).ok());
  EXPECT_EQ(a.allocate(1000, 256).value(), small);
  EXPECT_EQ(a.allocate(3000, 256).value(), big);
}

TEST(GmAllocator, MostRecentlyFreedWinsAmongEqualSizes) {
  GmAllocator a(kBase, 1 << 20);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(a.allocate(512, 256).value());
  // Free 1 and 3 (not adjacent, so no coalescing); 3 is the most recent.
  ASSERT_TRUE(a.free(blocks[1]).ok());
  ASSERT_TRUE(a.free(blocks[3]).ok());
  EXPECT_EQ(a.allocate(512, 256).value(), blocks[3]);
  EXPECT_EQ(a.allocate(512, 256).value(), blocks[1]);
}

TEST(GmAllocator, CoalescesNeighboursBackIntoOneBlock) {
  GmAllocator a(kBase, 1 << 20);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(a.allocate(4096, 256).value());
  for (uint64_t b : blocks) ASSERT_TRUE(a.free(b).ok());
  EXPECT_EQ(a.free_block_count(), 1u);
  EXPECT_EQ(a.bytes_in_use(), 0u);
  EXPECT_EQ(a.allocate(1 << 20, 256).value(), kBase) << "the whole space must be one block again";
}

TEST(GmAllocator, HonoursAlignment) {
  GmAllocator a(kBase, 1 << 20);
  a.allocate(256, 256).value();
  const uint64_t x = a.allocate(100, 4096).value();
  EXPECT_EQ(x % 4096, 0u);
  // The padding before x is still usable.
  EXPECT_LT(a.allocate(256, 256).value(), x);
}

TEST(GmAllocator, RejectsBadRequestsWithClearErrors) {
  GmAllocator a(kBase, 1 << 20);
  EXPECT_EQ(a.allocate(0, 256).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.allocate(16, 3).status().code(), StatusCode::kInvalidArgument);
  auto huge = a.allocate(2 << 20, 256);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("exceeds global memory"), std::string::npos);
  Status s = a.free(kBase + 12345);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("not a live device allocation"), std::string::npos);
  const uint64_t x = a.allocate(256, 256).value();
  ASSERT_TRUE(a.free(x).ok());
  EXPECT_EQ(a.free(x).code(), StatusCode::kNotFound) << "double free must be refused";
}

TEST(GmAllocator, LiveBlockLookupUsesRequestedBytes) {
  GmAllocator a(kBase, 1 << 20);
  const uint64_t x = a.allocate(100, 256).value();
  EXPECT_TRUE(a.live_block_containing(x, 100).has_value());
  EXPECT_TRUE(a.live_block_containing(x + 50, 50).has_value());
  EXPECT_FALSE(a.live_block_containing(x + 50, 51).has_value()) << "past the requested end";
  EXPECT_FALSE(a.live_block_containing(x - 1, 1).has_value());
}

TEST(GmAllocator, IsDeterministicAndNeverOverlaps) {
  auto run = [] {
    GmAllocator a(kBase, 8 << 20);
    std::mt19937 rng(7);
    std::vector<std::pair<uint64_t, uint64_t>> live;
    std::vector<uint64_t> trace;
    for (int step = 0; step < 4000; ++step) {
      if (!live.empty() && rng() % 3 == 0) {
        const size_t i = rng() % live.size();
        EXPECT_TRUE(a.free(live[i].first).ok());
        live.erase(live.begin() + static_cast<long>(i));
        continue;
      }
      const uint64_t n = 1 + rng() % 20000;
      auto r = a.allocate(n, uint64_t{1} << (rng() % 13));
      if (!r.ok()) continue;
      for (auto [addr, len] : live) EXPECT_TRUE(*r + n <= addr || addr + len <= *r) << "overlap";
      live.emplace_back(*r, n);
      trace.push_back(*r);
    }
    return trace;
  };
  EXPECT_EQ(run(), run());
}

}  // namespace
}  // namespace npurt::sim
