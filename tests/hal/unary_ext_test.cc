// TUN sin, cos and log on the simulated device against the C library in double:
// accuracy over each op's fast range, the special values, the slow path for
// out-of-range arguments, and their names in the verifier and disassembler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hal/sim/tile_kernels.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/verifier.h"
#include "sim_test_util.h"

namespace npurt {
namespace {

using namespace npurt::testing;
using namespace npurt::isa;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Highway documents 3 ulp for sin, cos and log; about 1.8 is what these inputs reach.
constexpr double kMaxUlp = 3;
// |sin - exact| over the fast range; f32 spacing below 1 is at most 6e-8.
constexpr double kMaxAbsTrig = 2e-7;

double ref(UnOp op, float x) {
  switch (op) {
    case UnOp::kSin: return std::sin(static_cast<double>(x));
    case UnOp::kCos: return std::cos(static_cast<double>(x));
    case UnOp::kLog: return std::log(static_cast<double>(x));
    default: ADD_FAILURE(); return 0;
  }
}

// Runs `tun op` in place over x (one 1 x n tile, so any n exercises the vector tail).
std::vector<float> run_unary(UnOp op, const std::vector<float>& x) {
  KernelBuilder b("tun");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0};
  const Tile t{0};
  b.li(zero, 0);
  b.tdef(t, DType::kF32, 1, static_cast<int>(x.size()), 0);
  b.tld(t, ax, zero, DType::kF32);
  b.tun(op, t, t);
  b.tst(t, aout, zero, DType::kF32);
  KernelRunner sim;
  const DeviceBuffer bx = sim.input(x);
  const DeviceBuffer bo = sim.input(std::vector<float>(x.size(), kNaN));
  const Status s = sim.run(b, {bx.arg(), bo.arg()});
  EXPECT_TRUE(s.ok()) << s.to_string();
  return sim.read<float>(bo);
}

// Error of `got` against the exact value `want`, in units in the last place of the
// f32 nearest `want`.
double ulp_error(float got, double want) {
  const float w = static_cast<float>(want);
  const double ulp = std::nextafter(std::fabs(w), kInf) - std::fabs(w);
  return std::fabs(got - want) / ulp;
}

struct Errors {
  double max_abs = 0;
  double max_ulp = 0;
};

Errors measure(UnOp op, const std::vector<float>& x, const std::vector<float>& got) {
  Errors e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = ref(op, x[i]);
    e.max_abs = std::max(e.max_abs, std::fabs(got[i] - want));
    e.max_ulp = std::max(e.max_ulp, ulp_error(got[i], want));
  }
  return e;
}

std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) { return random_floats(n, seed, lo, hi); }

// Positive floats with a uniformly random exponent over the whole normal range.
std::vector<float> log_uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> e(-125.9, 127.9);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(std::exp2(e(rng)));
  return v;
}

TEST(UnaryExt, SinCosSmallArguments) {
  const auto x = uniform(4099, 11, -10.f, 10.f);
  for (UnOp op : {UnOp::kSin, UnOp::kCos}) {
    const Errors e = measure(op, x, run_unary(op, x));
    EXPECT_LE(e.max_abs, kMaxAbsTrig) << static_cast<int>(op);
    EXPECT_LE(e.max_ulp, kMaxUlp) << static_cast<int>(op);  // results near 0 included
  }
}

// Over the whole fast range the absolute error stays that of f32 (the result's ulp
// is at most 6e-8); results very close to 0 lose relative accuracy to the range
// reduction, so the ulp bound applies where |result| >= 1e-3.
TEST(UnaryExt, SinCosFullFastRange) {
  const auto x = uniform(8191, 12, -39000.f, 39000.f);
  for (UnOp op : {UnOp::kSin, UnOp::kCos}) {
    const auto got = run_unary(op, x);
    double max_abs = 0, max_ulp = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = ref(op, x[i]);
      max_abs = std::max(max_abs, std::fabs(got[i] - want));
      if (std::fabs(want) >= 1e-3) max_ulp = std::max(max_ulp, ulp_error(got[i], want));
    }
    EXPECT_LE(max_abs, kMaxAbsTrig) << static_cast<int>(op);
    EXPECT_LE(max_ulp, kMaxUlp) << static_cast<int>(op);
  }
}

TEST(UnaryExt, SinCosBeyondFastRangeUseDouble) {
  const std::vector<float> x = {39000.f,  -39000.5f, 39001.f, 1e5f,  -123456.7f, 1e10f, -3e38f,
                                3.4028235e38f, 0.f, -0.f, 1e-30f, kInf, -kInf, kNaN, 7.f};
  for (UnOp op : {UnOp::kSin, UnOp::kCos}) {
    const auto got = run_unary(op, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = ref(op, x[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << x[i];
      } else {
        EXPECT_LE(std::fabs(got[i] - want), kMaxAbsTrig) << static_cast<int>(op) << " x " << x[i];
      }
    }
  }
  // Signed zero is preserved by sin.
  EXPECT_TRUE(std::signbit(run_unary(UnOp::kSin, {-0.f, 0.f})[0]));
}

TEST(UnaryExt, LogWholeRange) {
  auto x = log_uniform(4097, 13);
  const auto near_one = uniform(1000, 14, 0.5f, 2.f);  // where log's result is small
  x.insert(x.end(), near_one.begin(), near_one.end());
  const Errors e = measure(UnOp::kLog, x, run_unary(UnOp::kLog, x));
  EXPECT_LE(e.max_ulp, kMaxUlp);
}

TEST(UnaryExt, LogSpecialValues) {
  const float denorm_min = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {0.f, -0.f, -1.f, -1e-30f, -kInf, kInf, kNaN, 1.f, denorm_min, 1e-40f,
                                std::numeric_limits<float>::max()};
  const auto got = run_unary(UnOp::kLog, x);
  EXPECT_EQ(got[0], -kInf);
  EXPECT_EQ(got[1], -kInf);
  for (int i : {2, 3, 4, 6}) EXPECT_TRUE(std::isnan(got[i])) << x[i];
  EXPECT_EQ(got[5], kInf);
  EXPECT_EQ(got[7], 0.f);
  for (int i : {8, 9, 10}) EXPECT_LE(ulp_error(got[i], ref(UnOp::kLog, x[i])), kMaxUlp) << x[i];
}

// Out-of-range lanes mixed into a vector with in-range ones, in place and in the
// short tail, each get their own answer.
TEST(UnaryExt, MixedLanesInPlace) {
  std::vector<float> x = uniform(37, 15, -5.f, 5.f);
  x[3] = 1e6f;
  x[17] = kInf;
  x[36] = -2e5f;  // in the tail for every vector width
  for (UnOp op : {UnOp::kSin, UnOp::kCos}) {
    const auto got = run_unary(op, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = ref(op, x[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
      } else {
        EXPECT_LE(std::fabs(got[i] - want), kMaxAbsTrig) << i;
      }
    }
  }
  std::vector<float> y = uniform(37, 16, 0.1f, 10.f);
  y[0] = 0.f;
  y[20] = -3.f;
  y[36] = 2.f;
  const auto got = run_unary(UnOp::kLog, y);
  EXPECT_EQ(got[0], -kInf);
  EXPECT_TRUE(std::isnan(got[20]));
  for (size_t i = 1; i < y.size(); ++i) {
    if (i == 20) continue;
    EXPECT_LE(ulp_error(got[i], ref(UnOp::kLog, y[i])), kMaxUlp) << i;
  }
}

// The simulator picks AVX-512, AVX2 or the portable fallback from the CPU; each that
// this CPU runs must give the same accuracy and special values.
TEST(UnaryExt, EveryImplementation) {
  auto x = uniform(1000, 17, -39000.f, 39000.f);
  const std::vector<float> special = {0.f, -0.f, 1e6f, kInf, kNaN, -1.f, 1e-40f};
  x.insert(x.end(), special.begin(), special.end());
  for (int64_t target : sim::tile_kernels_targets()) {
    sim::tile_kernels_set_target_for_test(target);
    for (UnOp op : {UnOp::kSin, UnOp::kCos, UnOp::kLog}) {
      std::vector<float> in = x;
      if (op == UnOp::kLog) {
        for (size_t i = 0; i < in.size() - special.size(); ++i) in[i] = std::fabs(in[i]);
      }
      std::vector<float> got(in.size());
      sim::unary(op, in.data(), got.data(), in.size());
      for (size_t i = 0; i < in.size(); ++i) {
        const double want = ref(op, in[i]);
        const std::string where = std::string(sim::tile_kernels_target()) + " op " +
                                  std::to_string(static_cast<int>(op)) + " x " + std::to_string(in[i]);
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got[i])) << where;
        } else if (std::isinf(want)) {
          EXPECT_EQ(got[i], want) << where;
        } else if (op == UnOp::kLog) {
          EXPECT_LE(ulp_error(got[i], want), kMaxUlp) << where;
        } else {
          EXPECT_LE(std::fabs(got[i] - want), kMaxAbsTrig) << where;
        }
      }
    }
  }
  sim::tile_kernels_set_target_for_test(0);
}

TEST(UnaryExt, DisassemblyNames) {
  KernelBuilder b("names");
  b.tun(UnOp::kSin, Tile{1}, Tile{2});
  b.tun(UnOp::kCos, Tile{3}, Tile{4});
  b.tun(UnOp::kLog, Tile{5}, Tile{5});
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const std::string text = disassemble(*image);
  EXPECT_NE(text.find("0000: tun.sin t1, t2"), std::string::npos) << text;
  EXPECT_NE(text.find("0001: tun.cos t3, t4"), std::string::npos) << text;
  EXPECT_NE(text.find("0002: tun.log t5, t5"), std::string::npos) << text;
}

TEST(UnaryExt, CodesAreStableAndEndIsRejected) {
  EXPECT_EQ(static_cast<int>(UnOp::kAbs), 8);
  EXPECT_EQ(static_cast<int>(UnOp::kSin), 9);
  EXPECT_EQ(static_cast<int>(UnOp::kCos), 10);
  EXPECT_EQ(static_cast<int>(UnOp::kLog), 11);
  Insn insn{};
  insn.op = static_cast<uint8_t>(Opcode::kTun);
  insn.a = 1;
  insn.b = 2;
  insn.sub = static_cast<uint8_t>(UnOp::kLog);
  EXPECT_EQ(insn_structure_error(insn, 1), nullptr);
  insn.sub = static_cast<uint8_t>(UnOp::kEnd);
  EXPECT_STREQ(insn_structure_error(insn, 1), "sub-op: not a UnOp");
}

}  // namespace
}  // namespace npurt
