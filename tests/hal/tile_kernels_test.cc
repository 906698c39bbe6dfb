// Tile kernels against plain scalar references computed in double, on every compiled
// implementation this CPU can run (AVX3 / AVX2 / the portable fallback).
//
// Inputs are fresh random data each run; the base seed is printed with any failure and
// can be fixed with NPURT_TEST_SEED=<n>.

#include "hal/sim/tile_kernels.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace npurt::sim {
namespace {

using isa::BinOp;
using isa::DType;
using isa::RedOp;
using isa::UnOp;

// Named tolerances (relative L2 error against the double reference).
constexpr double kTolArith = 1e-6;          // f32 arithmetic with one or two roundings
constexpr double kTolTranscendental = 1e-5;  // polynomial exp / tanh and ops built on them
constexpr double kTolMatmul = 1e-6;          // f32 accumulation vs exact sums

const size_t kSizes[] = {1, 3, 7, 15, 17, 63, 65, 257, 1000};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- Random data ------------------------------------------------------------------------

uint64_t BaseSeed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("NPURT_TEST_SEED")) {
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 0));
    }
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) | static_cast<uint64_t>(device());
  }();
  return seed;
}

class Random {
 public:
  explicit Random(uint64_t seed) : gen_(seed) {}

  float Uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  // Magnitude in [lo, hi] with a random sign: never zero for lo > 0.
  float Signed(float lo, float hi) { return (gen_() & 1 ? -1.0f : 1.0f) * Uniform(lo, hi); }
  uint32_t Bits32() { return static_cast<uint32_t>(gen_()); }
  size_t Index(size_t n) { return static_cast<size_t>(gen_() % n); }

  std::vector<float> SignedVector(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = Signed(lo, hi);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

// ---- Reference conversions --------------------------------------------------------------

// The value of a 16-bit float (sign, exponent, `mant_bits` mantissa bits) by its
// definition, not by bit manipulation.
double Float16Value(uint16_t h, int mant_bits) {
  const int exp_all_ones = (1 << (15 - mant_bits)) - 1, bias = exp_all_ones / 2;
  const int exp = (h >> mant_bits) & exp_all_ones;
  const int mant = h & ((1 << mant_bits) - 1);
  double mag;
  if (exp == 0) {
    mag = std::ldexp(mant, 1 - bias - mant_bits);
  } else if (exp == exp_all_ones) {
    mag = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    mag = std::ldexp((1 << mant_bits) + mant, exp - bias - mant_bits);
  }
  return (h & 0x8000) ? -mag : mag;
}

double BF16Value(uint16_t h) { return Float16Value(h, 7); }
double F16Value(uint16_t h) { return Float16Value(h, 10); }

// Rounds f to the nearest value of a 16-bit format, ties to the even encoding.
// `positive` lists the format's finite non-negative values by encoding;
// `overflow_at` is the magnitude from which the result is infinite; `inf` is the
// infinity encoding. NaN maps to the quiet NaN `nan`.
uint16_t RoundTo16(float f, const std::vector<double>& positive, double overflow_at,
                   uint16_t inf, uint16_t nan) {
  if (std::isnan(f)) return nan;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= overflow_at) return sign | inf;
  const size_t lo = static_cast<size_t>(std::upper_bound(positive.begin(), positive.end(), a) -
                                        positive.begin()) - 1;
  if (lo + 1 == positive.size()) return static_cast<uint16_t>(sign | lo);
  const double below = a - positive[lo];
  const double above = positive[lo + 1] - a;
  size_t h = below < above ? lo : (above < below ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1));
  return static_cast<uint16_t>(sign | h);
}

std::vector<double> PositiveValues(double (*value)(uint16_t), uint16_t max_finite) {
  std::vector<double> v;
  for (uint32_t h = 0; h <= max_finite; ++h) v.push_back(value(static_cast<uint16_t>(h)));
  return v;
}

uint16_t RefToBF16(float f) {
  static const std::vector<double> positive = PositiveValues(&BF16Value, 0x7F7F);
  // Midpoint between the largest bf16 and 2^128.
  static const double overflow_at = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);
  return RoundTo16(f, positive, overflow_at, 0x7F80, 0x7FC0);
}

uint16_t RefToF16(float f) {
  static const std::vector<double> positive = PositiveValues(&F16Value, 0x7BFF);
  return RoundTo16(f, positive, 65520.0, 0x7C00, 0x7E00);
}

int32_t RefToI32(float f) {
  if (std::isnan(f)) return 0;
  const double t = std::trunc(static_cast<double>(f));
  if (t >= 2147483647.0) return std::numeric_limits<int32_t>::max();
  if (t <= -2147483648.0) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(t);
}

size_t SizeOf(DType t) { return t == DType::kBF16 || t == DType::kF16 ? 2 : 4; }

// Element i of a plain-typed array as f32 (the first step of every conversion).
float RefElementToF32(DType type, const std::vector<uint8_t>& bytes, size_t i) {
  const uint8_t* p = bytes.data() + i * SizeOf(type);
  switch (type) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(BF16Value(h));
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(F16Value(h));
    }
    default: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<float>(v);  // round to nearest even
    }
  }
}

// The encoding of f in `type`, as raw bits in the low bytes of a uint32.
uint32_t RefFromF32(DType type, float f) {
  switch (type) {
    case DType::kF32:
      return std::bit_cast<uint32_t>(f);
    case DType::kBF16:
      return RefToBF16(f);
    case DType::kF16:
      return RefToF16(f);
    default:
      return static_cast<uint32_t>(RefToI32(f));
  }
}

bool IsNaNEncoding(DType type, uint32_t bits) {
  switch (type) {
    case DType::kF32:
      return std::isnan(std::bit_cast<float>(bits));
    case DType::kBF16:
      return (bits & 0x7F80) == 0x7F80 && (bits & 0x7F) != 0;
    case DType::kF16:
      return (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0;
    default:
      return false;
  }
}

uint32_t EncodingAt(DType type, const std::vector<uint8_t>& bytes, size_t i) {
  uint32_t bits = 0;
  std::memcpy(&bits, bytes.data() + i * SizeOf(type), SizeOf(type));
  return bits;
}

// ---- Other scalar references ------------------------------------------------------------

double RefBinary(BinOp op, double a, double b) {
  switch (op) {
    case BinOp::kAdd:
      return a + b;
    case BinOp::kSub:
      return a - b;
    case BinOp::kMul:
      return a * b;
    case BinOp::kDiv:
      return a / b;
    case BinOp::kMax:
      return a > b ? a : b;
    default:
      return a < b ? a : b;
  }
}

double RefUnary(UnOp op, double x) {
  switch (op) {
    case UnOp::kExp:
      return std::exp(x);
    case UnOp::kRsqrt:
      return 1.0 / std::sqrt(x);
    case UnOp::kSqrt:
      return std::sqrt(x);
    case UnOp::kTanh:
      return std::tanh(x);
    case UnOp::kGeluTanh: {
      // 0.5x(1 + tanh(u)) written as x / (1 + exp(-2u)): for x below about -5,
      // 1 + tanh(u) cancels to noise even in double.
      const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
      return x / (1.0 + std::exp(-2.0 * u));
    }
    case UnOp::kSilu:
      return x / (1.0 + std::exp(-x));
    case UnOp::kRecip:
      return 1.0 / x;
    case UnOp::kNeg:
      return -x;
    default:
      return std::fabs(x);
  }
}

// NaNs count as -inf, as documented for the kernels.
double RefReduce(RedOp op, const float* row, size_t cols) {
  double acc = op == RedOp::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
  int32_t best = cols ? 0 : -1;
  double best_value = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < cols; ++j) {
    const double x = std::isnan(row[j]) ? -std::numeric_limits<double>::infinity() : row[j];
    switch (op) {
      case RedOp::kSum:
        acc += x;
        break;
      case RedOp::kSumSq:
        acc += x * x;
        break;
      case RedOp::kMax:
        acc = std::max(acc, x);
        break;
      default:
        if (x > best_value) {
          best_value = x;
          best = static_cast<int32_t>(j);
        }
    }
  }
  return op == RedOp::kArgmax ? best : acc;
}

// ---- Comparison helpers -----------------------------------------------------------------

// sqrt(sum (got - want)^2 / sum scale^2), with scale = |want| by default. Sums pass
// scale = the sum of the terms' magnitudes: an f32 sum is accurate relative to that,
// while its error relative to a result that cancels to near zero is unbounded. For
// inputs of one sign both scales are the same.
double RelL2(const float* got, const std::vector<double>& want,
             const std::vector<double>* scale = nullptr) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = static_cast<double>(got[i]) - want[i];
    const double s = scale ? (*scale)[i] : want[i];
    err += diff * diff;
    norm += s * s;
  }
  return norm == 0.0 ? std::sqrt(err) : std::sqrt(err / norm);
}

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

const char* Name(BinOp op) {
  static const char* const kNames[] = {"add", "sub", "mul", "div", "max", "min"};
  return kNames[static_cast<int>(op)];
}
const char* Name(UnOp op) {
  static const char* const kNames[] = {"exp",  "rsqrt", "sqrt", "tanh", "gelu_tanh",
                                       "silu", "recip", "neg",  "abs"};
  return kNames[static_cast<int>(op)];
}
const char* Name(RedOp op) {
  static const char* const kNames[] = {"sum", "max", "sumsq", "argmax"};
  return kNames[static_cast<int>(op)];
}
const char* Name(DType t) {
  static const char* const kNames[] = {"f32", "bf16", "f16", "i32"};
  return kNames[static_cast<int>(t)];
}

constexpr BinOp kBinOps[] = {BinOp::kAdd, BinOp::kSub, BinOp::kMul,
                             BinOp::kDiv, BinOp::kMax, BinOp::kMin};
constexpr UnOp kUnOps[] = {UnOp::kExp,      UnOp::kRsqrt, UnOp::kSqrt,
                           UnOp::kTanh,     UnOp::kGeluTanh, UnOp::kSilu,
                           UnOp::kRecip,    UnOp::kNeg,   UnOp::kAbs};
constexpr RedOp kRedOps[] = {RedOp::kSum, RedOp::kMax, RedOp::kSumSq, RedOp::kArgmax};
constexpr DType kPlainTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};
constexpr DType kMatmulTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Values written past the end of outputs; they must survive every call.
constexpr float kCanary = 12345.678f;
constexpr size_t kGuard = 19;

// ---- Fixture: one instance per compiled target ---------------------------------------------

class TileKernelsTest : public ::testing::TestWithParam<int64_t> {
 protected:
  TileKernelsTest()
      : trace_(__FILE__, __LINE__,
               "NPURT_TEST_SEED=" + std::to_string(BaseSeed()) + " target " +
                   hwy::TargetName(GetParam())),
        rng_(BaseSeed() ^ std::hash<std::string>()(
                              ::testing::UnitTest::GetInstance()->current_test_info()->name())) {}

  void SetUp() override { tile_kernels_set_target_for_test(GetParam()); }
  void TearDown() override { tile_kernels_set_target_for_test(0); }

  ::testing::ScopedTrace trace_;
  Random rng_;
};

TEST_P(TileKernelsTest, RunsRequestedTarget) {
  EXPECT_STREQ(tile_kernels_target(), hwy::TargetName(GetParam()));
  EXPECT_GT(tile_kernels_fma_probe(10), 0u);
}

// ---- convert ----------------------------------------------------------------------------

// Hand-picked f32 inputs: rounding ties, range edges, subnormals, specials.
std::vector<float> SpecialFloats() {
  std::vector<float> v = {0.0f, -0.0f, kInf, -kInf, kNaN, -kNaN,
                          std::bit_cast<float>(0x7F800001u),  // signaling NaN
                          std::bit_cast<float>(0xFFC12345u),
                          65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f, 1e10f,
                          std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
                          std::ldexp(3.0f, -25), std::ldexp(1.0f, -14), std::ldexp(1023.0f, -24),
                          std::ldexp(2047.0f, -25), std::ldexp(1.0f, -26),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          2147483520.0f, 2147483648.0f, -2147483648.0f, -2147483904.0f,
                          1.5f, 2.5f, -2.5f, 0.99999994f, -1.9999999f, 3e9f, -3e9f};
  // bf16 ties (low half exactly 0x8000) with even and odd kept bits.
  for (uint32_t hi : {0x3F80u, 0x3F81u, 0xC2F7u, 0x7F7Fu, 0x0001u, 0x8000u}) {
    v.push_back(std::bit_cast<float>((hi << 16) | 0x8000u));
  }
  // f16 ties (dropped 13 bits exactly 0x1000) in the normal and subnormal range.
  for (uint32_t bits : {0x3F801000u, 0x3F803000u, 0x477FE000u, 0x387FF000u, 0x33801000u}) {
    v.push_back(std::bit_cast<float>(bits));
  }
  return v;
}

// Fills n elements of `type`: mostly typical values, some specials and raw patterns.
std::vector<uint8_t> ConvertInput(DType type, size_t n, Random& rng) {
  static const std::vector<float> specials = SpecialFloats();
  std::vector<uint8_t> bytes(n * SizeOf(type));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t pick = rng.Bits32() % 8;
    uint32_t bits = 0;
    if (type == DType::kI32) {
      const int32_t extremes[] = {std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min(), 16777217, -16777217,
                                  (1 << 24) + (1 << 16) + 1, 65519, 65520};
      bits = pick == 0   ? static_cast<uint32_t>(extremes[rng.Index(std::size(extremes))])
             : pick < 4 ? rng.Bits32()
                        : static_cast<uint32_t>(static_cast<int32_t>(rng.Signed(1.0f, 70000.0f)));
    } else if (type == DType::kF32) {
      bits = pick == 0   ? std::bit_cast<uint32_t>(specials[rng.Index(specials.size())])
             : pick < 3 ? rng.Bits32()
                        : std::bit_cast<uint32_t>(rng.Signed(1e-6f, 7e4f));
    } else {
      bits = rng.Bits32() & 0xFFFF;  // every 16-bit pattern is a valid input
    }
    std::memcpy(bytes.data() + i * SizeOf(type), &bits, SizeOf(type));
  }
  return bytes;
}

// Runs convert(src -> dst) on n elements starting `offset` elements into both arrays
// (so that offset 1 leaves every access unaligned) and checks every element against the
// reference, plus guard bytes after the output.
void CheckConvert(DType src_type, DType dst_type, const std::vector<uint8_t>& src, size_t n,
                  size_t offset = 0) {
  const size_t src_size = SizeOf(src_type);
  const size_t dst_size = SizeOf(dst_type);
  std::vector<uint8_t> dst((offset + n + kGuard) * dst_size, 0xA5);
  convert(src.data() + offset * src_size, src_type, dst.data() + offset * dst_size, dst_type, n);
  for (size_t i = offset; i < offset + n; ++i) {
    const uint32_t got = EncodingAt(dst_type, dst, i);
    const uint32_t want = src_type == dst_type
                              ? EncodingAt(src_type, src, i)
                              : RefFromF32(dst_type, RefElementToF32(src_type, src, i));
    if (IsNaNEncoding(dst_type, want)) {
      ASSERT_TRUE(IsNaNEncoding(dst_type, got))
          << Name(src_type) << "->" << Name(dst_type) << " i=" << i;
    } else {
      ASSERT_EQ(got, want) << Name(src_type) << "->" << Name(dst_type) << " n=" << n
                           << " i=" << i << " src bits 0x" << std::hex
                           << EncodingAt(src_type, src, i);
    }
  }
  for (size_t i = 0; i < dst.size(); ++i) {
    if (i < offset * dst_size || i >= (offset + n) * dst_size) {
      ASSERT_EQ(dst[i], 0xA5) << "overrun";
    }
  }
}

TEST_P(TileKernelsTest, ConvertAllTypePairsAllSizes) {
  for (DType src_type : kPlainTypes) {
    for (DType dst_type : kPlainTypes) {
      for (size_t n : kSizes) {
        CheckConvert(src_type, dst_type, ConvertInput(src_type, n, rng_), n);
      }
    }
  }
}

TEST_P(TileKernelsTest, ConvertEverySixteenBitPattern) {
  std::vector<uint8_t> all(65536 * 2);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(all.data() + 2 * h, &bits, 2);
  }
  for (DType src_type : {DType::kBF16, DType::kF16}) {
    for (DType dst_type : kPlainTypes) CheckConvert(src_type, dst_type, all, 65536);
  }
}

TEST_P(TileKernelsTest, ConvertSpecialFloats) {
  const std::vector<float> specials = SpecialFloats();
  std::vector<uint8_t> bytes(specials.size() * 4);
  std::memcpy(bytes.data(), specials.data(), bytes.size());
  for (DType dst_type : kPlainTypes) CheckConvert(DType::kF32, dst_type, bytes, specials.size());
}

TEST_P(TileKernelsTest, ConvertUnalignedAndEmpty) {
  for (DType src_type : kPlainTypes) {
    for (DType dst_type : kPlainTypes) {
      CheckConvert(src_type, dst_type, ConvertInput(src_type, 66, rng_), 65, 1);
      convert(nullptr, src_type, nullptr, dst_type, 0);  // n == 0 touches nothing
    }
  }
}

// ---- binary / binary_scalar -------------------------------------------------------------

// Operands for an op: divisors and everything else stay away from zero.
std::vector<float> BinaryOperand(size_t n, Random& rng) {
  return rng.SignedVector(n, 0.01f, 100.0f);
}

void ExpectBinaryMatches(BinOp op, const std::vector<float>& a, const std::vector<float>& b,
                         const float* got, size_t n, const char* what) {
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = RefBinary(op, a[i], b[i]);
  EXPECT_LE(RelL2(got, want), kTolArith) << Name(op) << " " << what << " n=" << n;
  // Each result is one correctly rounded f32 operation, so it must be exact.
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], static_cast<float>(want[i])) << Name(op) << " " << what << " i=" << i;
  }
}

TEST_P(TileKernelsTest, BinaryAllOpsSizesAndAliasing) {
  for (BinOp op : kBinOps) {
    for (size_t n : kSizes) {
      const std::vector<float> a = BinaryOperand(n, rng_);
      const std::vector<float> b = BinaryOperand(n, rng_);
      std::vector<float> out(n + kGuard, kCanary);
      binary(op, a.data(), b.data(), out.data(), n);
      ExpectBinaryMatches(op, a, b, out.data(), n, "separate");
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], kCanary);

      std::vector<float> in_a = a;  // out aliases a
      binary(op, in_a.data(), b.data(), in_a.data(), n);
      ExpectBinaryMatches(op, a, b, in_a.data(), n, "out=a");

      std::vector<float> in_b = b;  // out aliases b
      binary(op, a.data(), in_b.data(), in_b.data(), n);
      ExpectBinaryMatches(op, a, b, in_b.data(), n, "out=b");

      std::vector<float> all = a;  // a, b and out are one array
      binary(op, all.data(), all.data(), all.data(), n);
      ExpectBinaryMatches(op, a, a, all.data(), n, "a=b=out");
    }
  }
}

TEST_P(TileKernelsTest, BinaryScalarAllOpsSizesAndAliasing) {
  for (BinOp op : kBinOps) {
    for (size_t n : kSizes) {
      const std::vector<float> a = BinaryOperand(n, rng_);
      const float s = rng_.Signed(0.01f, 100.0f);
      const std::vector<float> b(n, s);
      std::vector<float> out(n + kGuard, kCanary);
      binary_scalar(op, a.data(), s, out.data(), n);
      ExpectBinaryMatches(op, a, b, out.data(), n, "scalar");
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], kCanary);

      std::vector<float> in_place = a;
      binary_scalar(op, in_place.data(), s, in_place.data(), n);
      ExpectBinaryMatches(op, a, b, in_place.data(), n, "scalar out=a");
    }
  }
}

TEST_P(TileKernelsTest, MaxMinWithNaNReturnSecondOperand) {
  const std::vector<float> a = {kNaN, 1.0f, kNaN, -2.0f, 3.0f};
  const std::vector<float> b = {1.0f, kNaN, kNaN, -3.0f, 4.0f};
  for (BinOp op : {BinOp::kMax, BinOp::kMin}) {
    std::vector<float> out(a.size());
    binary(op, a.data(), b.data(), out.data(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(SameFloat(out[i], static_cast<float>(RefBinary(op, a[i], b[i]))))
          << Name(op) << " i=" << i;
    }
  }
}

// ---- unary ------------------------------------------------------------------------------

struct UnaryCase {
  float lo, hi;     // magnitude range of random inputs
  bool positive;    // inputs must be positive
  bool exact;       // one correctly rounded operation
  double tolerance;
};

UnaryCase CaseFor(UnOp op) {
  switch (op) {
    case UnOp::kExp: return {0.001f, 20.0f, false, false, kTolTranscendental};
    case UnOp::kRsqrt: return {0.001f, 1000.0f, true, false, kTolArith};
    case UnOp::kSqrt: return {0.001f, 1000.0f, true, true, kTolArith};
    case UnOp::kTanh: return {0.001f, 10.0f, false, false, kTolTranscendental};
    case UnOp::kGeluTanh: return {0.001f, 8.0f, false, false, kTolTranscendental};
    case UnOp::kSilu: return {0.001f, 20.0f, false, false, kTolTranscendental};
    default: return {0.001f, 1000.0f, false, true, kTolArith};  // recip, neg, abs
  }
}

TEST_P(TileKernelsTest, UnaryAllOpsSizesAndAliasing) {
  for (UnOp op : kUnOps) {
    const UnaryCase c = CaseFor(op);
    for (size_t n : kSizes) {
      std::vector<float> in(n);
      for (float& x : in) x = c.positive ? rng_.Uniform(c.lo, c.hi) : rng_.Signed(c.lo, c.hi);
      std::vector<double> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = RefUnary(op, in[i]);

      std::vector<float> out(n + kGuard, kCanary);
      unary(op, in.data(), out.data(), n);
      EXPECT_LE(RelL2(out.data(), want), c.tolerance) << Name(op) << " n=" << n;
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], kCanary);
      if (c.exact) {
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], static_cast<float>(want[i])) << Name(op);
      }

      std::vector<float> in_place = in;
      unary(op, in_place.data(), in_place.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(in_place[i], out[i]) << Name(op) << " in place";
    }
  }
}

TEST_P(TileKernelsTest, UnaryTranscendentalsAccurateNearZeroAndMidRange) {
  // Relative accuracy of small outputs is invisible in a whole-vector L2 norm.
  for (UnOp op : {UnOp::kExp, UnOp::kTanh, UnOp::kGeluTanh, UnOp::kSilu}) {
    std::vector<float> in(257);
    for (float& x : in) x = rng_.Signed(1e-4f, 3.0f);
    std::vector<float> out(in.size());
    unary(op, in.data(), out.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      const double want = RefUnary(op, in[i]);
      EXPECT_NEAR(out[i], want, 1e-5 * std::fabs(want) + 1e-30) << Name(op) << " x=" << in[i];
    }
  }
}

TEST_P(TileKernelsTest, UnarySpecialValues) {
  const float big = 200.0f;
  const std::vector<float> in = {kNaN, kInf, -kInf, big, -big, 0.0f, -0.0f};
  for (UnOp op : kUnOps) {
    std::vector<float> out(in.size());
    unary(op, in.data(), out.data(), in.size());
    EXPECT_TRUE(std::isnan(out[0])) << Name(op) << " keeps NaN";
  }
  std::vector<float> out(in.size());
  unary(UnOp::kExp, in.data(), out.data(), in.size());
  EXPECT_EQ(out[1], kInf);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[3], kInf);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 1.0f);
  unary(UnOp::kTanh, in.data(), out.data(), in.size());
  EXPECT_EQ(out[1], 1.0f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[3], 1.0f);
  EXPECT_EQ(out[4], -1.0f);
  EXPECT_EQ(out[5], 0.0f);
  unary(UnOp::kGeluTanh, in.data(), out.data(), in.size());
  EXPECT_EQ(out[1], kInf);
  EXPECT_EQ(out[3], big);
  EXPECT_EQ(out[4], 0.0f);
  unary(UnOp::kSilu, in.data(), out.data(), in.size());
  EXPECT_EQ(out[1], kInf);
  EXPECT_EQ(out[3], big);
  EXPECT_EQ(out[4], 0.0f);
  unary(UnOp::kRsqrt, in.data(), out.data(), in.size());
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[5], kInf);
  unary(UnOp::kRecip, in.data(), out.data(), in.size());
  EXPECT_EQ(out[6], -kInf);
  unary(UnOp::kAbs, in.data(), out.data(), in.size());
  EXPECT_EQ(out[2], kInf);
  EXPECT_FALSE(std::signbit(out[6]));
}

// ---- reduce_rows ------------------------------------------------------------------------

void CheckReduce(RedOp op, const std::vector<float>& in, size_t rows, size_t cols) {
  std::vector<float> out(rows + kGuard, kCanary);
  reduce_rows(op, in.data(), rows, cols, out.data());
  std::vector<double> want(rows);
  for (size_t r = 0; r < rows; ++r) want[r] = RefReduce(op, in.data() + r * cols, cols);
  if (op == RedOp::kArgmax) {
    for (size_t r = 0; r < rows; ++r) {
      int32_t got;
      std::memcpy(&got, &out[r], sizeof(got));
      ASSERT_EQ(got, static_cast<int32_t>(want[r])) << "argmax row " << r << " cols " << cols;
    }
  } else if (op == RedOp::kMax) {
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_EQ(out[r], static_cast<float>(want[r])) << "max row " << r;
    }
  } else {
    std::vector<double> magnitude(rows);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t j = 0; j < cols; ++j) {
        const double x = in[r * cols + j];
        magnitude[r] += op == RedOp::kSumSq ? x * x : std::fabs(x);
      }
    }
    EXPECT_LE(RelL2(out.data(), want, &magnitude), kTolArith)
        << Name(op) << " rows " << rows << " cols " << cols;
  }
  for (size_t i = rows; i < out.size(); ++i) ASSERT_EQ(out[i], kCanary) << Name(op);
}

TEST_P(TileKernelsTest, ReduceAllOpsAndSizes) {
  for (RedOp op : kRedOps) {
    for (size_t rows : {1, 3, 7}) {
      for (size_t cols : kSizes) {
        CheckReduce(op, rng_.SignedVector(rows * cols, 0.01f, 10.0f), rows, cols);
        std::vector<float> positive(rows * cols);
        for (float& x : positive) x = rng_.Uniform(0.01f, 10.0f);
        CheckReduce(op, positive, rows, cols);
      }
    }
  }
}

TEST_P(TileKernelsTest, ReduceEmptyRowsAndColumns) {
  for (RedOp op : kRedOps) {
    CheckReduce(op, {}, 3, 0);  // sums 0, max -inf, argmax -1
    CheckReduce(op, {}, 0, 5);  // writes nothing
  }
}

TEST_P(TileKernelsTest, ArgmaxPicksFirstOfEqualMaxima) {
  for (size_t cols : kSizes) {
    std::vector<float> row = rng_.SignedVector(cols, 0.01f, 10.0f);
    const size_t first = rng_.Index(cols);
    const size_t second = first + rng_.Index(cols - first);
    row[first] = row[second] = 20.0f;
    CheckReduce(RedOp::kArgmax, row, 1, cols);
    CheckReduce(RedOp::kMax, row, 1, cols);
  }
}

TEST_P(TileKernelsTest, MaxAndArgmaxTreatNaNAsMinusInfinity) {
  const size_t cols = 37;
  std::vector<float> rows(4 * cols);
  for (size_t j = 0; j < cols; ++j) {
    rows[j] = (j % 3 == 0) ? kNaN : rng_.Signed(0.01f, 10.0f);  // NaNs among values
    rows[cols + j] = kNaN;                                        // all NaN
    rows[2 * cols + j] = -kInf;                                   // all -inf
    rows[3 * cols + j] = (j == 20) ? -kInf : kNaN;                // NaN then -inf
  }
  rows[0] = kNaN;
  CheckReduce(RedOp::kMax, rows, 4, cols);
  CheckReduce(RedOp::kArgmax, rows, 4, cols);
}

// ---- matmul -----------------------------------------------------------------------------

// A matmul operand: its bytes in `type` and the exact values they encode.
struct Operand {
  DType type;
  std::vector<uint8_t> bytes;
  std::vector<double> values;
};

// Random magnitudes in [2^-5, 1), drawn directly as encodings so that the values are
// exact in `type`; negative with probability 1/2 unless `positive`.
Operand MakeOperand(DType type, size_t count, bool positive, Random& rng) {
  Operand op{type, std::vector<uint8_t>(count * SizeOf(type)), std::vector<double>(count)};
  for (size_t i = 0; i < count; ++i) {
    const uint32_t r = rng.Bits32();
    const bool negative = !positive && (r & 1);
    uint32_t bits;
    if (type == DType::kF32) {
      bits = std::bit_cast<uint32_t>(rng.Uniform(0.03125f, 1.0f)) | (negative ? 0x80000000u : 0);
      op.values[i] = std::bit_cast<float>(bits);
    } else if (type == DType::kBF16) {
      bits = ((122 + (r >> 1) % 5) << 7) | ((r >> 8) & 0x7F) | (negative ? 0x8000u : 0);
      op.values[i] = BF16Value(static_cast<uint16_t>(bits));
    } else {
      bits = ((10 + (r >> 1) % 5) << 10) | ((r >> 8) & 0x3FF) | (negative ? 0x8000u : 0);
      op.values[i] = F16Value(static_cast<uint16_t>(bits));
    }
    std::memcpy(op.bytes.data() + i * SizeOf(type), &bits, SizeOf(type));
  }
  return op;
}

struct Shape {
  size_t m, n, k;
};

// The exact result and, in `magnitude`, the same sum over absolute values.
std::vector<double> RefMatmul(const Operand& a, const Operand& b, const std::vector<float>& c0,
                              const Shape& s, bool trans_b, bool accumulate,
                              std::vector<double>* magnitude) {
  std::vector<double> c(s.m * s.n);
  magnitude->assign(s.m * s.n, 0.0);
  for (size_t i = 0; i < s.m; ++i) {
    for (size_t j = 0; j < s.n; ++j) {
      double sum = accumulate ? c0[i * s.n + j] : 0.0;
      double mag = std::fabs(sum);
      for (size_t p = 0; p < s.k; ++p) {
        const double prod = a.values[i * s.k + p] * b.values[trans_b ? j * s.k + p : p * s.n + j];
        sum += prod;
        mag += std::fabs(prod);
      }
      c[i * s.n + j] = sum;
      (*magnitude)[i * s.n + j] = mag;
    }
  }
  return c;
}

void CheckMatmul(DType a_type, DType b_type, const Shape& s, bool trans_b, bool accumulate,
                 bool positive, Random& rng) {
  const Operand a = MakeOperand(a_type, s.m * s.k, positive, rng);
  const Operand b = MakeOperand(b_type, s.k * s.n, positive, rng);
  std::vector<float> c(s.m * s.n);
  for (float& x : c) x = positive ? rng.Uniform(0.05f, 1.0f) : rng.Signed(0.05f, 1.0f);
  const std::vector<float> c0 = c;
  c.resize(s.m * s.n + kGuard, kCanary);
  matmul(a.bytes.data(), a_type, b.bytes.data(), b_type, c.data(), s.m, s.n, s.k, trans_b,
         accumulate);
  std::vector<double> magnitude;
  const std::vector<double> want = RefMatmul(a, b, c0, s, trans_b, accumulate, &magnitude);
  EXPECT_LE(RelL2(c.data(), want, &magnitude), kTolMatmul)
      << Name(a_type) << " x " << Name(b_type) << " m=" << s.m << " n=" << s.n << " k=" << s.k
      << (trans_b ? " trans_b" : "") << (accumulate ? " accumulate" : "")
      << (positive ? " positive" : " signed");
  for (size_t i = s.m * s.n; i < c.size(); ++i) ASSERT_EQ(c[i], kCanary) << "overrun";
}

// Edge classes: single row/column/element, sizes around the vector widths (8, 16),
// register blocks and the kernels' switch from dot products to outer products
// (64 rows and two vectors of columns with trans_b), long k, the GEMV shape and a
// square tile.
const Shape kShapes[] = {{1, 1, 1},     {1, 1, 7},     {3, 1, 1000},  {7, 3, 15},
                         {17, 15, 63},  {15, 17, 65},  {63, 65, 17},  {65, 63, 257},
                         {1, 257, 3},   {257, 7, 65},  {3, 1000, 7},  {65, 65, 1000},
                         {128, 1, 2048}, {64, 64, 64}, {9, 33, 31},   {13, 2, 129},
                         {33, 16, 40},  {40, 8, 9},    {64, 32, 33},  {31, 5, 300},
                         {64, 16, 10},  {100, 31, 70}};

TEST_P(TileKernelsTest, MatmulAllTypesShapesAndModes) {
  for (DType a_type : kMatmulTypes) {
    for (DType b_type : kMatmulTypes) {
      for (const Shape& s : kShapes) {
        for (bool trans_b : {false, true}) {
          for (bool accumulate : {false, true}) {
            for (bool positive : {true, false}) {
              CheckMatmul(a_type, b_type, s, trans_b, accumulate, positive, rng_);
            }
          }
        }
      }
    }
  }
}

TEST_P(TileKernelsTest, MatmulEmptyShapes) {
  std::vector<float> c = {1.0f, 2.0f, 3.0f, 4.0f};
  const float a[4] = {1, 2, 3, 4};
  matmul(a, DType::kF32, a, DType::kF32, c.data(), 2, 2, 0, false, true);
  EXPECT_EQ(c, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));  // k == 0 accumulating: unchanged
  matmul(a, DType::kF32, a, DType::kF32, c.data(), 2, 2, 0, true, false);
  EXPECT_EQ(c, (std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f}));  // k == 0: zeroed
  c = {5.0f, 5.0f, 5.0f, 5.0f};
  matmul(a, DType::kF32, a, DType::kF32, c.data(), 0, 2, 2, false, false);
  matmul(a, DType::kF32, a, DType::kF32, c.data(), 2, 0, 2, true, false);
  EXPECT_EQ(c, (std::vector<float>{5.0f, 5.0f, 5.0f, 5.0f}));  // no rows / columns: untouched
}

TEST_P(TileKernelsTest, MatmulRepeatedCallsReuseScratchCorrectly) {
  // A large call grows the scratch buffers; smaller calls after it must not see stale data.
  CheckMatmul(DType::kBF16, DType::kF16, {33, 70, 300}, false, false, false, rng_);
  CheckMatmul(DType::kF16, DType::kBF16, {5, 3, 41}, true, true, false, rng_);
  CheckMatmul(DType::kBF16, DType::kF32, {5, 70, 41}, false, true, false, rng_);
}

std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) {
  return hwy::TargetName(info.param);
}

INSTANTIATE_TEST_SUITE_P(Targets, TileKernelsTest, ::testing::ValuesIn(tile_kernels_targets()),
                         TargetParamName);

// The bits of every sum and elementwise function on fresh random data: matmul over
// kShapes (every type pair, both B layouts, accumulating onto random C), row sums and
// sums of squares of every length up to 70 and of 640, and the transcendental ops.
std::vector<uint32_t> KernelBits(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto randoms = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  std::vector<uint32_t> bits;
  const auto keep = [&](const std::vector<float>& v) {
    for (float x : v) bits.push_back(std::bit_cast<uint32_t>(x));
  };
  for (DType a_type : kMatmulTypes) {
    for (DType b_type : kMatmulTypes) {
      for (const Shape& s : kShapes) {
        for (bool trans_b : {false, true}) {
          const std::vector<float> a = randoms(s.m * s.k), b = randoms(s.k * s.n);
          std::vector<uint16_t> a16(a.size()), b16(b.size());
          convert(a.data(), DType::kF32, a16.data(), a_type == DType::kF32 ? DType::kBF16 : a_type, a.size());
          convert(b.data(), DType::kF32, b16.data(), b_type == DType::kF32 ? DType::kBF16 : b_type, b.size());
          const void* ap = a_type == DType::kF32 ? static_cast<const void*>(a.data()) : a16.data();
          const void* bp = b_type == DType::kF32 ? static_cast<const void*>(b.data()) : b16.data();
          std::vector<float> c = randoms(s.m * s.n);
          matmul(ap, a_type, bp, b_type, c.data(), s.m, s.n, s.k, trans_b, /*accumulate=*/true);
          keep(c);
        }
      }
    }
  }
  for (RedOp op : {RedOp::kSum, RedOp::kSumSq}) {
    for (size_t cols : {size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{31}, size_t{33},
                        size_t{70}, size_t{640}}) {
      const std::vector<float> in = randoms(3 * cols);
      std::vector<float> out(3);
      reduce_rows(op, in.data(), 3, cols, out.data());
      keep(out);
    }
  }
  for (UnOp op : {UnOp::kExp, UnOp::kTanh, UnOp::kGeluTanh, UnOp::kSilu, UnOp::kSin, UnOp::kCos, UnOp::kLog,
                  UnOp::kRsqrt}) {
    std::vector<float> v = randoms(1001);
    for (float& x : v) x = op == UnOp::kLog || op == UnOp::kRsqrt ? std::fabs(x) * 50.0f : x * 20.0f;
    unary(op, v.data(), v.data(), v.size());
    keep(v);
  }
  return bits;
}

// Every implementation with FMA gives the same bits; the scalar fallback, whose
// multiply-add rounds twice, is the control that shows the comparison sees a change
// of rounding.
TEST(TileKernelBits, EveryTargetWithFmaGivesTheSameBits) {
  std::vector<uint32_t> want;
  std::string first;
  bool fallback_differs = false;
  for (int64_t target : tile_kernels_targets()) {
    tile_kernels_set_target_for_test(target);
    const std::vector<uint32_t> got = KernelBits(7);
    if (target == HWY_SCALAR) {
      fallback_differs = !want.empty() && got != want;
      continue;
    }
    if (want.empty()) {
      want = got;
      first = tile_kernels_target();
      continue;
    }
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    EXPECT_EQ(differ, 0u) << tile_kernels_target() << " against " << first << ": " << differ << " of "
                          << got.size() << " results differ";
  }
  tile_kernels_set_target_for_test(0);
  if (!want.empty()) {
    EXPECT_TRUE(fallback_differs) << "the fallback's twice-rounded multiply-adds went unseen";
  }
}

}  // namespace
}  // namespace npurt::sim
