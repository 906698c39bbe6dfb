#include "npurt/ops/copy.h"

#include <gtest/gtest.h>

#include <cstring>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

// ---- Copy ----

class CopyShapes : public ::testing::TestWithParam<CopyParams> {};

TEST_P(CopyShapes, MatchesReference) {
  const CopyParams c = GetParam();
  Copy op(c);
  OpHarness h(op, static_cast<uint32_t>(c.n));
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("dst", tolerance(c.dst_dtype)));
  // Conversions round to nearest even on both sides: the bytes agree exactly.
  EXPECT_EQ(h.device_bytes("dst"), h.reference_bytes("dst")) << op.name();
}

INSTANTIATE_TEST_SUITE_P(Ops, CopyShapes,
                         ::testing::Values(CopyParams{1}, CopyParams{640}, CopyParams{1000}, CopyParams{16384 * 3 + 5},
                                           CopyParams{4097, DType::kF32, DType::kBF16, 512, 3},
                                           CopyParams{4097, DType::kBF16, DType::kF32, 512, 3},
                                           CopyParams{333, DType::kF32, DType::kF16, 64, 3},
                                           CopyParams{333, DType::kF16, DType::kBF16, 0, 3},
                                           CopyParams{1000, DType::kBF16, DType::kBF16, 7, 3}));

TEST(Copy, RejectsBadParameters) {
  expect_rejects<Copy>({.n = 0}, "n");
  expect_rejects<Copy>({.n = 8, .src_dtype = DType::kI32}, "src_dtype");
  expect_rejects<Copy>({.n = 8, .dst_dtype = DType::kQ4_0}, "dst_dtype");
  expect_rejects<Copy>({.n = 200000, .tile = 100000}, "tile");
}

// ---- StridedCopy ----

struct StridedCase {
  StridedCopyParams p;
  int64_t dst_row = 0;
};

class StridedCopyShapes : public ::testing::TestWithParam<StridedCase> {};

TEST_P(StridedCopyShapes, MatchesReferenceAndKeepsOtherRows) {
  const StridedCase c = GetParam();
  StridedCopy op(c.p);
  OpHarness h(op, static_cast<uint32_t>(c.p.rows * 3 + c.dst_row));
  if (c.p.dst_row_runtime) h.set_scalar("dst_row", HostArg::i64(c.dst_row));
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("dst", tolerance(c.p.dst_dtype)));
  // dst starts with random contents: equal bytes mean the copied rows landed where
  // they belong and every other element is untouched.
  EXPECT_EQ(h.device_bytes("dst"), h.reference_bytes("dst")) << op.name();
  EXPECT_NE(h.device_bytes("dst"), h.input_bytes("dst")) << op.name();
}

// A KV-cache append: one 256-element row into a 64 x 256 cache at position p.
StridedCase kv_append(int64_t p, DType cache = DType::kF32) {
  return {{.rows = 1, .cols = 256, .dst_rows = 64, .dst_row_runtime = true, .dst_dtype = cache}, p};
}

INSTANTIATE_TEST_SUITE_P(
    Ops, StridedCopyShapes,
    ::testing::Values(kv_append(0), kv_append(17), kv_append(63), kv_append(17, DType::kF16),
                      kv_append(5, DType::kBF16),
                      StridedCase{{.rows = 37, .cols = 100, .src_stride = 130, .dst_stride = 120, .dst_rows = 50,
                                   .rows_per_tile = 4, .cores = 3}},
                      StridedCase{{.rows = 37, .cols = 100, .src_stride = 130, .dst_stride = 120, .dst_rows = 50,
                                   .dst_row_runtime = true, .src_dtype = DType::kBF16, .rows_per_tile = 4,
                                   .cores = 3},
                                  13},
                      StridedCase{{.rows = 1, .cols = 1}},
                      StridedCase{{.rows = 4, .cols = 640, .dst_stride = 1024, .dst_rows = 4}}));

TEST(StridedCopy, OutOfRangeDstRowFaults) {
  for (const auto& [rows, dst_row] : std::vector<std::pair<uint64_t, int64_t>>{{1, 64}, {1, -1}, {5, 60}, {1, 1000000}}) {
    StridedCopy op({.rows = rows, .cols = 256, .dst_rows = 64, .dst_row_runtime = true});
    OpHarness h(op);
    h.set_scalar("dst_row", HostArg::i64(dst_row));
    const Status s = h.run();
    EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << "dst_row " << dst_row << ": " << s.to_string();
  }
}

TEST(StridedCopy, SignatureHasRuntimeRowLast) {
  const auto sig = StridedCopy({.rows = 1, .cols = 256, .dst_rows = 64, .dst_row_runtime = true}).signature();
  ASSERT_EQ(sig.size(), 3u);
  EXPECT_EQ(sig[1].access, isa::Access::kInOut);
  EXPECT_EQ(sig[1].elements, 64u * 256);
  EXPECT_TRUE(sig[2].is_scalar());
  EXPECT_EQ(sig[2].name, "dst_row");
}

TEST(StridedCopy, RejectsBadParameters) {
  expect_rejects<StridedCopy>({.rows = 0, .cols = 8}, "rows");
  expect_rejects<StridedCopy>({.rows = 1, .cols = 0}, "cols");
  expect_rejects<StridedCopy>({.rows = 1, .cols = 70000}, "cols");
  expect_rejects<StridedCopy>({.rows = 2, .cols = 8, .src_stride = 7}, "src_stride");
  expect_rejects<StridedCopy>({.rows = 2, .cols = 8, .dst_stride = 4}, "dst_stride");
  expect_rejects<StridedCopy>({.rows = 4, .cols = 8, .dst_rows = 3}, "dst_rows");
  expect_rejects<StridedCopy>({.rows = 1, .cols = 8, .src_dtype = DType::kI32}, "src_dtype");
  expect_rejects<StridedCopy>({.rows = 1, .cols = 8, .dst_dtype = DType::kQ8_0}, "dst_dtype");
  expect_rejects<StridedCopy>({.rows = 64, .cols = 4096, .rows_per_tile = 64}, "rows_per_tile");
}

// ---- Transpose ----

class TransposeShapes : public ::testing::TestWithParam<TransposeParams> {};

TEST_P(TransposeShapes, MatchesReferenceExactly) {
  const TransposeParams c = GetParam();
  Transpose op(c);
  OpHarness h(op, static_cast<uint32_t>(c.rows * 1000 + c.cols));
  ASSERT_TRUE(h.runs());
  EXPECT_EQ(h.rel_l2("dst"), 0.0) << op.name();
  EXPECT_EQ(h.device_bytes("dst"), h.reference_bytes("dst")) << op.name();
}

INSTANTIATE_TEST_SUITE_P(Ops, TransposeShapes,
                         ::testing::Values(TransposeParams{1, 1}, TransposeParams{5, 7}, TransposeParams{64, 640},
                                           TransposeParams{640, 64}, TransposeParams{33, 129, DType::kF32, 8, 16, 3},
                                           TransposeParams{64, 640, DType::kBF16},
                                           TransposeParams{33, 129, DType::kBF16, 5, 7, 3},
                                           TransposeParams{33, 129, DType::kF16, 32, 64, 3},
                                           TransposeParams{300, 1, DType::kF32, 64, 0, 3}));

// The identity-product caveats of the header, pinned down.
TEST(Transpose, NegativeZeroAndNonFiniteValues) {
  Transpose op({.rows = 4, .cols = 3});
  OpHarness h(op);
  std::vector<float> x = {-0.f, 1.f, 2.f, 3.f, 4.f, INFINITY, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f};
  h.set_f32("src", x);
  ASSERT_TRUE(h.runs());
  const std::vector<float> got = h.device_f32("dst");  // 3 x 4
  EXPECT_FALSE(std::signbit(got[0]));                  // -0 became +0
  EXPECT_EQ(got[2 * 4 + 1], INFINITY);                 // the Inf itself survives
  EXPECT_TRUE(std::isnan(got[0 * 4 + 1]));             // the rest of its src row is NaN
  EXPECT_TRUE(std::isnan(got[1 * 4 + 1]));
  EXPECT_EQ(got[1 * 4 + 2], 7.f);  // other rows are exact
}

TEST(Transpose, RejectsBadParameters) {
  expect_rejects<Transpose>({.rows = 0, .cols = 8}, "rows");
  expect_rejects<Transpose>({.rows = 8, .cols = 0}, "cols");
  expect_rejects<Transpose>({.rows = 8, .cols = 8, .dtype = DType::kI32}, "dtype");
  expect_rejects<Transpose>({.rows = 8, .cols = 8, .tile_rows = 5000}, "tile_rows");
  expect_rejects<Transpose>({.rows = 8, .cols = 8, .tile_cols = 300}, "tile_cols");
  expect_rejects<Transpose>({.rows = 4096, .cols = 256, .tile_rows = 4096, .tile_cols = 256}, "tile_rows");
}

}  // namespace
}  // namespace npurt::ops
