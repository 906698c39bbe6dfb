// The in-process communicator's collectives against host computations, their stream
// ordering, and what they do when a peer never comes or fails first.

#include <gtest/gtest.h>

#include <tuple>

#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "hal/sim_test_util.h"
#include "npurt/base/hazards.h"
#include "npurt/base/math.h"
#include "npurt/comm/device_group.h"
#include "npurt/hal/handles.h"
#include "npurt/isa/numeric.h"

namespace npurt::comm {
namespace {

using isa::DType;

const hal::DeviceSpec kSim{.cores = 2, .memory_bytes = 96ull << 20, .settings = {{"host_threads", "1"}}};

std::shared_ptr<DeviceGroup> make_group(int n, CommOptions o = {}) {
  auto g = DeviceGroup::create("sim", n, kSim, {}, o);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  return g.ok() ? *g : nullptr;
}

// One buffer and one stream per rank.
struct RankData {
  Buffer buffer;
  hal::Stream stream;
};

std::vector<RankData> rank_buffers(DeviceGroup& g, uint64_t bytes) {
  std::vector<RankData> out;
  for (int r = 0; r < g.size(); ++r) {
    Runtime& rt = g.runtime(r);
    auto b = rt.memory().create_buffer(bytes);
    auto s = hal::Stream::create(rt.shared_device());
    EXPECT_TRUE(b.ok() && s.ok());
    out.push_back({std::move(b).value(), std::move(s).value()});
  }
  return out;
}

void write_bytes(Runtime& rt, const View& v, const void* src) {
  auto g = rt.memory().overwrite(v);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  std::memcpy(g->bytes().data(), src, v.size());
}

std::vector<uint8_t> read_bytes(Runtime& rt, const View& v) {
  auto g = rt.memory().read(v);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return {};
  return std::vector<uint8_t>(g->bytes().begin(), g->bytes().end());
}

std::vector<float> random_floats(uint64_t n, uint32_t seed) { return testing::random_floats(n, seed, -1.f, 1.f); }

void sync_all(DeviceGroup& g, std::vector<RankData>& ranks) {
  for (int r = 0; r < g.size(); ++r) {
    ASSERT_TRUE(g.runtime(r).device().stream_synchronize(ranks[r].stream.id()).ok());
  }
}

// `f` as `dtype` (f32 or bf16) bytes, and such bytes as f32.
std::vector<uint8_t> to_bytes(DType dtype, const std::vector<float>& f) {
  std::vector<uint8_t> out(f.size() * reduce_element_bytes(dtype));
  for (uint64_t i = 0; i < f.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t h = isa::f32_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<float> from_bytes(DType dtype, const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / reduce_element_bytes(dtype));
  for (uint64_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = isa::bf16_to_f32(h);
    }
  }
  return out;
}

// All-reduces every rank's buffer as `dtype`, waits for every stream and appends what
// each rank's buffer then holds to `results`.
void all_reduce_and_read(DeviceGroup& g, std::vector<RankData>& ranks, DType dtype,
                         std::vector<std::vector<uint8_t>>* results) {
  for (int r = 0; r < g.size(); ++r) {
    ASSERT_TRUE(g.communicator(r)->all_reduce(ranks[r].stream.id(), ranks[r].buffer.view(), dtype).ok());
  }
  sync_all(g, ranks);
  for (int r = 0; r < g.size(); ++r) results->push_back(read_bytes(g.runtime(r), ranks[r].buffer.view()));
}

constexpr uint64_t kSizes[] = {1, 3, 640, 4099, 262145, 1u << 20};

// Every collective on 2 and 4 devices, with the all-reduce's sums on the streams'
// threads (host_sums, the default here) and as kernels.
class Collectives : public ::testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  std::shared_ptr<DeviceGroup> group() const { return make_group(ranks(), {.host_sums = std::get<1>(GetParam())}); }

  // For each of kSizes: rank r's random input (seed seed_step * r + count) as `dtype`,
  // all-reduced; rank 0 then holds the host sum of those `dtype` values within
  // `tolerance` (relative L2), and every other rank rank 0's bytes.
  void expect_all_reduce_matches_host_sum(DType dtype, uint32_t seed_step, double tolerance) {
    const int n = ranks();
    auto g = group();
    ASSERT_TRUE(g);
    for (uint64_t count : kSizes) {
      SCOPED_TRACE("elements " + std::to_string(count));
      auto ranks = rank_buffers(*g, count * reduce_element_bytes(dtype));
      std::vector<double> sum(count, 0);
      for (int r = 0; r < n; ++r) {
        const std::vector<uint8_t> in =
            to_bytes(dtype, random_floats(count, seed_step * r + static_cast<uint32_t>(count)));
        const std::vector<float> values = from_bytes(dtype, in);
        for (uint64_t i = 0; i < count; ++i) sum[i] += values[i];
        write_bytes(g->runtime(r), ranks[r].buffer.view(), in.data());
      }
      std::vector<std::vector<uint8_t>> results;
      ASSERT_NO_FATAL_FAILURE(all_reduce_and_read(*g, ranks, dtype, &results));
      EXPECT_LE(rel_l2(from_bytes(dtype, results[0]), std::vector<float>(sum.begin(), sum.end())), tolerance);
      for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r;
    }
  }
};

TEST_P(Collectives, AllReduceF32MatchesTheHostSum) { expect_all_reduce_matches_host_sum(DType::kF32, 1000, 1e-6); }

TEST_P(Collectives, AllReduceBf16MatchesTheHostSum) { expect_all_reduce_matches_host_sum(DType::kBF16, 77, 1e-2); }

TEST_P(Collectives, AllGatherPlacesEveryRankInRankOrder) {
  const int n = ranks();
  auto g = group();
  ASSERT_TRUE(g);
  for (uint64_t count : kSizes) {
    SCOPED_TRACE("elements " + std::to_string(count));
    auto local = rank_buffers(*g, count * 4);
    auto gathered = rank_buffers(*g, count * 4 * n);
    std::vector<uint8_t> expect;
    for (int r = 0; r < n; ++r) {
      const std::vector<float> f = random_floats(count, 5 * r + 1 + static_cast<uint32_t>(count));
      write_bytes(g->runtime(r), local[r].buffer.view(), f.data());
      const auto* p = reinterpret_cast<const uint8_t*>(f.data());
      expect.insert(expect.end(), p, p + count * 4);
      const std::vector<uint8_t> poison(count * 4 * n, 0xff);  // NaNs where nothing lands
      write_bytes(g->runtime(r), gathered[r].buffer.view(), poison.data());
      ASSERT_TRUE(g->runtime(r).memory().to_device(gathered[r].buffer.view()).ok());
    }
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(g->communicator(r)
                      ->all_gather(local[r].stream.id(), local[r].buffer.view(), gathered[r].buffer.view())
                      .ok());
    }
    sync_all(*g, local);
    for (int r = 0; r < n; ++r) EXPECT_EQ(read_bytes(g->runtime(r), gathered[r].buffer.view()), expect) << "rank " << r;
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int n = ranks();
  auto g = group();
  ASSERT_TRUE(g);
  for (uint64_t count : {uint64_t{1}, uint64_t{4099}, uint64_t{1} << 20}) {
    for (int root = 0; root < n; ++root) {
      SCOPED_TRACE("elements " + std::to_string(count) + " root " + std::to_string(root));
      auto ranks = rank_buffers(*g, count * 4);
      std::vector<uint8_t> expect;
      for (int r = 0; r < n; ++r) {
        const std::vector<float> f = random_floats(count, 31 * r + root + static_cast<uint32_t>(count));
        write_bytes(g->runtime(r), ranks[r].buffer.view(), f.data());
        if (r == root) expect.assign(reinterpret_cast<const uint8_t*>(f.data()), reinterpret_cast<const uint8_t*>(f.data()) + count * 4);
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(g->communicator(r)->broadcast(ranks[r].stream.id(), ranks[r].buffer.view(), root).ok());
      }
      sync_all(*g, ranks);
      for (int r = 0; r < n; ++r) EXPECT_EQ(read_bytes(g->runtime(r), ranks[r].buffer.view()), expect) << "rank " << r;
    }
  }
}

TEST_P(Collectives, BarrierWaitsForEveryRanksStream) {
  const int n = ranks();
  auto g = group();
  ASSERT_TRUE(g);
  auto ranks = rank_buffers(*g, 64);
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  // The last rank's stream is held before its barrier; nobody may pass.
  ASSERT_TRUE(g->runtime(n - 1).device().enqueue_host_function(ranks[n - 1].stream.id(), [go](const Status&) {
    go.wait();
    return ok_status();
  }).ok());
  for (int r = 0; r < n; ++r) ASSERT_TRUE(g->communicator(r)->barrier(ranks[r].stream.id()).ok());
  for (int r = 0; r < n; ++r) {
    auto done = g->runtime(r).device().stream_query(ranks[r].stream.id());
    ASSERT_TRUE(done.ok());
    EXPECT_FALSE(*done) << "rank " << r << " passed a barrier its peer had not reached";
  }
  release.set_value();
  sync_all(*g, ranks);
}

// Many rounds queued on every rank (small chunks, three all-reduces on one stream),
// rank by rank from the last, after a pause that lets the streams' threads sleep: the
// threads that meet first run the later-enqueued ranks' pushes and arrivals as they
// come (hundreds of commands over this test), in each stream's order, and the sums
// come out right with no meeting timing out.
TEST_P(Collectives, RoundsQueuedAheadMeetInOrder) {
  const int n = ranks();
  auto g = make_group(
      n, {.chunk_bytes = 4096, .timeout = std::chrono::seconds(5), .host_sums = std::get<1>(GetParam())});
  ASSERT_TRUE(g);
  constexpr uint64_t kCount = 4096;  // 16 KiB of f32: four rounds each
  constexpr int kReduces = 3;
  uint64_t lent = 0;  // commands a waiting rank ran for a peer
  std::vector<uint64_t> lent_before(n);
  for (int rep = 0; rep < 10; ++rep) {
    SCOPED_TRACE("repetition " + std::to_string(rep));
    std::vector<std::vector<RankData>> data;
    std::vector<std::vector<double>> sums(kReduces, std::vector<double>(kCount, 0));
    for (int k = 0; k < kReduces; ++k) {
      data.push_back(rank_buffers(*g, kCount * 4));
      for (int r = 0; r < n; ++r) {
        const std::vector<float> in = random_floats(kCount, 500 * rep + 10 * k + r);
        for (uint64_t i = 0; i < kCount; ++i) sums[k][i] += in[i];
        write_bytes(g->runtime(r), data[k][r].buffer.view(), in.data());
        ASSERT_TRUE(g->runtime(r).memory().to_device(data[k][r].buffer.view()).ok());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int r = 0; r < n; ++r) lent_before[r] = g->runtime(r).device().counters().lent_thread_commands;
    for (int r = n - 1; r >= 0; --r) {
      for (int k = 0; k < kReduces; ++k) {
        ASSERT_TRUE(
            g->communicator(r)->all_reduce(data[0][r].stream.id(), data[k][r].buffer.view(), DType::kF32).ok());
      }
    }
    for (int r = 0; r < n; ++r) {
      const Status s = g->runtime(r).device().stream_synchronize(data[0][r].stream.id());
      ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s.to_string();
    }
    for (int r = 0; r < n; ++r) lent += g->runtime(r).device().counters().lent_thread_commands - lent_before[r];
    for (int k = 0; k < kReduces; ++k) {
      const std::vector<uint8_t> first = read_bytes(g->runtime(0), data[k][0].buffer.view());
      EXPECT_LE(rel_l2(from_bytes(DType::kF32, first), std::vector<float>(sums[k].begin(), sums[k].end())), 1e-6);
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(read_bytes(g->runtime(r), data[k][r].buffer.view()), first) << "rank " << r;
      }
    }
  }
  EXPECT_GT(lent, 0u) << "no rank ever ran a peer's part: the test did not exercise the help";
}


// The sums the stream's thread forms (host_sums, the default on simulated NPUs) are
// byte for byte the sum kernels' (host_sums off), f32 and bf16, on every rank.
class CollectiveSums : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveSums, HostSumsGiveTheSumKernelsBytes) {
  const int n = GetParam();
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (uint64_t count : {uint64_t{3}, uint64_t{640}, uint64_t{262145}}) {
      SCOPED_TRACE(std::string(isa::dtype_name(dtype)) + " x " + std::to_string(count));
      const uint64_t bytes = count * reduce_element_bytes(dtype);
      std::vector<std::vector<uint8_t>> results;
      for (const bool host_sums : {true, false}) {
        auto g = make_group(n, {.host_sums = host_sums});
        ASSERT_TRUE(g);
        auto ranks = rank_buffers(*g, bytes);
        for (int r = 0; r < n; ++r) {
          const std::vector<uint8_t> in = to_bytes(dtype, random_floats(count, 31 * r + static_cast<uint32_t>(count)));
          write_bytes(g->runtime(r), ranks[r].buffer.view(), in.data());
        }
        const size_t first = results.size();
        ASSERT_NO_FATAL_FAILURE(all_reduce_and_read(*g, ranks, dtype, &results));
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(results[first + r], results.front()) << (host_sums ? "host sums" : "kernels") << ", rank " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Combine(::testing::Values(2, 4), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "devices" +
                                  (std::get<1>(info.param) ? "HostSums" : "KernelSums");
                         });
INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveSums, ::testing::Values(2, 4), [](const auto& info) {
  return std::to_string(info.param) + "devices";
});

// The caller's thread never waits for peers: one thread enqueues rank 0, sees its
// stream still waiting, then enqueues rank 1.
TEST(CollectiveOrdering, TheCallingThreadDoesNotWaitForPeers) {
  auto g = make_group(2);
  ASSERT_TRUE(g);
  auto ranks = rank_buffers(*g, 640 * 4);
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> f = random_floats(640, r + 1);
    write_bytes(g->runtime(r), ranks[r].buffer.view(), f.data());
  }
  ASSERT_TRUE(g->communicator(0)->all_reduce(ranks[0].stream.id(), ranks[0].buffer.view(), DType::kF32).ok());
  auto pending = g->runtime(0).device().stream_query(ranks[0].stream.id());
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(*pending) << "rank 0 finished an all-reduce rank 1 had not joined";
  ASSERT_TRUE(g->communicator(1)->all_reduce(ranks[1].stream.id(), ranks[1].buffer.view(), DType::kF32).ok());
  sync_all(*g, ranks);
  EXPECT_EQ(read_bytes(g->runtime(0), ranks[0].buffer.view()), read_bytes(g->runtime(1), ranks[1].buffer.view()));
}

// Each rank's new input is uploaded on its stream behind a held host function; the
// collective must read it only after that. Returns rank 0's result.
std::vector<float> reduce_behind_held_streams(bool skip_ordering, std::vector<float>* expected) {
  const ScopedHazard skip(Hazard::kCollectivesSkipOrdering, skip_ordering);
  auto g = make_group(2);
  auto ranks = rank_buffers(*g, 4096 * 4);
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  expected->assign(4096, 0);
  for (int r = 0; r < 2; ++r) {
    Runtime& rt = g->runtime(r);
    const std::vector<float> old_values = random_floats(4096, 100 + r), new_values = random_floats(4096, 200 + r);
    write_bytes(rt, ranks[r].buffer.view(), old_values.data());
    EXPECT_TRUE(rt.memory().to_device(ranks[r].buffer.view()).ok());
    write_bytes(rt, ranks[r].buffer.view(), new_values.data());  // host-newer: uploaded by the collective
    for (int i = 0; i < 4096; ++i) (*expected)[i] += new_values[i];
    EXPECT_TRUE(rt.device().enqueue_host_function(ranks[r].stream.id(), [go](const Status&) {
      go.wait();
      return ok_status();
    }).ok());
  }
  std::vector<uint64_t> pushed_before(2);
  for (int r = 0; r < 2; ++r) {
    pushed_before[r] = g->runtime(r).device().counters().peer_transfers;
    EXPECT_TRUE(g->communicator(r)->all_reduce(ranks[r].stream.id(), ranks[r].buffer.view(), DType::kF32).ok());
  }
  // Ordered pushes wait behind the held streams; unordered ones run now: wait for them
  // (bounded), so the outcome does not depend on thread timing.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(skip_ordering ? 20 : 0);
  for (int r = 0; r < 2; ++r) {
    while (g->runtime(r).device().counters().peer_transfers == pushed_before[r] &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (!skip_ordering) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(g->runtime(r).device().counters().peer_transfers, pushed_before[r]) << "rank " << r << " pushed early";
    }
  }
  release.set_value();
  sync_all(*g, ranks);
  const std::vector<uint8_t> bytes = read_bytes(g->runtime(0), ranks[0].buffer.view());
  std::vector<float> out(4096);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST(CollectiveOrdering, ReadsTheInputTheStreamProducedBeforeIt) {
  std::vector<float> expected;
  const std::vector<float> out = reduce_behind_held_streams(false, &expected);
  EXPECT_LE(rel_l2(out, expected), 1e-6);
}

// Negative control: a collective that does not wait for its stream's earlier work
// sums the old device bytes, and the check above catches it.
TEST(CollectiveOrdering, SkippingTheStreamOrderIsCaught) {
  std::vector<float> expected;
  const std::vector<float> out = reduce_behind_held_streams(true, &expected);
  EXPECT_GT(rel_l2(out, expected), 0.1);
}

TEST(CollectiveFaults, APeerThatNeverComesFailsTheCollectiveByName) {
  auto g = make_group(2, {.timeout = std::chrono::milliseconds(200)});
  ASSERT_TRUE(g);
  auto ranks = rank_buffers(*g, 256);
  const std::vector<float> f = random_floats(64, 3);
  write_bytes(g->runtime(0), ranks[0].buffer.view(), f.data());
  ASSERT_TRUE(g->communicator(0)->all_reduce(ranks[0].stream.id(), ranks[0].buffer.view(), DType::kF32).ok());
  const Status s = g->runtime(0).device().stream_synchronize(ranks[0].stream.id());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("all_reduce #0 on rank 0 of 2: rank(s) 1 did not arrive within 200 ms"),
            std::string::npos)
      << s.to_string();
  // The failed collective's output is never handed out as a result.
  const auto failed_read = g->runtime(0).memory().read(ranks[0].buffer.view());
  EXPECT_FALSE(failed_read.ok());
  // The group is finished; the device is not: rewritten bytes read back.
  const Status later = g->communicator(0)->barrier(ranks[0].stream.id());
  EXPECT_NE(later.message().find("the group failed earlier"), std::string::npos) << later.to_string();
  write_bytes(g->runtime(0), ranks[0].buffer.view(), f.data());
  const std::vector<uint8_t> back = read_bytes(g->runtime(0), ranks[0].buffer.view());
  EXPECT_EQ(std::memcmp(back.data(), f.data(), 256), 0);
}

TEST(CollectiveFaults, APeerWhoseStreamFailedFailsTheOthersAtOnce) {
  auto g = make_group(2);  // the default timeout (60 s) is not what ends this
  ASSERT_TRUE(g);
  auto ranks = rank_buffers(*g, 256);
  ASSERT_TRUE(g->runtime(1).device().enqueue_host_function(ranks[1].stream.id(), [](const Status&) {
    return device_fault("injected");
  }).ok());
  // Rank 1's stream is now in error: its collective is refused or fails on the stream.
  for (int r = 0; r < 2; ++r) {
    g->communicator(r)->all_reduce(ranks[r].stream.id(), ranks[r].buffer.view(), DType::kF32).ignore();
  }
  const Status s = g->runtime(0).device().stream_synchronize(ranks[0].stream.id());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.to_string();
}

TEST(CollectiveErrors, BadInputIsRefusedAndNothingIsEnqueued) {
  auto g = make_group(2);
  ASSERT_TRUE(g);
  auto ranks = rank_buffers(*g, 256);
  auto& c = *g->communicator(0);
  const hal::StreamId s = ranks[0].stream.id();
  const Status i32 = c.all_reduce(s, ranks[0].buffer.view(), DType::kI32);
  EXPECT_EQ(i32.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(i32.message().find("cannot be summed"), std::string::npos) << i32.to_string();
  auto odd = ranks[0].buffer.view(0, 6);
  ASSERT_TRUE(odd.ok());
  EXPECT_NE(c.all_reduce(s, *odd, DType::kF32).message().find("not a whole number of f32"), std::string::npos);
  const Status gather = c.all_gather(s, ranks[0].buffer.view(), ranks[1].buffer.view());
  EXPECT_NE(gather.message().find("all_gather: the gathered view holds 256 bytes; 2 ranks of 256 need 512"),
            std::string::npos)
      << gather.to_string();
  EXPECT_NE(c.broadcast(s, ranks[0].buffer.view(), 2).message().find("root 2 is not a rank of 2"), std::string::npos);
  EXPECT_EQ(c.stats().collectives, 0u);
  auto done = g->runtime(0).device().stream_query(s);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  // The group still works.
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(g->communicator(r)->barrier(ranks[r].stream.id()).ok());
  sync_all(*g, ranks);
  g->close();
  const Status closed = c.barrier(s);
  EXPECT_NE(closed.message().find("its runtime is closed"), std::string::npos) << closed.to_string();
}

}  // namespace
}  // namespace npurt::comm
