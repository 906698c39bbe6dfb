#include "npurt/ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

struct Case {
  uint32_t n_heads;
  uint32_t head_dim;
  int64_t pos;
  float base;
  uint32_t rotary_dim = 0;
  uint32_t heads_per_tile = 0;
  uint32_t cores = 0;
};

// Error budget. The kernel and the reference both form theta as an f32 product,
// f32(pos) * f32 inv_freq, and that rounding alone (up to pos * 2^-24 rad per
// angle) already moves the f32 reference away from the exact rotation by a rel-L2
// of about 8e-9 * pos: 3e-5 at pos 4095, 3e-4 at pos 32767. The kernel's inv_freq =
// exp(e_j log(base)) is within a few ulp of the reference's correctly rounded one,
// not bit-identical, and pos multiplies that difference too, so device vs reference
// shows the same linear growth. Measured (AVX-512), worst of base 1e4 / 1e6:
//   pos 1: 5e-8, 37: 3.4e-7, 1000: 5.6e-6, 4095: 3.1e-5, 32767: 3.1e-4,
// against the reference and against the exact (double) rotation alike. 1e-5 holds
// up to pos ~1000; beyond, the bound is 1.2e-8 * pos (measured at most 9.5e-9 * pos).
double rope_tolerance(int64_t pos) { return std::max(1e-5, 1.2e-8 * static_cast<double>(std::abs(pos))); }

// rel-L2 of `got` against the rotation computed entirely in double, theta included.
double rel_l2_vs_exact(const Case& c, const std::vector<float>& x, const std::vector<float>& got) {
  const uint32_t rot = c.rotary_dim ? c.rotary_dim : c.head_dim, half = rot / 2;
  std::vector<double> want(x.begin(), x.end());
  for (uint32_t j = 0; j < half; ++j) {
    const double theta = static_cast<double>(c.pos) * std::pow(static_cast<double>(c.base), -2.0 * j / rot);
    for (uint32_t h = 0; h < c.n_heads; ++h) {
      const size_t lo = size_t{h} * c.head_dim + j, hi = lo + half;
      want[lo] = x[lo] * std::cos(theta) - x[hi] * std::sin(theta);
      want[hi] = x[lo] * std::sin(theta) + x[hi] * std::cos(theta);
    }
  }
  return rel_l2(got, want);
}

std::string case_name(const Case& c) {
  std::string base = std::to_string(static_cast<int64_t>(c.base));
  return std::to_string(c.n_heads) + "x" + std::to_string(c.head_dim) + "_rot" + std::to_string(c.rotary_dim) +
         "_pos" + std::to_string(c.pos) + "_base" + base + "_tile" + std::to_string(c.heads_per_tile) + "_cores" +
         std::to_string(c.cores);
}

class RopeShapes : public ::testing::TestWithParam<Case> {};

TEST_P(RopeShapes, MatchesReference) {
  const Case c = GetParam();
  Rope op({.n_heads = c.n_heads,
           .head_dim = c.head_dim,
           .rotary_dim = c.rotary_dim,
           .heads_per_tile = c.heads_per_tile,
           .cores = c.cores});
  OpHarness h(op, c.n_heads * 31 + c.head_dim + static_cast<uint32_t>(c.pos));
  h.set_scalar("pos", HostArg::i64(c.pos));
  h.set_scalar("base", HostArg::f32(c.base));
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("out", rope_tolerance(c.pos))) << "pos " << c.pos << " base " << c.base;
  const double exact_err = rel_l2_vs_exact(c, isa::to_f32(h.input_bytes("x"), isa::DType::kF32), h.device_f32("out"));
  EXPECT_LE(exact_err, rope_tolerance(c.pos)) << op.name() << " pos " << c.pos << " base " << c.base;
  RecordProperty("rel_l2_vs_exact", std::to_string(exact_err));
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (float base : {10000.f, 1e6f}) {
    for (int64_t pos : {1, 37, 4095, 32767}) {
      v.push_back({4, 256, pos, base});  // Gemma q
      v.push_back({1, 256, pos, base});  // Gemma k
    }
    v.push_back({3, 2, 5, base});                  // one pair per head
    v.push_back({5, 64, 123, base, 0, 2, 3});      // short last tile, 3 blocks
    v.push_back({7, 64, 1000, base, 32, 2, 3});    // partial rotation
    v.push_back({6, 10, 77, base, 0, 4, 1});       // half = 5, not a power of two
    v.push_back({8, 64, 32767, base});             // head_dim 64 at the context end
    v.push_back({1, 2, 32767, base});              // theta = pos itself
    v.push_back({40, 512, 100, base});             // default tiles: 32 + 8 heads, 2 blocks
  }
  v.push_back({4, 256, -3, 10000.f});  // negative positions rotate the other way
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, RopeShapes, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = case_name(i.param);
                           for (char& ch : n) {
                             if (ch == '-') ch = 'm';
                           }
                           return n;
                         });

// At position 0 every angle is 0: cos = 1 and sin = 0 exactly, so out == x.
TEST(Rope, PositionZeroIsIdentity) {
  for (float base : {10000.f, 1e6f}) {
    Rope op({.n_heads = 4, .head_dim = 256});
    OpHarness h(op, 5);
    h.set_scalar("pos", HostArg::i64(0));
    h.set_scalar("base", HostArg::f32(base));
    ASSERT_TRUE(h.runs());
    const std::vector<float> got = h.device_f32("out");
    const std::vector<float> x = isa::to_f32(h.input_bytes("x"), isa::DType::kF32);
    ASSERT_EQ(got.size(), x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i]) << i;
  }
}

// One compiled kernel, many (pos, base) pairs: the scalars are read at run time.
TEST(Rope, SignatureTakesPositionAndBaseAtRunTime) {
  Rope op({.n_heads = 4, .head_dim = 256});
  const std::vector<isa::ArgSpec> sig = op.signature();
  ASSERT_EQ(sig.size(), 4u);
  EXPECT_EQ(sig[0].name, "x");
  EXPECT_EQ(sig[1].name, "out");
  EXPECT_TRUE(sig[2].is_scalar());
  EXPECT_EQ(sig[2].name, "pos");
  EXPECT_EQ(sig[2].dtype, isa::DType::kI32);
  EXPECT_TRUE(sig[3].is_scalar());
  EXPECT_EQ(sig[3].name, "base");
  EXPECT_EQ(sig[3].dtype, isa::DType::kF32);
}

// One compiled kernel launched for several (pos, base) pairs, with out bound to the
// same buffer as x: each result is bit-identical to a separate-buffer run.
TEST(Rope, OneKernelManyPositionsInPlace) {
  Rope op({.n_heads = 7, .head_dim = 64, .rotary_dim = 48, .heads_per_tile = 2, .cores = 3});
  auto loaded = testing::load_op(op);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  using testing::Bind;
  struct Step {
    int64_t pos;
    float base;
  };
  for (const Step step : {Step{37, 10000.f}, Step{4095, 1e6f}, Step{0, 1e6f}}) {
    OpHarness h(op, 21);
    h.set_scalar("pos", HostArg::i64(step.pos));
    h.set_scalar("base", HostArg::f32(step.base));
    ASSERT_TRUE(h.runs());
    const auto after = loaded->launch({h.input_bytes("x")}, {Bind::to(0), Bind::to(0),
                                                             Bind::value(hal::KernelArg::scalar_i64(step.pos)),
                                                             Bind::value(hal::KernelArg::scalar_f32(step.base))});
    ASSERT_TRUE(after.ok()) << after.status().to_string();
    EXPECT_EQ((*after)[0], h.device_bytes("out")) << "pos " << step.pos;
    EXPECT_LE(h.rel_l2("out"), rope_tolerance(step.pos)) << "pos " << step.pos;
  }
}

TEST(Rope, RejectsBadParameters) {
  expect_rejects<Rope>({.n_heads = 0, .head_dim = 256}, "n_heads");
  expect_rejects<Rope>({.n_heads = 70000, .head_dim = 256}, "n_heads");
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 0}, "head_dim");
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 255}, "head_dim");
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 65536}, "head_dim");
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 256, .rotary_dim = 127}, "rotary_dim");
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 256, .rotary_dim = 258}, "rotary_dim");
  expect_rejects<Rope>({.n_heads = 64, .head_dim = 4096, .heads_per_tile = 64}, "heads_per_tile");
  expect_rejects<Rope>({.n_heads = 1, .head_dim = 65534}, "head_dim");  // one head exceeds local memory
}

TEST(Rope, ReferenceChecksArguments) {
  Rope op({.n_heads = 1, .head_dim = 4});
  std::vector<uint8_t> x(16), out(16);
  std::vector<HostArg> args{HostArg::buffer(x), HostArg::buffer(out), HostArg::i64(1)};
  EXPECT_TRUE(testing::message_has(op.reference(args), "needs 4 arguments")) << op.reference(args).to_string();
  args.push_back(HostArg::buffer(out));
  EXPECT_TRUE(testing::message_has(op.reference(args), "'base' must be a scalar"));
}

}  // namespace
}  // namespace npurt::ops
