#include "npurt/ops/argmax.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-10.f, 10.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

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

TEST(Argmax, RejectsBadParameters) {
  expect_rejects<Argmax>({.n = 0}, "n");
  expect_rejects<Argmax>({.n = uint64_t{1} << 31}, "n");
  expect_rejects<Argmax>({.n = 100000, .chunk = 70000}, "chunk");
  expect_rejects<Argmax>({.n = 100000, .chunk = 1}, "chunk");  // 100000 rows
  expect_rejects<Argmax>({.n = 100000, .chunk = 8192}, "chunk", Target{.cores = 1, .local_bytes = 16384});
}

}  // namespace
}  // namespace npurt::ops
