#include "npurt/ops/elementwise.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

class ElementwiseShapes : public ::testing::TestWithParam<ElementwiseParams> {};

TEST_P(ElementwiseShapes, MatchesReference) {
  const ElementwiseParams c = GetParam();
  expect_matches_reference(Elementwise(c), static_cast<uint32_t>(c.n), "out", tolerance(c.dtype));
}

std::vector<ElementwiseParams> cases() {
  std::vector<ElementwiseParams> v;
  for (auto k : {ElementwiseKind::kAdd, ElementwiseKind::kMul, ElementwiseKind::kGeluTanh, ElementwiseKind::kSilu,
                 ElementwiseKind::kGeluTanhMul}) {
    for (uint64_t n : {1ull, 640ull, 1000ull, 2048ull * 3 + 5}) v.push_back({k, n, DType::kF32, 0});
    v.push_back({k, 4097, DType::kBF16, 512});  // short last tile, uneven split over blocks
    v.push_back({k, 333, DType::kF16, 64});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, ElementwiseShapes, ::testing::ValuesIn(cases()));

TEST(Elementwise, RejectsBadParameters) {
  expect_rejects<Elementwise>({.kind = ElementwiseKind::kAdd, .n = 0}, "n");
  expect_rejects<Elementwise>({.kind = ElementwiseKind::kAdd, .n = 8, .dtype = DType::kQ8_0}, "dtype");
  expect_rejects<Elementwise>({.kind = ElementwiseKind::kAdd, .n = 8, .dtype = DType::kI32}, "dtype");
}

TEST(Elementwise, ReferenceChecksArgumentSizes) {
  Elementwise op({.kind = ElementwiseKind::kAdd, .n = 8});
  std::vector<uint8_t> a(32), b(32), out(16);
  const std::vector<HostArg> args{HostArg::buffer(a), HostArg::buffer(b), HostArg::buffer(out)};
  const Status s = op.reference(args);
  EXPECT_TRUE(testing::message_has(s, "'out' needs 32 bytes")) << s.to_string();
}

}  // namespace
}  // namespace npurt::ops
