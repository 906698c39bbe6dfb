#include "npurt/ops/elementwise.h"

#include <gtest/gtest.h>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using isa::DType;
using testing::OpHarness;

struct Case {
  ElementwiseKind kind;
  uint64_t n;
  DType dtype;
  uint32_t tile;
};

double tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-2; }

class ElementwiseShapes : public ::testing::TestWithParam<Case> {};

TEST_P(ElementwiseShapes, MatchesReference) {
  const Case c = GetParam();
  Elementwise op({.kind = c.kind, .n = c.n, .dtype = c.dtype, .tile = c.tile});
  OpHarness h(op, static_cast<uint32_t>(c.n));
  const Status s = h.run();
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_LE(h.rel_l2("out"), tolerance(c.dtype)) << op.name() << " grid " << h.grid();
}

std::vector<Case> cases() {
  std::vector<Case> v;
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
  Status s = Elementwise({.kind = ElementwiseKind::kAdd, .n = 0}).compile().status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::message_has(s, "'n'")) << s.to_string();
  s = Elementwise({.kind = ElementwiseKind::kAdd, .n = 8, .dtype = DType::kQ8_0}).compile().status();
  EXPECT_TRUE(testing::message_has(s, "'dtype'")) << s.to_string();
  s = Elementwise({.kind = ElementwiseKind::kAdd, .n = 8, .dtype = DType::kI32}).compile().status();
  EXPECT_TRUE(testing::message_has(s, "'dtype'")) << s.to_string();
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
