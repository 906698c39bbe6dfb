#include "npurt/ops/rmsnorm.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

class RmsNormShapes : public ::testing::TestWithParam<RmsNormParams> {};

TEST_P(RmsNormShapes, MatchesReference) {
  const RmsNormParams p = GetParam();
  expect_matches_reference(RmsNorm(p), static_cast<uint32_t>(p.rows * 7 + p.dim), "out", tolerance(p.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Ops, RmsNormShapes,
    ::testing::Values(RmsNormParams{.rows = 1, .dim = 640},  // Gemma hidden
                      RmsNormParams{.rows = 4, .dim = 256},  // per q head
                      RmsNormParams{.rows = 1, .dim = 1}, RmsNormParams{.rows = 3, .dim = 1000},
                      RmsNormParams{.rows = 1, .dim = 256},                                     // k head
                      RmsNormParams{.rows = 1000, .dim = 64, .rows_per_tile = 7, .cores = 3},  // short last tile
                      RmsNormParams{.rows = 1000, .dim = 64, .weighted = false, .rows_per_tile = 16, .cores = 3},
                      RmsNormParams{.rows = 5, .dim = 640, .eps = 1e-2f, .rows_per_tile = 2, .cores = 3},  // large eps
                      RmsNormParams{.rows = 5, .dim = 640, .eps = 0.f},                                    // no eps
                      RmsNormParams{.rows = 3, .dim = 1000, .weighted = false},
                      RmsNormParams{.rows = 9, .dim = 640, .dtype = DType::kBF16, .rows_per_tile = 2, .cores = 3},
                      RmsNormParams{
                          .rows = 4, .dim = 256, .eps = 1e-5f, .weighted = false, .dtype = DType::kF16, .cores = 3}));

// With inputs around 1e-3, mean(x^2) is far below eps, so a kernel that dropped or
// misplaced eps would be off by orders of magnitude.
TEST(RmsNorm, EpsDominatesSmallInputs) {
  RmsNorm op({.rows = 2, .dim = 640, .eps = 1e-2f});
  OpHarness h(op, 3);
  std::vector<float> x(2 * 640);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1e-3f * static_cast<float>(static_cast<int>((i * 37) % 101) - 50) / 50.f;
  h.set_f32("x", x);
  ASSERT_TRUE(h.runs());
  EXPECT_LE(h.rel_l2("out"), 1e-5);
}

// out bound to the same buffer as x.
TEST(RmsNorm, InPlace) {
  RmsNorm op({.rows = 37, .dim = 640, .rows_per_tile = 4, .cores = 3});
  OpHarness h(op, 11);
  ASSERT_TRUE(h.runs());

  auto loaded = testing::load_op(op);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  using testing::Bind;
  const auto after =
      loaded->launch({h.input_bytes("x"), h.input_bytes("w")}, {Bind::to(0), Bind::to(1), Bind::to(0)});
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  const testing::Bytes& got = (*after)[0];
  EXPECT_EQ(got, h.device_bytes("out"));  // bit-identical to the run with separate buffers
  EXPECT_LE(h.rel_l2("out"), 1e-5);
}

TEST(RmsNorm, SignatureHasNoWeightWhenUnweighted) {
  const auto sig = RmsNorm({.rows = 4, .dim = 256, .weighted = false}).signature();
  ASSERT_EQ(sig.size(), 2u);
  EXPECT_EQ(sig[0].name, "x");
  EXPECT_EQ(sig[1].name, "out");
  EXPECT_EQ(sig[1].elements, 1024u);
}

TEST(RmsNorm, RejectsBadParameters) {
  expect_rejects<RmsNorm>({.rows = 0, .dim = 8}, "rows");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 0}, "dim");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 70000}, "dim");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 8, .eps = -1.f}, "eps");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 8, .eps = NAN}, "eps");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 8, .dtype = DType::kI32}, "dtype");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 8, .dtype = DType::kQ8_0}, "dtype");
  expect_rejects<RmsNorm>({.rows = 64, .dim = 4096, .rows_per_tile = 64}, "rows_per_tile");
  expect_rejects<RmsNorm>({.rows = 1, .dim = 4096}, "dim", Target{.cores = 1, .local_bytes = 16384});
}

}  // namespace
}  // namespace npurt::ops
