#include "npurt/ops/argmax.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstring>
#include <random>

#include "hal/sim_test_util.h"
#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

std::vector<float> random_logits(size_t n, uint32_t seed) { return testing::random_floats(n, seed, -10.f, 10.f); }

int32_t index_of(const testing::Bytes& b) {
  int32_t v;
  std::memcpy(&v, b.data(), sizeof(v));
  return v;
}

// Runs the operator on `x`; checks device == reference and returns the device index.
int32_t run_argmax(const std::vector<float>& x, uint32_t chunk = 0) {
  Argmax op({.n = x.size(), .chunk = chunk});
  OpHarness h(op);
  h.set_f32("x", x);
  const ::testing::AssertionResult ran = h.runs();
  EXPECT_TRUE(ran);
  if (!ran) return -2;
  EXPECT_EQ(index_of(h.device_bytes("index")), index_of(h.reference_bytes("index"))) << op.name();
  return index_of(h.device_bytes("index"));
}

class ArgmaxShapes : public ::testing::TestWithParam<ArgmaxParams> {};

TEST_P(ArgmaxShapes, MatchesReference) {
  const ArgmaxParams c = GetParam();
  const std::vector<float> x = random_logits(c.n, static_cast<uint32_t>(c.n + c.chunk));
  const int32_t want = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  EXPECT_EQ(run_argmax(x, c.chunk), want);
}

INSTANTIATE_TEST_SUITE_P(Ops, ArgmaxShapes,
                         ::testing::Values(ArgmaxParams{1, 0}, ArgmaxParams{1000, 0}, ArgmaxParams{262144, 0},
                                           ArgmaxParams{1000, 7}, ArgmaxParams{262144 + 13, 1000},
                                           ArgmaxParams{100000, 40000}, ArgmaxParams{5000, 1}));

TEST(Argmax, TiesGoToTheFirstIndexAcrossChunks) {
  std::vector<float> x = random_logits(1000, 5);
  x[299] = 20.f;  // last element of a 100-element row
  x[300] = 20.f;  // first of the next
  x[999] = 20.f;
  EXPECT_EQ(run_argmax(x, 100), 299);
  x[299] = 19.f;
  EXPECT_EQ(run_argmax(x, 100), 300);
  x.assign(777, 3.f);  // all equal
  EXPECT_EQ(run_argmax(x, 64), 0);
}

TEST(Argmax, MaximumInTheShortLastChunk) {
  std::vector<float> x = random_logits(1000, 6);
  x[998] = 11.f;
  EXPECT_EQ(run_argmax(x, 128), 998);
  x[999] = 12.f;
  EXPECT_EQ(run_argmax(x, 128), 999);
  std::vector<float> big = random_logits(262144, 7);
  big[262143] = 11.f;
  EXPECT_EQ(run_argmax(big, 1000), 262143);
}

TEST(Argmax, NanCountsAsMinusInfinity) {
  std::vector<float> x = random_logits(1000, 8);
  x[10] = NAN;
  x[500] = 15.f;
  x[501] = NAN;
  EXPECT_EQ(run_argmax(x, 64), 500);
  x.assign(300, NAN);
  EXPECT_EQ(run_argmax(x, 64), 0);
  x.assign(300, -INFINITY);
  x[200] = NAN;
  EXPECT_EQ(run_argmax(x, 64), 0);
  x[250] = -1e30f;
  EXPECT_EQ(run_argmax(x, 64), 250);
  x[7] = INFINITY;
  EXPECT_EQ(run_argmax(x, 64), 7);
}

// Runs the with_value form on `x`; checks device == reference and returns the
// device's [index, value bits].
std::array<int32_t, 2> run_with_value(const std::vector<float>& x, uint64_t index_base, uint32_t chunk = 0) {
  Argmax op({.n = x.size(), .chunk = chunk, .with_value = true, .index_base = index_base});
  OpHarness h(op);
  h.set_f32("x", x);
  std::array<int32_t, 2> got{-2, -2};
  const ::testing::AssertionResult ran = h.runs();
  EXPECT_TRUE(ran);
  if (!ran) return got;
  EXPECT_EQ(h.device_bytes("index"), h.reference_bytes("index")) << op.name();
  std::memcpy(got.data(), h.device_bytes("index").data(), sizeof(got));
  return got;
}

int32_t bits(float v) { return std::bit_cast<int32_t>(v); }

// The index (plus the base) and the value it points at, on random data.
TEST_P(ArgmaxShapes, WithValueMatchesReference) {
  const ArgmaxParams c = GetParam();
  const std::vector<float> x = random_logits(c.n, static_cast<uint32_t>(c.n + c.chunk));
  const int32_t want = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  for (uint64_t base : {uint64_t{0}, uint64_t{131072}}) {
    const std::array<int32_t, 2> got = run_with_value(x, base, c.chunk);
    EXPECT_EQ(got[0], want + static_cast<int32_t>(base));
    EXPECT_EQ(got[1], bits(x[want]));
  }
}

TEST(Argmax, WithValueTiesNanAndZeros) {
  std::vector<float> x = random_logits(1000, 9);
  x[299] = 20.f;
  x[300] = 20.f;
  x[999] = 20.f;
  EXPECT_EQ(run_with_value(x, 7, 100), (std::array<int32_t, 2>{306, bits(20.f)}));
  x.assign(300, NAN);  // nothing above -inf: index 0, value -inf (never NaN)
  EXPECT_EQ(run_with_value(x, 7, 64), (std::array<int32_t, 2>{7, bits(-INFINITY)}));
  x.assign(300, -INFINITY);
  x[200] = NAN;
  EXPECT_EQ(run_with_value(x, 0, 64), (std::array<int32_t, 2>{0, bits(-INFINITY)}));
  x[250] = -1e30f;
  EXPECT_EQ(run_with_value(x, 0, 64), (std::array<int32_t, 2>{250, bits(-1e30f)}));
  x.assign(300, -1.f);  // -0 == +0: the first wins, and its value is -0.0f, not +0.0f
  x[100] = -0.f;
  x[101] = 0.f;
  EXPECT_EQ(run_with_value(x, 0, 101), (std::array<int32_t, 2>{100, bits(-0.f)}));
}

// A vector split into n shards, each reduced with with_value and its offset as the
// base; argmax_pick of the gathered pairs is the argmax of the whole vector.
int32_t sharded_argmax(const std::vector<float>& x, int n) {
  std::vector<int32_t> pairs;
  for (int s = 0; s < n; ++s) {
    const size_t first = x.size() * s / n, end = x.size() * (s + 1) / n;
    const std::array<int32_t, 2> pair =
        run_with_value(std::vector<float>(x.begin() + first, x.begin() + end), first);
    pairs.insert(pairs.end(), pair.begin(), pair.end());
  }
  return argmax_pick(pairs);
}

TEST(Argmax, ShardsCombineToTheWholeArgmax) {
  for (size_t size : {size_t{1000}, size_t{262144 + 13}}) {
    std::vector<float> x = random_logits(size, static_cast<uint32_t>(size));
    for (int n : {2, 4}) EXPECT_EQ(sharded_argmax(x, n), run_argmax(x)) << size << " in " << n;
    // The maximum in two shards (and twice in the last): the lower index wins.
    x[size / 2 - 1] = 20.f;
    x[size - 1] = 20.f;
    x[size - 2] = 20.f;
    for (int n : {2, 4}) EXPECT_EQ(sharded_argmax(x, n), static_cast<int32_t>(size / 2 - 1)) << size << " in " << n;
    x[size / 2 - 1] = 19.f;
    for (int n : {2, 4}) EXPECT_EQ(sharded_argmax(x, n), static_cast<int32_t>(size - 2)) << size << " in " << n;
  }
  std::vector<float> x(1000, NAN);  // no value above -inf anywhere: 0, as unsharded
  for (int n : {2, 4}) EXPECT_EQ(sharded_argmax(x, n), 0);
  x.assign(1000, 5.f);  // every shard ties
  for (int n : {2, 4}) EXPECT_EQ(sharded_argmax(x, n), 0);
}

TEST(Argmax, RejectsBadParameters) {
  expect_rejects<Argmax>({.n = 0}, "n");
  expect_rejects<Argmax>({.n = uint64_t{1} << 31}, "n");
  expect_rejects<Argmax>({.n = 100000, .chunk = 70000}, "chunk");
  expect_rejects<Argmax>({.n = 100000, .chunk = 1}, "chunk");  // 100000 rows
  expect_rejects<Argmax>({.n = 100000, .chunk = 8192}, "chunk", Target{.cores = 1, .local_bytes = 16384});
  expect_rejects<Argmax>({.n = 1000, .index_base = (uint64_t{1} << 31) - 1000}, "index_base");
  expect_rejects<Argmax>({.n = 1000, .with_value = true, .index_base = uint64_t{1} << 40}, "index_base");
  EXPECT_TRUE(Argmax({.n = 1000, .index_base = (uint64_t{1} << 31) - 1001}).compile().ok());
}

}  // namespace
}  // namespace npurt::ops
