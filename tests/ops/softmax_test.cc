#include "npurt/ops/softmax.h"

#include <gtest/gtest.h>

#include <random>

#include "hal/sim_test_util.h"
#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

// Uniform in [-scale, scale): a large scale makes exp() and the max subtraction matter.
std::vector<float> random_scores(size_t n, float scale, uint32_t seed) {
  return testing::random_floats(n, seed, -scale, scale);
}

class SoftmaxShapes : public ::testing::TestWithParam<SoftmaxParams> {};

TEST_P(SoftmaxShapes, MatchesReference) {
  const SoftmaxParams p = GetParam();
  Softmax op(p);
  OpHarness h(op);
  h.set_f32("x", random_scores(p.rows * p.cols, 8.f, static_cast<uint32_t>(p.rows * 31 + p.cols)));
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("out", 1e-5));
  // Masked entries are exactly zero on the device; each row sums to 1 or to 0.
  const auto got = h.device_f32("out"), want = h.reference_f32("out");
  for (uint64_t i = 0; i < p.rows; ++i) {
    double sum = 0;
    for (uint32_t j = 0; j < p.cols; ++j) {
      const size_t k = i * p.cols + j;
      if (want[k] == 0.f) {
        EXPECT_EQ(got[k], 0.f) << "row " << i << " col " << j;
      }
      sum += got[k];
    }
    if (sum != 0) {
      EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, SoftmaxShapes,
    ::testing::Values(
        SoftmaxParams{.rows = 1, .cols = 1}, SoftmaxParams{.rows = 64, .cols = 1000},
        SoftmaxParams{.rows = 7, .cols = 333}, SoftmaxParams{.rows = 7, .cols = 333, .rows_per_tile = 2, .cores = 3},
        SoftmaxParams{.rows = 1, .cols = 32768},  // one long row
        SoftmaxParams{.rows = 16, .cols = 16, .causal = true},
        SoftmaxParams{.rows = 5, .cols = 20, .causal = true},  // offset 15
        SoftmaxParams{.rows = 16, .cols = 16, .causal = true, .rows_per_tile = 3, .cores = 3},
        SoftmaxParams{.rows = 5, .cols = 20, .causal = true, .rows_per_tile = 2, .cores = 3},
        SoftmaxParams{.rows = 12, .cols = 20, .causal = true, .window = 4},  // sliding window
        SoftmaxParams{.rows = 12, .cols = 20, .causal = true, .window = 4, .rows_per_tile = 5, .cores = 3},
        SoftmaxParams{.rows = 1, .cols = 640, .causal = true, .window = 512},  // Gemma local layer
        SoftmaxParams{.rows = 4, .cols = 700, .causal = true, .window = 512, .rows_per_tile = 1, .cores = 3},
        SoftmaxParams{.rows = 6, .cols = 4, .causal = true},  // rows > cols: first rows see nothing
        // An explicit offset, and a window past the end.
        SoftmaxParams{.rows = 6, .cols = 9, .causal = true, .offset = -3, .rows_per_tile = 2, .cores = 3},
        SoftmaxParams{.rows = 6, .cols = 9, .causal = true, .window = 2, .offset = 20, .rows_per_tile = 2, .cores = 3},
        SoftmaxParams{.rows = 33, .cols = 65, .causal = true, .rows_per_tile = 4, .cores = 3}));

TEST(Softmax, RejectsBadParameters) {
  expect_rejects<Softmax>({.rows = 0, .cols = 8}, "rows");
  expect_rejects<Softmax>({.rows = 1, .cols = 0}, "cols");
  expect_rejects<Softmax>({.rows = 1, .cols = 70000}, "cols");
  expect_rejects<Softmax>({.rows = 4, .cols = 8, .window = 2}, "window");
  expect_rejects<Softmax>({.rows = 4, .cols = 8, .offset = 1}, "offset");
  expect_rejects<Softmax>({.rows = 4, .cols = 8, .causal = true, .offset = int64_t{1} << 50}, "offset");
  expect_rejects<Softmax>({.rows = 64, .cols = 4096, .rows_per_tile = 64}, "rows_per_tile");
  expect_rejects<Softmax>({.rows = 1, .cols = 8192}, "cols", Target{.cores = 1, .local_bytes = 16384});
}

}  // namespace
}  // namespace npurt::ops
