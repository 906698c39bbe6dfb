#include "npurt/memory/coherence_map.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <tuple>
#include <vector>

// Counts heap allocations made by the current thread while counting is on, so
// tests can check that the uniform fast path allocates nothing.
namespace {
thread_local bool t_counting_allocations = false;
thread_local size_t t_allocations = 0;
}  // namespace

// The replacements pair operator new with free(); GCC flags that pairing once it
// inlines them into callers, although it is exactly what a replacement may do.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (t_counting_allocations) ++t_allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace npurt {
namespace {

using State = CoherenceState;
using Piece = std::tuple<uint64_t, uint64_t, State>;

class AllocationCounter {
 public:
  AllocationCounter() {
    t_allocations = 0;
    t_counting_allocations = true;
  }
  ~AllocationCounter() { t_counting_allocations = false; }
  size_t count() const { return t_allocations; }
};

std::vector<Piece> pieces(const CoherenceMap& map, uint64_t begin, uint64_t end) {
  std::vector<Piece> out;
  map.for_each_in(begin, end, [&](uint64_t b, uint64_t e, State s) { out.emplace_back(b, e, s); });
  return out;
}

TEST(CoherenceMap, StartsUniformUninitialized) {
  CoherenceMap map(100);
  State s = State::kBothValid;
  EXPECT_TRUE(map.is_uniform(&s));
  EXPECT_EQ(s, State::kUninitialized);
  EXPECT_EQ(map.segment_count(), 1u);
  EXPECT_EQ(map.state_at(0), State::kUninitialized);
  EXPECT_EQ(map.state_at(99), State::kUninitialized);
}

TEST(CoherenceMap, SetInTheMiddleSplitsIntoThree) {
  CoherenceMap map(100);
  map.set(10, 20, State::kHostNewer);
  EXPECT_FALSE(map.is_uniform());
  EXPECT_EQ(map.segment_count(), 3u);
  EXPECT_EQ(map.state_at(9), State::kUninitialized);
  EXPECT_EQ(map.state_at(10), State::kHostNewer);
  EXPECT_EQ(map.state_at(19), State::kHostNewer);
  EXPECT_EQ(map.state_at(20), State::kUninitialized);
  EXPECT_EQ(pieces(map, 0, 100), (std::vector<Piece>{{0, 10, State::kUninitialized},
                                                     {10, 20, State::kHostNewer},
                                                     {20, 100, State::kUninitialized}}));
}

TEST(CoherenceMap, SetAtEitherEndSplitsIntoTwo) {
  CoherenceMap map(100);
  map.set(0, 30, State::kDeviceNewer);
  EXPECT_EQ(map.segment_count(), 2u);
  map.set(70, 100, State::kHostNewer);
  EXPECT_EQ(pieces(map, 0, 100), (std::vector<Piece>{{0, 30, State::kDeviceNewer},
                                                     {30, 70, State::kUninitialized},
                                                     {70, 100, State::kHostNewer}}));
}

TEST(CoherenceMap, AdjacentEqualRangesCoalesce) {
  CoherenceMap map(100);
  map.set(10, 20, State::kHostNewer);
  map.set(20, 30, State::kHostNewer);  // touches on the right
  map.set(5, 10, State::kHostNewer);   // touches on the left
  EXPECT_EQ(map.segment_count(), 3u);
  EXPECT_EQ(pieces(map, 0, 100), (std::vector<Piece>{{0, 5, State::kUninitialized},
                                                     {5, 30, State::kHostNewer},
                                                     {30, 100, State::kUninitialized}}));
}

TEST(CoherenceMap, FillingTheGapMergesBothNeighbours) {
  CoherenceMap map(100);
  map.set(0, 40, State::kBothValid);
  map.set(60, 100, State::kBothValid);
  EXPECT_EQ(map.segment_count(), 3u);
  map.set(40, 60, State::kBothValid);
  State s;
  EXPECT_TRUE(map.is_uniform(&s));
  EXPECT_EQ(s, State::kBothValid);
  EXPECT_EQ(map.segment_count(), 1u);
}

TEST(CoherenceMap, OverwriteAcrossManySegments) {
  CoherenceMap map(100);
  for (uint64_t b = 0; b < 100; b += 10) {
    map.set(b, b + 5, b % 20 == 0 ? State::kHostNewer : State::kDeviceNewer);
  }
  EXPECT_EQ(map.segment_count(), 20u);
  map.set(3, 97, State::kBothValid);
  EXPECT_EQ(pieces(map, 0, 100), (std::vector<Piece>{{0, 3, State::kHostNewer},
                                                     {3, 97, State::kBothValid},
                                                     {97, 100, State::kUninitialized}}));
}

TEST(CoherenceMap, SettingTheSameStateIsANoOp) {
  CoherenceMap map(100);
  map.set(10, 20, State::kHostNewer);
  map.set(12, 18, State::kHostNewer);
  map.set(30, 40, State::kUninitialized);
  EXPECT_EQ(map.segment_count(), 3u);
  map.set(50, 50, State::kDeviceNewer);  // empty range
  EXPECT_EQ(map.segment_count(), 3u);
}

TEST(CoherenceMap, ForEachInClipsToTheRange) {
  CoherenceMap map(100);
  map.set(10, 20, State::kHostNewer);
  map.set(20, 30, State::kDeviceNewer);
  EXPECT_EQ(pieces(map, 15, 25),
            (std::vector<Piece>{{15, 20, State::kHostNewer}, {20, 25, State::kDeviceNewer}}));
  EXPECT_EQ(pieces(map, 12, 13), (std::vector<Piece>{{12, 13, State::kHostNewer}}));
  EXPECT_EQ(pieces(map, 30, 100), (std::vector<Piece>{{30, 100, State::kUninitialized}}));
  EXPECT_TRUE(pieces(map, 40, 40).empty());

  CoherenceMap uniform(100);
  EXPECT_EQ(pieces(uniform, 7, 9), (std::vector<Piece>{{7, 9, State::kUninitialized}}));
}

TEST(CoherenceMap, UploadTakesHostNewerOnlyNeverUninitialized) {
  CoherenceMap map(100);
  map.host_written(10, 20);
  map.host_written(40, 50);
  map.device_written(60, 70);
  EXPECT_EQ(map.ranges_to_upload(0, 100), (std::vector<ByteRange>{{10, 20}, {40, 50}}));
  EXPECT_EQ(map.ranges_to_upload(15, 45), (std::vector<ByteRange>{{15, 20}, {40, 45}}));
  EXPECT_TRUE(map.ranges_to_upload(20, 40).empty());
  EXPECT_EQ(map.ranges_to_download(0, 100), (std::vector<ByteRange>{{60, 70}}));
  EXPECT_EQ(map.ranges_to_download(65, 100), (std::vector<ByteRange>{{65, 70}}));
}

TEST(CoherenceMap, MarkSyncedKeepsUninitialized) {
  CoherenceMap map(100);
  map.host_written(10, 20);
  map.device_written(20, 30);
  map.mark_synced(0, 100);
  EXPECT_EQ(pieces(map, 0, 100), (std::vector<Piece>{{0, 10, State::kUninitialized},
                                                     {10, 30, State::kBothValid},
                                                     {30, 100, State::kUninitialized}}));
  EXPECT_TRUE(map.ranges_to_upload(0, 100).empty());
  EXPECT_TRUE(map.ranges_to_download(0, 100).empty());
}

TEST(CoherenceMap, MarkSyncedOnPartOfARange) {
  CoherenceMap map(100);
  map.host_written(0, 100);
  map.mark_synced(25, 75);
  EXPECT_EQ(map.ranges_to_upload(0, 100), (std::vector<ByteRange>{{0, 25}, {75, 100}}));
  map.mark_synced(0, 25);
  map.mark_synced(75, 100);
  State s;
  ASSERT_TRUE(map.is_uniform(&s));
  EXPECT_EQ(s, State::kBothValid);
}

// A sibling view's sync must not touch another view's stale bytes (the production
// bug of one residency flag per buffer shared by all its views).
TEST(CoherenceMap, SyncingOneViewLeavesASiblingDirty) {
  CoherenceMap map(4096);
  map.mark_synced(0, 4096);
  map.host_written(0, 1024);     // view A
  map.host_written(1024, 2048);  // view B
  map.mark_synced(1024, 2048);   // B synced
  EXPECT_EQ(map.ranges_to_upload(0, 4096), (std::vector<ByteRange>{{0, 1024}}));
}

TEST(CoherenceMap, UniformFastPathAllocatesNothing) {
  CoherenceMap map(1 << 20);
  map.host_written(0, 1 << 20);
  map.mark_synced(0, 1 << 20);
  ASSERT_TRUE(map.is_uniform());
  AllocationCounter counter;
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(map.ranges_to_upload(0, 1 << 20).empty());
    EXPECT_TRUE(map.ranges_to_download(4096, 8192).empty());
    map.mark_synced(0, 1 << 20);
    map.set(100, 200, State::kBothValid);
    EXPECT_EQ(map.state_at(12345), State::kBothValid);
  }
  map.host_written(0, 1 << 20);                            // whole-buffer transition stays uniform
  EXPECT_EQ(map.ranges_to_upload(0, 1 << 20).size(), 1u);  // this one allocates its result
  EXPECT_EQ(counter.count(), 1u);
  EXPECT_EQ(map.segment_count(), 1u);
}

TEST(CoherenceMap, ReturnsToTheFastPathAfterBecomingUniform) {
  CoherenceMap map(1000);
  map.mark_synced(0, 1000);
  map.host_written(0, 1000);
  map.mark_synced(0, 1000);
  for (uint64_t b = 0; b < 1000; b += 100) map.host_written(b, b + 50);
  EXPECT_EQ(map.segment_count(), 20u);
  map.mark_synced(0, 1000);
  EXPECT_EQ(map.segment_count(), 1u);
  EXPECT_TRUE(map.is_uniform());
  // The segment list keeps its capacity: mixing again does not allocate.
  AllocationCounter counter;
  for (uint64_t b = 0; b < 1000; b += 100) map.host_written(b, b + 50);
  EXPECT_EQ(map.segment_count(), 20u);
  EXPECT_EQ(counter.count(), 0u);
}

TEST(CoherenceMap, ZeroSizedMap) {
  CoherenceMap map(0);
  EXPECT_EQ(map.segment_count(), 0u);
  EXPECT_TRUE(map.is_uniform());
  map.host_written(0, 0);
  EXPECT_TRUE(map.ranges_to_upload(0, 0).empty());
}

TEST(CoherenceMapDeathTest, RangePastTheEndIsABug) {
  CoherenceMap map(100);
  EXPECT_DEATH(map.set(90, 101, State::kHostNewer), "check failed");
  EXPECT_DEATH(map.ranges_to_upload(50, 40), "check failed");
  EXPECT_DEATH((void)map.state_at(100), "check failed");
}

// ---- Randomized differential test against a per-byte model ------------------------

using Model = std::vector<State>;

// Maximal runs of the model within [begin, end).
std::vector<Piece> model_runs(const Model& model, uint64_t begin, uint64_t end) {
  std::vector<Piece> runs;
  for (uint64_t i = begin; i < end; ++i) {
    if (!runs.empty() && std::get<2>(runs.back()) == model[i]) {
      std::get<1>(runs.back()) = i + 1;
    } else {
      runs.emplace_back(i, i + 1, model[i]);
    }
  }
  return runs;
}

std::vector<ByteRange> model_ranges_in(const Model& model, uint64_t begin, uint64_t end,
                                       State state) {
  std::vector<ByteRange> out;
  for (const auto& [b, e, s] : model_runs(model, begin, end)) {
    if (s == state) out.push_back({b, e});
  }
  return out;
}

class RandomOps {
 public:
  explicit RandomOps(uint64_t seed) : rng_(seed) {}

  uint64_t below(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }

  // Mostly ranges on a coarse grid, so ranges often touch and must coalesce;
  // sometimes arbitrary ones, sometimes the whole buffer.
  std::pair<uint64_t, uint64_t> range(uint64_t size) {
    const uint64_t kind = below(10);
    if (kind == 0) return {0, size};
    uint64_t a, b;
    if (kind < 6) {
      const uint64_t step = size >= 8 ? size / 8 : 1;
      a = std::min(size, below(9) * step);
      b = std::min(size, below(9) * step);
    } else {
      a = below(size + 1);
      b = below(size + 1);
    }
    if (a > b) std::swap(a, b);
    return {a, b};
  }

  State state() { return static_cast<State>(below(4)); }

 private:
  std::mt19937_64 rng_;
};

void apply(CoherenceMap& map, Model& model, RandomOps& rnd) {
  const auto [b, e] = rnd.range(map.size());
  const uint64_t op = rnd.below(4);
  if (op == 0) {
    const State s = rnd.state();
    map.set(b, e, s);
    std::fill(model.begin() + b, model.begin() + e, s);
  } else if (op == 1) {
    map.host_written(b, e);
    std::fill(model.begin() + b, model.begin() + e, State::kHostNewer);
  } else if (op == 2) {
    map.device_written(b, e);
    std::fill(model.begin() + b, model.begin() + e, State::kDeviceNewer);
  } else {
    map.mark_synced(b, e);
    for (uint64_t i = b; i < e; ++i) {
      if (model[i] == State::kHostNewer || model[i] == State::kDeviceNewer)
        model[i] = State::kBothValid;
    }
  }
}

void expect_agrees(const CoherenceMap& map, const Model& model, RandomOps& rnd) {
  const uint64_t size = map.size();
  const std::vector<Piece> runs = model_runs(model, 0, size);
  // The whole map, piece by piece, is exactly the model's maximal runs: this checks
  // every byte's state and that the map is fully coalesced.
  ASSERT_EQ(pieces(map, 0, size), runs);
  ASSERT_EQ(map.segment_count(), runs.size());
  ASSERT_EQ(map.is_uniform(), runs.size() == 1);
  for (int i = 0; i < 4; ++i) {
    const uint64_t off = rnd.below(size);
    ASSERT_EQ(map.state_at(off), model[off]) << "offset " << off;
  }
  const auto [b, e] = rnd.range(size);
  ASSERT_EQ(map.ranges_to_upload(b, e), model_ranges_in(model, b, e, State::kHostNewer))
      << "range [" << b << ", " << e << ")";
  ASSERT_EQ(map.ranges_to_download(b, e), model_ranges_in(model, b, e, State::kDeviceNewer))
      << "range [" << b << ", " << e << ")";
  ASSERT_EQ(pieces(map, b, e), model_runs(model, b, e));
}

TEST(CoherenceMap, RandomizedAgainstPerByteModel) {
  constexpr int kOps = 20000;
  constexpr int kOpsPerBuffer = 200;
  RandomOps rnd(0x6e707572745f636d);
  for (int done = 0; done < kOps; done += kOpsPerBuffer) {
    const uint64_t size = 1 + rnd.below(10000);
    CoherenceMap map(size);
    Model model(size, State::kUninitialized);
    for (int i = 0; i < kOpsPerBuffer; ++i) {
      apply(map, model, rnd);
      SCOPED_TRACE("buffer of " + std::to_string(size) + " bytes, op " + std::to_string(done + i));
      expect_agrees(map, model, rnd);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace npurt
