#include "npurt/ops/rmsnorm.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using isa::DType;
using testing::OpHarness;

double tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

struct Case {
  uint64_t rows;
  uint32_t dim;
  DType dtype = DType::kF32;
  bool weighted = true;
  float eps = 1e-6f;
  uint32_t rows_per_tile = 0;
  uint32_t cores = 0;
};

class RmsNormShapes : public ::testing::TestWithParam<Case> {};

TEST_P(RmsNormShapes, MatchesReference) {
  const Case c = GetParam();
  RmsNorm op({.rows = c.rows,
              .dim = c.dim,
              .eps = c.eps,
              .weighted = c.weighted,
              .dtype = c.dtype,
              .rows_per_tile = c.rows_per_tile,
              .cores = c.cores});
  OpHarness h(op, static_cast<uint32_t>(c.rows * 7 + c.dim));
  const Status s = h.run();
  ASSERT_TRUE(s.ok()) << s.to_string();
  const double err = h.rel_l2("out");
  EXPECT_LE(err, tolerance(c.dtype)) << op.name() << " grid " << h.grid();
  RecordProperty("rel_l2", ::testing::PrintToString(err));
}

INSTANTIATE_TEST_SUITE_P(Ops, RmsNormShapes,
                         ::testing::Values(Case{1, 640},                                       // Gemma hidden
                                           Case{4, 256},                                       // per q head
                                           Case{1, 1}, Case{3, 1000}, Case{1, 256},            // k head
                                           Case{1000, 64, DType::kF32, true, 1e-6f, 7, 3},     // short last tile
                                           Case{1000, 64, DType::kF32, false, 1e-6f, 16, 3},   // unweighted
                                           Case{5, 640, DType::kF32, true, 1e-2f, 2, 3},       // large eps
                                           Case{5, 640, DType::kF32, true, 0.f},               // no eps
                                           Case{3, 1000, DType::kF32, false},                  //
                                           Case{9, 640, DType::kBF16, true, 1e-6f, 2, 3},      //
                                           Case{4, 256, DType::kF16, false, 1e-5f, 0, 3}));   //

// With inputs around 1e-3, mean(x^2) is far below eps, so a kernel that dropped or
// misplaced eps would be off by orders of magnitude.
TEST(RmsNorm, EpsDominatesSmallInputs) {
  RmsNorm op({.rows = 2, .dim = 640, .eps = 1e-2f});
  OpHarness h(op, 3);
  std::vector<float> x(2 * 640);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1e-3f * static_cast<float>(static_cast<int>((i * 37) % 101) - 50) / 50.f;
  h.set_f32("x", x);
  ASSERT_TRUE(h.run().ok());
  EXPECT_LE(h.rel_l2("out"), 1e-5);
}

// out bound to the same buffer as x.
TEST(RmsNorm, InPlace) {
  RmsNorm op({.rows = 37, .dim = 640, .rows_per_tile = 4, .cores = 3});
  OpHarness h(op, 11);
  ASSERT_TRUE(h.run().ok());

  auto loaded = testing::load_op(op);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  hal::Device& d = *loaded->dev;
  const hal::StreamId s = loaded->stream;
  const testing::Bytes& x = h.input_bytes("x");
  const testing::Bytes& w = h.input_bytes("w");
  auto xa = d.allocate(x.size());
  auto wa = d.allocate(w.size());
  ASSERT_TRUE(xa.ok() && wa.ok());
  ASSERT_TRUE(d.copy_to_device(s, *xa, x.data(), x.size()).ok());
  ASSERT_TRUE(d.copy_to_device(s, *wa, w.data(), w.size()).ok());
  hal::LaunchParams p{loaded->code, loaded->kernel.grid,
                      {hal::KernelArg::buffer(*xa, x.size()), hal::KernelArg::buffer(*wa, w.size()),
                       hal::KernelArg::buffer(*xa, x.size())}};
  ASSERT_TRUE(d.launch(s, p).ok());
  testing::Bytes got(x.size());
  ASSERT_TRUE(d.copy_to_host(s, got.data(), *xa, got.size()).ok());
  ASSERT_TRUE(d.stream_synchronize(s).ok());
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
  const auto fails_on = [](RmsNormParams p, const char* param, Target t = {}) {
    const Status s = RmsNorm(p).compile(t).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << param;
    EXPECT_TRUE(testing::message_has(s, std::string("'") + param + "'")) << s.to_string();
  };
  fails_on({.rows = 0, .dim = 8}, "rows");
  fails_on({.rows = 1, .dim = 0}, "dim");
  fails_on({.rows = 1, .dim = 70000}, "dim");
  fails_on({.rows = 1, .dim = 8, .eps = -1.f}, "eps");
  fails_on({.rows = 1, .dim = 8, .eps = NAN}, "eps");
  fails_on({.rows = 1, .dim = 8, .dtype = DType::kI32}, "dtype");
  fails_on({.rows = 1, .dim = 8, .dtype = DType::kQ8_0}, "dtype");
  fails_on({.rows = 64, .dim = 4096, .rows_per_tile = 64}, "rows_per_tile");
  fails_on({.rows = 1, .dim = 4096}, "dim", Target{.cores = 1, .local_bytes = 16384});
}

}  // namespace
}  // namespace npurt::ops
