#include "npurt/ops/softmax.h"

#include <gtest/gtest.h>

#include <random>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using testing::OpHarness;

// Uniform in [-scale, scale): a large scale makes exp() and the max subtraction matter.
std::vector<float> random_scores(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

struct Case {
  uint64_t rows;
  uint32_t cols;
  bool causal = false;
  uint32_t window = 0;
  std::optional<int64_t> offset = std::nullopt;
  uint32_t rows_per_tile = 0;
  uint32_t cores = 0;
  float scale = 8.f;
};

class SoftmaxShapes : public ::testing::TestWithParam<Case> {};

TEST_P(SoftmaxShapes, MatchesReference) {
  const Case c = GetParam();
  Softmax op({.rows = c.rows,
              .cols = c.cols,
              .causal = c.causal,
              .window = c.window,
              .offset = c.offset,
              .rows_per_tile = c.rows_per_tile,
              .cores = c.cores});
  OpHarness h(op);
  h.set_f32("x", random_scores(c.rows * c.cols, c.scale, static_cast<uint32_t>(c.rows * 31 + c.cols)));
  const Status s = h.run();
  ASSERT_TRUE(s.ok()) << s.to_string();
  const double err = h.rel_l2("out");
  EXPECT_LE(err, 1e-5) << op.name() << " grid " << h.grid();
  RecordProperty("rel_l2", ::testing::PrintToString(err));
  // Masked entries are exactly zero on the device; each row sums to 1 or to 0.
  const auto got = h.device_f32("out"), want = h.reference_f32("out");
  for (uint64_t i = 0; i < c.rows; ++i) {
    double sum = 0;
    for (uint32_t j = 0; j < c.cols; ++j) {
      const size_t k = i * c.cols + j;
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
    ::testing::Values(Case{1, 1}, Case{64, 1000}, Case{7, 333}, Case{7, 333, false, 0, {}, 2, 3},
                      Case{1, 32768},                                                    // one long row
                      Case{16, 16, true}, Case{5, 20, true},                            // offset 15
                      Case{16, 16, true, 0, {}, 3, 3}, Case{5, 20, true, 0, {}, 2, 3},  //
                      Case{12, 20, true, 4}, Case{12, 20, true, 4, {}, 5, 3},           // sliding window
                      Case{1, 640, true, 512}, Case{4, 700, true, 512, {}, 1, 3},       // Gemma local layer
                      Case{6, 4, true},                                                 // rows > cols: first rows see nothing
                      Case{6, 9, true, 0, int64_t{-3}, 2, 3},                           // explicit offset
                      Case{6, 9, true, 2, int64_t{20}, 2, 3},                           // window past the end
                      Case{33, 65, true, 0, {}, 4, 3}));

TEST(Softmax, RejectsBadParameters) {
  const auto fails_on = [](SoftmaxParams p, const char* param, Target t = {}) {
    const Status s = Softmax(p).compile(t).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << param;
    EXPECT_TRUE(testing::message_has(s, std::string("'") + param + "'")) << s.to_string();
  };
  fails_on({.rows = 0, .cols = 8}, "rows");
  fails_on({.rows = 1, .cols = 0}, "cols");
  fails_on({.rows = 1, .cols = 70000}, "cols");
  fails_on({.rows = 4, .cols = 8, .window = 2}, "window");
  fails_on({.rows = 4, .cols = 8, .offset = 1}, "offset");
  fails_on({.rows = 4, .cols = 8, .causal = true, .offset = int64_t{1} << 50}, "offset");
  fails_on({.rows = 64, .cols = 4096, .rows_per_tile = 64}, "rows_per_tile");
  fails_on({.rows = 1, .cols = 8192}, "cols", Target{.cores = 1, .local_bytes = 16384});
}

}  // namespace
}  // namespace npurt::ops
