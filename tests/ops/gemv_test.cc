#include "npurt/ops/gemv.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

struct Case {
  GemvParams p;
  uint32_t local_bytes = 256u << 10;  // of the simulated device
};

double weight_tolerance(DType t) {
  if (t == DType::kF32) return 1e-5;
  if (t == DType::kBF16 || t == DType::kF16) return 1e-2;
  return 1e-3;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const GemvParams& c = info.param.p;
  std::string s = std::to_string(c.m) + "x" + std::to_string(c.k) + "_" + std::string(isa::dtype_name(c.weight));
  if (c.epilogue == GemvEpilogue::kGeluTanh) s += "_gelu";
  if (c.epilogue == GemvEpilogue::kSilu) s += "_silu";
  if (c.rows_per_tile || c.k_tile || c.cores) {
    s += "_tile" + std::to_string(c.rows_per_tile) + "x" + std::to_string(c.k_tile);
    s += "_cores" + std::to_string(c.cores);
  }
  if (info.param.local_bytes != 256u << 10) s += "_local" + std::to_string(info.param.local_bytes >> 10) + "k";
  return s;
}

class GemvShapes : public ::testing::TestWithParam<Case> {};

TEST_P(GemvShapes, MatchesReference) {
  const Case c = GetParam();
  Gemv op(c.p);
  OpHarness h(op, static_cast<uint32_t>(c.p.m * 31 + c.p.k), {.local_memory_bytes = c.local_bytes});
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("y", weight_tolerance(c.p.weight)));
  if (c.p.cores) {
    EXPECT_LE(h.grid(), c.p.cores);
  }
}

const DType kAllWeights[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0, DType::kQ4_0,
                             DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
const DType kBlock32Weights[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (DType t : kBlock32Weights) v.push_back({{1, 32, t}});
  for (DType t : kBlock32Weights) v.push_back({{640, 640, t}});
  for (DType t : kAllWeights) v.push_back({{1024, 2048, t}});
  v.push_back({{7, 640, DType::kBF16}});
  v.push_back({{2048, 640, DType::kBF16}});
  v.push_back({{2048, 640, DType::kQ5_0}});
  v.push_back({{640, 1024, DType::kQ4_K}});
  v.push_back({{640, 2048, DType::kQ6_K}});
  // Fused epilogues.
  v.push_back({{2048, 640, DType::kQ5_0, GemvEpilogue::kGeluTanh}});
  v.push_back({{2048, 640, DType::kBF16, GemvEpilogue::kSilu}});
  v.push_back({{333, 96, DType::kF32, GemvEpilogue::kGeluTanh, 16, 64, 3}});
  v.push_back({{333, 96, DType::kF32, GemvEpilogue::kSilu, 16, 64, 3}});
  // Small explicit tiles: short last row tile, k not a multiple of k_tile, several blocks.
  v.push_back({{300, 1000, DType::kF32, GemvEpilogue::kNone, 7, 256, 3}});
  v.push_back({{301, 999, DType::kBF16, GemvEpilogue::kNone, 16, 100, 3}});
  v.push_back({{77, 640, DType::kF16, GemvEpilogue::kNone, 5, 192, 3}});
  v.push_back({{100, 640, DType::kQ5_0, GemvEpilogue::kNone, 9, 256, 3}});
  v.push_back({{50, 640, DType::kQ8_0, GemvEpilogue::kNone, 8, 96, 3}});
  v.push_back({{129, 1280, DType::kQ4_K, GemvEpilogue::kNone, 16, 512, 3}});
  v.push_back({{65, 768, DType::kQ5_K, GemvEpilogue::kNone, 4, 512, 3}});
  v.push_back({{33, 1024, DType::kQ6_K, GemvEpilogue::kNone, 32, 768, 2}});
  v.push_back({{5, 640, DType::kQ4_0, GemvEpilogue::kNone, 0, 0, 8}});  // fewer rows than cores
  // A small local memory: x no longer fits at once and is loaded per k chunk.
  v.push_back({{64, 4096, DType::kBF16, GemvEpilogue::kNone, 0, 0, 0}, 16u << 10});
  v.push_back({{40, 6144, DType::kQ8_0, GemvEpilogue::kSilu, 0, 0, 3}, 16u << 10});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, GemvShapes, ::testing::ValuesIn(cases()), case_name);

// The Gemma LM head: 262144 rows of 640 q8_0 weights.
TEST(Gemv, GemmaLmHeadQ8_0) {
  Gemv op({.m = 262144, .k = 640, .weight = DType::kQ8_0});
  OpHarness h(op, 7);
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("y", 1e-3));
}

// The rel-L2 check can fail: a wrong x changes the result far beyond the tolerance.
TEST(Gemv, DetectsWrongInput) {
  Gemv op({.m = 64, .k = 640, .weight = DType::kQ8_0});
  OpHarness h(op, 3);
  ASSERT_TRUE(h.runs());
  OpHarness other(op, 4);
  ASSERT_TRUE(other.runs());
  EXPECT_GT(rel_l2(other.device_f32("y"), h.reference_f32("y")), 0.1);
}

TEST(Gemv, RejectsBadParameters) {
  expect_rejects<Gemv>({.m = 0, .k = 32}, "m");
  expect_rejects<Gemv>({.m = 4, .k = 0}, "k");
  expect_rejects<Gemv>({.m = 4, .k = 32, .weight = DType::kI32}, "weight");
  expect_rejects<Gemv>({.m = 4, .k = 32, .weight = static_cast<DType>(99)}, "weight");
  expect_rejects<Gemv>({.m = 4, .k = 32, .epilogue = static_cast<GemvEpilogue>(7)}, "epilogue");
  expect_rejects<Gemv>({.m = 4, .k = 48, .weight = DType::kQ8_0}, "k");
  expect_rejects<Gemv>({.m = 4, .k = 640, .weight = DType::kQ4_K}, "k");
  expect_rejects<Gemv>({.m = 4, .k = 512, .weight = DType::kQ4_K, .k_tile = 384}, "k_tile");
  expect_rejects<Gemv>({.m = 4, .k = 100000, .k_tile = 70000}, "k_tile");
  // Tiles beyond the 256 KiB of local memory.
  expect_rejects<Gemv>({.m = 4096, .k = 2048, .rows_per_tile = 65000, .k_tile = 2048}, "rows_per_tile");
  expect_rejects<Gemv>({.m = 4096, .k = 2048, .rows_per_tile = 100000}, "rows_per_tile");
  expect_rejects<Gemv>({.m = 4096, .k = 65520, .k_tile = 65520}, "k_tile");
  // Sizes whose row or weight counts would wrap 64-bit arithmetic.
  expect_rejects<Gemv>({.m = UINT64_MAX, .k = 32}, "m");
  expect_rejects<Gemv>({.m = 4, .k = (uint64_t{1} << 32) + 32}, "k");
  expect_rejects<Gemv>({.m = uint64_t{1} << 32, .k = uint64_t{1} << 20}, "m");
}

TEST(Gemv, SignatureFollowsParameters) {
  const std::vector<isa::ArgSpec> sig = Gemv({.m = 262144, .k = 640, .weight = DType::kQ8_0}).signature();
  ASSERT_EQ(sig.size(), 3u);
  EXPECT_EQ(sig[0].name, "w");
  EXPECT_EQ(sig[0].bytes(), 262144ull * 20 * 34);
  EXPECT_EQ(sig[1].name, "x");
  EXPECT_EQ(sig[1].elements, 640u);
  EXPECT_EQ(sig[2].name, "y");
  EXPECT_EQ(sig[2].access, isa::Access::kOut);
  EXPECT_EQ(sig[2].elements, 262144u);
}

TEST(Gemv, DefaultsUseEveryCore) {
  StatusOr<Kernel> k = Gemv({.m = 2048, .k = 2048, .weight = DType::kBF16}).compile(Target{.cores = 8});
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_EQ(k->grid, 8u);
}

}  // namespace
}  // namespace npurt::ops
