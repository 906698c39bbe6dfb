#include "npurt/ops/gemm.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

std::string case_name(const ::testing::TestParamInfo<GemmParams>& info) {
  const GemmParams& c = info.param;
  std::string s = std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + "_" +
                  std::string(isa::dtype_name(c.dtype)) + "_to_" + std::string(isa::dtype_name(c.out_dtype)) +
                  (c.b_layout == GemmBLayout::kRowMajor ? "_brow" : "_bcol");
  if (c.tile_m || c.tile_n || c.tile_k || c.cores) {
    s += "_tile" + std::to_string(c.tile_m) + "x" + std::to_string(c.tile_n) + "x" + std::to_string(c.tile_k) +
         "_cores" + std::to_string(c.cores);
  }
  return s;
}

class GemmShapes : public ::testing::TestWithParam<GemmParams> {};

TEST_P(GemmShapes, MatchesReference) {
  const GemmParams c = GetParam();
  Gemm op(c);
  OpHarness h(op, static_cast<uint32_t>(c.m * 7 + c.n * 3 + c.k));
  ASSERT_TRUE(h.runs());
  // bf16 inputs are exact in both the kernel and the reference, so only a bf16 output
  // (one rounding per element) needs the looser bound.
  EXPECT_TRUE(h.close_to_reference("c", tolerance(c.out_dtype)));
  if (c.cores) {
    EXPECT_LE(h.grid(), c.cores);
  }
}

std::vector<GemmParams> cases() {
  std::vector<GemmParams> v;
  struct Shape {
    uint64_t m, n, k;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{17, 33, 65}, Shape{64, 640, 640}, Shape{128, 256, 640}}) {
    for (DType in : {DType::kF32, DType::kBF16}) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        for (GemmBLayout layout : {GemmBLayout::kRowMajor, GemmBLayout::kColMajor}) {
          v.push_back({s.m, s.n, s.k, in, out, layout});
        }
      }
    }
  }
  // Small explicit tiles: short edge tiles in m, n and k, several blocks.
  for (DType in : {DType::kF32, DType::kBF16}) {
    for (GemmBLayout layout : {GemmBLayout::kRowMajor, GemmBLayout::kColMajor}) {
      v.push_back({300, 200, 100, in, DType::kF32, layout, 32, 48, 40, 3});
    }
  }
  v.push_back({300, 200, 100, DType::kBF16, DType::kBF16, GemmBLayout::kColMajor, 64, 64, 64, 3});
  v.push_back({7, 640, 640, DType::kBF16, DType::kF32, GemmBLayout::kColMajor});  // a short prefill
  v.push_back({130, 1, 257, DType::kF32, DType::kF32, GemmBLayout::kRowMajor, 0, 0, 0, 3});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, GemmShapes, ::testing::ValuesIn(cases()), case_name);

// The rel-L2 check can fail: the transposed reading of B is a different product.
TEST(Gemm, DetectsWrongLayout) {
  const GemmParams p{.m = 32, .n = 32, .k = 32, .b_layout = GemmBLayout::kRowMajor};
  GemmParams q = p;
  q.b_layout = GemmBLayout::kColMajor;
  Gemm row_major(p), col_major(q);
  OpHarness h(row_major, 5), g(col_major, 5);
  ASSERT_TRUE(h.runs());
  ASSERT_TRUE(g.runs());
  EXPECT_GT(rel_l2(g.device_f32("c"), h.reference_f32("c")), 0.1);
}

TEST(Gemm, RejectsBadParameters) {
  expect_rejects<Gemm>({.m = 0, .n = 4, .k = 4}, "m");
  expect_rejects<Gemm>({.m = 4, .n = 0, .k = 4}, "n");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 0}, "k");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 4, .dtype = DType::kF16}, "dtype");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 4, .dtype = DType::kQ8_0}, "dtype");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 4, .out_dtype = DType::kI32}, "out_dtype");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 4, .b_layout = static_cast<GemmBLayout>(9)}, "b_layout");
  expect_rejects<Gemm>({.m = 4, .n = 4, .k = 4, .tile_k = 70000}, "tile_k");
  // Tiles beyond the 256 KiB of local memory.
  expect_rejects<Gemm>({.m = 512, .n = 512, .k = 512, .tile_m = 512, .tile_n = 512}, "tile_n");
  expect_rejects<Gemm>({.m = 512, .n = 512, .k = 4096, .tile_m = 64, .tile_n = 64, .tile_k = 4096}, "tile_k");
  expect_rejects<Gemm>({.m = 4096, .n = 512, .k = 512, .tile_m = 4096}, "tile_m");
}

TEST(Gemm, DefaultsFitSmallLocalMemory) {
  const Gemm op({.m = 256, .n = 256, .k = 1024, .dtype = DType::kBF16});
  for (uint32_t local : {16u << 10, 64u << 10, 256u << 10}) {
    StatusOr<Kernel> k = op.compile(Target{.cores = 2, .local_bytes = local});
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    EXPECT_LE(k->image.layout().local_bytes, local);
  }
}

TEST(Gemm, SignatureFollowsParameters) {
  const std::vector<isa::ArgSpec> sig =
      Gemm({.m = 3, .n = 5, .k = 7, .dtype = DType::kBF16, .out_dtype = DType::kF32}).signature();
  ASSERT_EQ(sig.size(), 3u);
  EXPECT_EQ(sig[0].name, "a");
  EXPECT_EQ(sig[0].elements, 21u);
  EXPECT_EQ(sig[0].dtype, DType::kBF16);
  EXPECT_EQ(sig[1].name, "b");
  EXPECT_EQ(sig[1].elements, 35u);
  EXPECT_EQ(sig[2].name, "c");
  EXPECT_EQ(sig[2].elements, 15u);
  EXPECT_EQ(sig[2].dtype, DType::kF32);
  EXPECT_EQ(sig[2].access, isa::Access::kOut);
}

}  // namespace
}  // namespace npurt::ops
