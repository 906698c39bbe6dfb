// Every instruction of the tile ISA, executed on the simulated device and compared
// with a host computation on random data. Output buffers are poisoned with NaN
// before each launch, so an element a kernel fails to write cannot pass by chance.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sim_test_util.h"

namespace npurt {
namespace {

using namespace npurt::testing;
using namespace npurt::isa;
using hal::KernelArg;

// ---------------------------------------------------------------- host numerics

uint32_t f32_bits(float f) { return std::bit_cast<uint32_t>(f); }
float f32_from(uint32_t u) { return std::bit_cast<float>(u); }

// f32 -> bf16, round to nearest even; NaN stays NaN.
uint16_t to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) { return f32_from(uint32_t{h} << 16); }

// f32 -> f16, round to nearest even, with subnormals; past 65504 (after rounding) is inf.
uint16_t to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -25) return sign;  // below half the smallest subnormal (f32 subnormals included)
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  // Normal results keep 10 mantissa bits; subnormal ones count units of 2^-24.
  const int shift = e >= -14 ? 13 : -e - 1;
  const uint32_t base = e >= -14 ? static_cast<uint32_t>(e + 14) << 10 : 0;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | (base + q));
}
float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0x1F) return f32_from(sign | 0x7F800000u | (man << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return f32_from(sign | ((exp + 112) << 23) | (man << 13));
}

// f32 -> i32: truncate toward zero, saturate, NaN -> 0.
int32_t to_i32(float f) {
  if (std::isnan(f)) return 0;
  if (f >= 2147483648.f) return std::numeric_limits<int32_t>::max();
  if (f < -2147483648.f) return std::numeric_limits<int32_t>::min();
  return static_cast<int32_t>(f);
}

size_t esize(DType t) { return dtype_size(t); }

float elem_as_f32(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kBF16: { uint16_t h; std::memcpy(&h, p, 2); return from_bf16(h); }
    case DType::kF16: { uint16_t h; std::memcpy(&h, p, 2); return from_f16(h); }
    case DType::kI32: { int32_t i; std::memcpy(&i, p, 4); return static_cast<float>(i); }
    default: ADD_FAILURE() << "not a plain dtype"; return 0.f;
  }
}
void elem_from_f32(DType t, float v, uint8_t* p) {
  switch (t) {
    case DType::kF32: std::memcpy(p, &v, 4); return;
    case DType::kBF16: { const uint16_t h = to_bf16(v); std::memcpy(p, &h, 2); return; }
    case DType::kF16: { const uint16_t h = to_f16(v); std::memcpy(p, &h, 2); return; }
    case DType::kI32: { const int32_t i = to_i32(v); std::memcpy(p, &i, 4); return; }
    default: ADD_FAILURE() << "not a plain dtype";
  }
}

using Bytes = std::vector<uint8_t>;

// The host reference of the device's plain-dtype conversion: identity for equal
// types, otherwise through f32.
Bytes convert_host(const Bytes& src, DType from, DType to) {
  if (from == to) return src;
  const size_t n = src.size() / esize(from);
  Bytes out(n * esize(to));
  for (size_t i = 0; i < n; ++i) elem_from_f32(to, elem_as_f32(from, &src[i * esize(from)]), &out[i * esize(to)]);
  return out;
}

Bytes encode(DType t, const std::vector<float>& v) {
  Bytes out(v.size() * esize(t));
  for (size_t i = 0; i < v.size(); ++i) elem_from_f32(t, v[i], &out[i * esize(t)]);
  return out;
}
std::vector<float> decode(DType t, const Bytes& b) {
  std::vector<float> out(b.size() / esize(t));
  for (size_t i = 0; i < out.size(); ++i) out[i] = elem_as_f32(t, &b[i * esize(t)]);
  return out;
}
template <typename T>
Bytes to_bytes(const std::vector<T>& v) {
  Bytes out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}
template <typename T>
std::vector<T> from_bytes(const Bytes& b) {
  std::vector<T> out(b.size() / sizeof(T));
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

// Nonzero values over many binades: random sign, mantissa and exponent in [lo, hi].
std::vector<float> spread_floats(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(0.5f, 1.f);
  std::uniform_int_distribution<int> exp(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = ((rng() & 1u) ? -1.f : 1.f) * std::ldexp(mant(rng), exp(rng));
  return v;
}
std::vector<int32_t> random_ints(size_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}
// Random elements of a plain dtype, as GM bytes.
Bytes random_elems(DType t, size_t n, uint32_t seed) {
  if (t == DType::kI32) return to_bytes(random_ints(n, seed, -50000, 50000));
  return encode(t, spread_floats(n, seed, -4, 10));
}

std::string name_of(DType t) { return std::string(dtype_name(t)); }

// ---------------------------------------------------------------- device harness

// Every 16-bit half is 0x7FC0: a NaN as bf16 and f16, and 0x7FC07FC0 is a NaN f32
// (as i32 it is 2143322048, a value no test produces).
constexpr uint16_t kPoisonHalf = 0x7FC0;

Bytes poison_bytes(size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = (i % 2 == 0) ? uint8_t{0xC0} : uint8_t{0x7F};
  return b;
}

using Buf = DeviceBuffer;

// The kernel runner plus an output helper that poisons with kPoisonHalf.
class Sim : public KernelRunner {
 public:
  // A fresh buffer of `bytes` filled with the poison pattern.
  Buf output(size_t bytes) { return input(std::vector<uint16_t>((bytes + 1) / 2, kPoisonHalf)); }
};

// Scratch registers and tile of the output helpers below; tests keep clear of them.
constexpr Reg kS0{29}, kS1{30};
constexpr Tile kScratch{15};
constexpr uint32_t kScratchLocal = 192u << 10;

// Writes int64 r[src] to int32 elements 2*slot (low word) and 2*slot+1 (high word)
// of `arg`, i.e. at byte offset r[base] + 8*slot.
void store_i64(KernelBuilder& b, Reg src, uint8_t arg, Reg base, int slot) {
  b.tdef(kScratch, DType::kI32, 1, 1, kScratchLocal);
  b.alui(AluOp::kAdd, kS0, base, 8 * slot);
  b.tfill(kScratch, src);
  b.tst(kScratch, arg, kS0, DType::kI32);
  b.alui(AluOp::kShr, kS1, src, 32);
  b.tfill(kScratch, kS1);
  b.alui(AluOp::kAdd, kS0, kS0, 4);
  b.tst(kScratch, arg, kS0, DType::kI32);
}
int64_t i64_at(const std::vector<int32_t>& out, size_t slot) {
  const uint64_t lo = static_cast<uint32_t>(out[2 * slot]), hi = static_cast<uint32_t>(out[2 * slot + 1]);
  return static_cast<int64_t>(hi << 32 | lo);
}

// Writes the f32 in the low bits of r[src] to f32 element `slot` of `arg`
// (byte offset r[base] + 4*slot), through an f32 tile filled from the register.
void store_f32(KernelBuilder& b, Reg src, uint8_t arg, Reg base, int slot) {
  b.tdef(kScratch, DType::kF32, 1, 1, kScratchLocal);
  b.alui(AluOp::kAdd, kS0, base, 4 * slot);
  b.tfill(kScratch, src);
  b.tst(kScratch, arg, kS0, DType::kF32);
}

int64_t bits_imm(float f) { return static_cast<int64_t>(f32_bits(f)); }

// Hands out 64-byte aligned local memory for tiles.
struct LocalAlloc {
  uint32_t next = 0;
  uint32_t take(size_t bytes) {
    const uint32_t at = next;
    next = static_cast<uint32_t>(round_up(next + bytes, 64));
    return at;
  }
};

// ================================================================ scalar

TEST(InstructionScalar, LiAndMovCopyAll64Bits) {
  std::mt19937_64 rng(101);
  std::vector<int64_t> values = {-1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  for (int i = 0; i < 5; ++i) values.push_back(static_cast<int64_t>(rng()));
  KernelBuilder b("li_mov");
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kI32);
  const Reg zero{0};
  b.li(zero, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    b.li(Reg{1}, values[i]);
    b.mov(Reg{static_cast<uint8_t>(10 + i)}, Reg{1});
  }
  for (size_t i = 0; i < values.size(); ++i) store_i64(b, Reg{static_cast<uint8_t>(10 + i)}, out, zero, static_cast<int>(i));
  Sim sim;
  const Buf o = sim.output(values.size() * 8);
  NPURT_ASSERT_OK(sim.run(b, {o.arg()}));
  const auto r = sim.read<int32_t>(o);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(i64_at(r, i), values[i]) << i;
}

TEST(InstructionScalar, SpecialReadsBlockIdCountAndArguments) {
  constexpr uint32_t kGrid = 5;
  constexpr int kSlots = 6;
  const int64_t ival = -123456789;
  const float fval = -3.1415927f;
  KernelBuilder b("special");
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kI32);
  const uint8_t outf = b.arg_buffer("outf", Access::kOut, DType::kF32);
  const uint8_t iarg = b.arg_scalar("i", DType::kI32);
  const uint8_t farg = b.arg_scalar("f", DType::kF32);
  const uint8_t in = b.arg_buffer("in", Access::kIn, DType::kF32);
  const Reg bid{0}, base{1}, basef{2}, v{3};
  b.block_id(bid);
  b.alui(AluOp::kMul, base, bid, 8 * kSlots);
  b.alui(AluOp::kMul, basef, bid, 4);
  store_i64(b, bid, out, base, 0);
  b.block_count(v);
  store_i64(b, v, out, base, 1);
  b.arg_value(v, iarg);
  store_i64(b, v, out, base, 2);
  b.arg_value(v, farg);
  store_i64(b, v, out, base, 3);
  store_f32(b, v, outf, basef, 0);
  b.arg_bytes(v, in);
  store_i64(b, v, out, base, 4);
  b.arg_value(v, in);  // a buffer's value reads as 0
  store_i64(b, v, out, base, 5);

  Sim sim;
  const Buf o = sim.output(kGrid * kSlots * 8), of = sim.output(kGrid * 4);
  const Buf i = sim.input(random_floats(256, 102));
  NPURT_ASSERT_OK(sim.run(b, {o.arg(), of.arg(), KernelArg::scalar_i64(ival), KernelArg::scalar_f32(fval),
                              KernelArg::buffer(i.addr, 1000)}, kGrid));
  const auto r = sim.read<int32_t>(o);
  const auto rf = sim.read<float>(of);
  for (uint32_t blk = 0; blk < kGrid; ++blk) {
    SCOPED_TRACE(blk);
    const size_t s = blk * kSlots;
    EXPECT_EQ(i64_at(r, s + 0), blk);
    EXPECT_EQ(i64_at(r, s + 1), kGrid);
    EXPECT_EQ(i64_at(r, s + 2), ival);
    EXPECT_EQ(i64_at(r, s + 3), int64_t{f32_bits(fval)});
    EXPECT_EQ(rf[blk], fval);
    EXPECT_EQ(i64_at(r, s + 4), 1000);
    EXPECT_EQ(i64_at(r, s + 5), 0);
  }
}

int64_t alu_ref(AluOp op, int64_t x, int64_t y) {
  const auto ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
  switch (op) {
    case AluOp::kAdd: return static_cast<int64_t>(ux + uy);
    case AluOp::kSub: return static_cast<int64_t>(ux - uy);
    case AluOp::kMul: return static_cast<int64_t>(ux * uy);
    case AluOp::kDiv: return x / y;
    case AluOp::kRem: return x % y;
    case AluOp::kMin: return std::min(x, y);
    case AluOp::kMax: return std::max(x, y);
    case AluOp::kShl: return static_cast<int64_t>(ux << y);
    case AluOp::kShr: return x >> y;
    case AluOp::kAnd: return x & y;
    case AluOp::kOr: return x | y;
    default: ADD_FAILURE(); return 0;
  }
}

const char* alu_name(AluOp op) {
  static constexpr const char* kNames[] = {"add", "sub", "mul", "div", "rem", "min",
                                           "max", "shl", "shr", "and", "or"};
  return kNames[static_cast<int>(op)];
}

class AluOps : public ::testing::TestWithParam<AluOp> {};

// ALU (register operand) and ALUI (immediate operand) on fixed and random pairs,
// negative numbers and wrap-around included.
TEST_P(AluOps, RegisterAndImmediateFormsMatchHost) {
  const AluOp op = GetParam();
  const bool shift = op == AluOp::kShl || op == AluOp::kShr;
  const bool divide = op == AluOp::kDiv || op == AluOp::kRem;
  std::vector<std::pair<int64_t, int64_t>> pairs = {
      {-7, 2}, {7, 3}, {-1234567891011, 5}, {std::numeric_limits<int64_t>::max(), 1}, {-64, 63}};
  if (!shift) {
    pairs.push_back({7, -2});
    pairs.push_back({-7, -2});
    pairs.push_back({std::numeric_limits<int64_t>::min() + 5, -3});
  }
  std::mt19937_64 rng(200 + static_cast<int>(op));
  const auto draw = [&](int k) -> int64_t {
    switch (k % 3) {
      case 0: return static_cast<int64_t>(rng() % 2001) - 1000;
      case 1: return static_cast<int64_t>(rng() % (uint64_t{1} << 33)) - (int64_t{1} << 32);
      default: return static_cast<int64_t>(rng());
    }
  };
  for (int k = 0; k < 24; ++k) {
    const int64_t x = draw(k);
    int64_t y = shift ? static_cast<int64_t>(rng() % 64) : draw(k / 3);
    if (divide && (y == 0 || (x == std::numeric_limits<int64_t>::min() && y == -1))) y = 3;
    pairs.push_back({x == 0 ? 1 : x, y});
  }

  KernelBuilder b(std::string("alu_") + alu_name(op));
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kI32);
  const Reg zero{0}, x{1}, y{2}, r{3}, ri{4};
  b.li(zero, 0);
  for (size_t k = 0; k < pairs.size(); ++k) {
    b.li(x, pairs[k].first);
    b.li(y, pairs[k].second);
    b.alu(op, r, x, y);
    b.alui(op, ri, x, pairs[k].second);
    store_i64(b, r, out, zero, static_cast<int>(2 * k));
    store_i64(b, ri, out, zero, static_cast<int>(2 * k + 1));
  }
  Sim sim;
  const Buf o = sim.output(pairs.size() * 16);
  NPURT_ASSERT_OK(sim.run(b, {o.arg()}));
  const auto res = sim.read<int32_t>(o);
  for (size_t k = 0; k < pairs.size(); ++k) {
    const auto [xv, yv] = pairs[k];
    const int64_t want = alu_ref(op, xv, yv);
    EXPECT_EQ(i64_at(res, 2 * k), want) << "ALU " << xv << " " << alu_name(op) << " " << yv;
    EXPECT_EQ(i64_at(res, 2 * k + 1), want) << "ALUI " << xv << " " << alu_name(op) << " " << yv;
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, AluOps,
                         ::testing::Values(AluOp::kAdd, AluOp::kSub, AluOp::kMul, AluOp::kDiv, AluOp::kRem,
                                           AluOp::kMin, AluOp::kMax, AluOp::kShl, AluOp::kShr, AluOp::kAnd,
                                           AluOp::kOr),
                         [](const ::testing::TestParamInfo<AluOp>& i) { return std::string(alu_name(i.param)); });

float falu_ref(FaluOp op, float x, float y) {
  switch (op) {
    case FaluOp::kAdd: return x + y;
    case FaluOp::kSub: return x - y;
    case FaluOp::kMul: return x * y;
    case FaluOp::kDiv: return x / y;
    case FaluOp::kMin: return std::fmin(x, y);
    case FaluOp::kMax: return std::fmax(x, y);
    default: ADD_FAILURE(); return 0.f;
  }
}
const char* falu_name(FaluOp op) {
  static constexpr const char* kNames[] = {"add", "sub", "mul", "div", "min", "max"};
  return kNames[static_cast<int>(op)];
}

class FaluOps : public ::testing::TestWithParam<FaluOp> {};

TEST_P(FaluOps, MatchesHostF32Arithmetic) {
  const FaluOp op = GetParam();
  const auto xs = spread_floats(24, 300 + static_cast<uint32_t>(op), -6, 12);
  const auto ys = spread_floats(24, 400 + static_cast<uint32_t>(op), -6, 12);
  KernelBuilder b(std::string("falu_") + falu_name(op));
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0}, x{1}, y{2}, r{3};
  b.li(zero, 0);
  for (size_t k = 0; k < xs.size(); ++k) {
    b.li(x, bits_imm(xs[k]));
    b.li(y, bits_imm(ys[k]));
    b.falu(op, r, x, y);
    store_f32(b, r, out, zero, static_cast<int>(k));
  }
  Sim sim;
  const Buf o = sim.output(xs.size() * 4);
  NPURT_ASSERT_OK(sim.run(b, {o.arg()}));
  const auto res = sim.read<float>(o);
  for (size_t k = 0; k < xs.size(); ++k) {
    EXPECT_EQ(f32_bits(res[k]), f32_bits(falu_ref(op, xs[k], ys[k]))) << xs[k] << " " << falu_name(op) << " " << ys[k];
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, FaluOps,
                         ::testing::Values(FaluOp::kAdd, FaluOp::kSub, FaluOp::kMul, FaluOp::kDiv, FaluOp::kMin,
                                           FaluOp::kMax),
                         [](const ::testing::TestParamInfo<FaluOp>& i) { return std::string(falu_name(i.param)); });

TEST(InstructionScalar, I2fRoundsAndF2iTruncates) {
  std::mt19937_64 rng(501);
  std::vector<int64_t> ints = {-1, (int64_t{1} << 24) + 1, -((int64_t{1} << 24) + 3), std::numeric_limits<int64_t>::max()};
  for (int k = 0; k < 8; ++k) ints.push_back(static_cast<int64_t>(rng()) >> (k * 7));
  std::vector<float> floats = {-2.75f, 2.75f, -0.5f, 0.99999994f, -1e15f, 123456789.f};
  for (float f : spread_floats(8, 502, -2, 40)) floats.push_back(f);

  KernelBuilder b("i2f_f2i");
  const uint8_t outf = b.arg_buffer("outf", Access::kOut, DType::kF32);
  const uint8_t outi = b.arg_buffer("outi", Access::kOut, DType::kI32);
  const Reg zero{0}, src{1}, dst{2};
  b.li(zero, 0);
  for (size_t k = 0; k < ints.size(); ++k) {
    b.li(src, ints[k]);
    b.i2f(dst, src);
    store_f32(b, dst, outf, zero, static_cast<int>(k));
  }
  for (size_t k = 0; k < floats.size(); ++k) {
    b.li(src, bits_imm(floats[k]));
    b.f2i(dst, src);
    store_i64(b, dst, outi, zero, static_cast<int>(k));
  }
  Sim sim;
  const Buf of = sim.output(ints.size() * 4), oi = sim.output(floats.size() * 8);
  NPURT_ASSERT_OK(sim.run(b, {of.arg(), oi.arg()}));
  const auto rf = sim.read<float>(of);
  const auto ri = sim.read<int32_t>(oi);
  for (size_t k = 0; k < ints.size(); ++k) EXPECT_EQ(rf[k], static_cast<float>(ints[k])) << ints[k];
  for (size_t k = 0; k < floats.size(); ++k) EXPECT_EQ(i64_at(ri, k), static_cast<int64_t>(floats[k])) << floats[k];
}

// ================================================================ loops

TEST(InstructionLoop, CountFromAScalarArg) {
  // acc = sum of i*i for i = 1..n; the counter ends at max(n, 0).
  for (int64_t n : {0, 1, 7, -3, 100}) {
    SCOPED_TRACE(n);
    KernelBuilder b("loop");
    const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kI32);
    const uint8_t count = b.arg_scalar("n", DType::kI32);
    const Reg zero{0}, cnt{1}, i{2}, sq{3}, acc{4};
    b.li(zero, 0);
    b.li(i, 0);
    b.li(acc, 0);
    b.arg_value(cnt, count);
    b.loop_begin(cnt);
    b.alui(AluOp::kAdd, i, i, 1);
    b.alu(AluOp::kMul, sq, i, i);
    b.alu(AluOp::kAdd, acc, acc, sq);
    b.loop_end();
    store_i64(b, acc, out, zero, 0);
    store_i64(b, i, out, zero, 1);
    Sim sim;
    const Buf o = sim.output(16);
    NPURT_ASSERT_OK(sim.run(b, {o.arg(), KernelArg::scalar_i64(n)}));
    const auto r = sim.read<int32_t>(o);
    const int64_t m = std::max<int64_t>(n, 0);
    EXPECT_EQ(i64_at(r, 0), m * (m + 1) * (2 * m + 1) / 6);
    EXPECT_EQ(i64_at(r, 1), m);
  }
}

TEST(InstructionLoop, NestedDepthThree) {
  struct Case {
    int64_t outer, middle, inner;
  };
  for (const Case c : {Case{3, 4, 5}, Case{2, 0, 6}, Case{1, 1, 1}, Case{4, 3, 0}}) {
    SCOPED_TRACE(std::to_string(c.outer) + "x" + std::to_string(c.middle) + "x" + std::to_string(c.inner));
    KernelBuilder b("nested");
    const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kI32);
    const uint8_t a_outer = b.arg_scalar("outer", DType::kI32);
    const uint8_t a_inner = b.arg_scalar("inner", DType::kI32);
    const Reg zero{0}, n0{1}, n1{2}, n2{3}, acc{4}, steps{5};
    b.li(zero, 0);
    b.li(acc, 0);
    b.li(steps, 0);
    b.arg_value(n0, a_outer);
    b.li(n1, c.middle);
    b.arg_value(n2, a_inner);
    b.loop_begin(n0);
    b.alui(AluOp::kAdd, acc, acc, 10000);
    b.loop_begin(n1);
    b.alui(AluOp::kAdd, acc, acc, 100);
    b.loop_begin(n2);
    b.alui(AluOp::kAdd, acc, acc, 1);
    b.alui(AluOp::kMul, steps, steps, 3);  // order-sensitive: steps = 3^k - 1 after k passes (mod 2^64)
    b.alui(AluOp::kAdd, steps, steps, 2);
    b.loop_end();
    b.loop_end();
    b.loop_end();
    store_i64(b, acc, out, zero, 0);
    store_i64(b, steps, out, zero, 1);
    Sim sim;
    const Buf o = sim.output(16);
    NPURT_ASSERT_OK(sim.run(b, {o.arg(), KernelArg::scalar_i64(c.outer), KernelArg::scalar_i64(c.inner)}));
    const auto r = sim.read<int32_t>(o);
    const int64_t passes = c.outer * c.middle * c.inner;
    uint64_t steps_want = 0;  // wraps like the device's 64-bit ALU
    for (int64_t k = 0; k < passes; ++k) steps_want = steps_want * 3 + 2;
    EXPECT_EQ(i64_at(r, 0), c.outer * 10000 + c.outer * c.middle * 100 + passes);
    EXPECT_EQ(i64_at(r, 1), static_cast<int64_t>(steps_want));
  }
}

// ================================================================ TDEF

TEST(InstructionTdef, ImmediateAndRegisterShapesAndOffsetRegister) {
  // t0: 6x10 immediate tile holding the data. Views onto the same bytes:
  //   t1: 1x10 at 40 + r(80) = 120 bytes  -> row 3
  //   t2: r(3) x r(7) at 0 + r(16)        -> elements 4..24
  //   t3: 2 x r(7) at 8 + r(100)          -> elements 27..40
  const auto data = random_floats(60, 601);
  KernelBuilder b("tdef");
  const uint8_t in = b.arg_buffer("in", Access::kIn, DType::kF32);
  const uint8_t rows = b.arg_scalar("rows", DType::kI32);
  const uint8_t cols = b.arg_scalar("cols", DType::kI32);
  const uint8_t o1 = b.arg_buffer("o1", Access::kOut, DType::kF32);
  const uint8_t o2 = b.arg_buffer("o2", Access::kOut, DType::kF32);
  const uint8_t o3 = b.arg_buffer("o3", Access::kOut, DType::kF32);
  const Reg zero{0}, off{1}, r{2}, c{3};
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, 6, 10);
  b.tld(Tile{0}, in, zero, DType::kF32);
  b.li(off, 80);
  b.tdef(Tile{1}, DType::kF32, 1, 10, 40, off);
  b.tst(Tile{1}, o1, zero, DType::kF32);
  b.arg_value(r, rows);
  b.arg_value(c, cols);
  b.li(off, 16);
  b.tdef(Tile{2}, DType::kF32, r, c, 0, off);
  b.tst(Tile{2}, o2, zero, DType::kF32);
  b.li(off, 100);
  b.tdef(Tile{3}, DType::kF32, 2, c, 8, off);
  b.tst(Tile{3}, o3, zero, DType::kF32);
  Sim sim;
  const Buf i = sim.input(data), b1 = sim.output(40), b2 = sim.output(84), b3 = sim.output(56);
  NPURT_ASSERT_OK(sim.run(b, {i.arg(), KernelArg::scalar_i64(3), KernelArg::scalar_i64(7), b1.arg(), b2.arg(),
                              b3.arg()}));
  EXPECT_EQ(sim.read<float>(b1), std::vector<float>(data.begin() + 30, data.begin() + 40));
  EXPECT_EQ(sim.read<float>(b2), std::vector<float>(data.begin() + 4, data.begin() + 25));
  EXPECT_EQ(sim.read<float>(b3), std::vector<float>(data.begin() + 27, data.begin() + 41));
}

// ================================================================ TLD / TST

struct LoadStoreCase {
  DType gm_in, tile, gm_out;
  bool strided;
};

class LoadStore : public ::testing::TestWithParam<LoadStoreCase> {};

// A 7x13 tile: strided, out of a 10x29 matrix at (2, 5) and into a 12x31 one at
// (3, 17); dense, from element 5 of a buffer and to element 3 of another. Every
// byte outside the stored window must keep its poison.
TEST_P(LoadStore, ConvertsBetweenGmAndTileTypes) {
  const LoadStoreCase p = GetParam();
  constexpr size_t kRows = 7, kCols = 13;
  const size_t in_cols = p.strided ? 29 : kCols, out_cols = p.strided ? 31 : kCols;
  const size_t in_elems = p.strided ? 10 * 29 : kRows * kCols + 9;
  const size_t out_elems = p.strided ? 12 * 31 : kRows * kCols + 6;
  const size_t in_first = p.strided ? 2 * 29 + 5 : 5, out_first = p.strided ? 3 * 31 + 17 : 3;
  const Bytes in = random_elems(p.gm_in, in_elems, 700 + static_cast<uint32_t>(p.gm_in));

  KernelBuilder b("load_store");
  const uint8_t ain = b.arg_buffer("in", Access::kIn, p.gm_in);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, p.gm_out);
  const Reg off_in{1}, off_out{2}, s_in{3}, s_out{4};
  const Tile t{0};
  b.tdef(t, p.tile, kRows, kCols);
  b.li(off_in, static_cast<int64_t>(in_first * esize(p.gm_in)));
  b.li(off_out, static_cast<int64_t>(out_first * esize(p.gm_out)));
  if (p.strided) {
    b.li(s_in, static_cast<int64_t>(in_cols));
    b.li(s_out, static_cast<int64_t>(out_cols));
    b.tld(t, ain, off_in, p.gm_in, s_in);
    b.tst(t, aout, off_out, p.gm_out, s_out);
  } else {
    b.tld(t, ain, off_in, p.gm_in);
    b.tst(t, aout, off_out, p.gm_out);
  }
  Sim sim;
  const Buf i = sim.input(in), o = sim.output(out_elems * esize(p.gm_out));
  NPURT_ASSERT_OK(sim.run(b, {i.arg(), o.arg()}));

  Bytes want = poison_bytes(o.bytes);
  for (size_t r = 0; r < kRows; ++r) {
    const size_t ei = esize(p.gm_in), eo = esize(p.gm_out);
    const Bytes row(in.begin() + static_cast<ptrdiff_t>((in_first + r * in_cols) * ei),
                    in.begin() + static_cast<ptrdiff_t>((in_first + r * in_cols + kCols) * ei));
    const Bytes conv = convert_host(convert_host(row, p.gm_in, p.tile), p.tile, p.gm_out);
    std::copy(conv.begin(), conv.end(), want.begin() + static_cast<ptrdiff_t>((out_first + r * out_cols) * eo));
  }
  const Bytes got = sim.read<uint8_t>(o);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) ASSERT_EQ(got[k], want[k]) << "byte " << k;
}

INSTANTIATE_TEST_SUITE_P(
    Instruction, LoadStore,
    ::testing::Values(LoadStoreCase{DType::kF32, DType::kF32, DType::kF32, true},
                      LoadStoreCase{DType::kF32, DType::kF32, DType::kF32, false},
                      LoadStoreCase{DType::kBF16, DType::kF32, DType::kBF16, true},
                      LoadStoreCase{DType::kBF16, DType::kF32, DType::kF32, true},
                      LoadStoreCase{DType::kF32, DType::kBF16, DType::kF32, true},
                      LoadStoreCase{DType::kF32, DType::kF32, DType::kBF16, false},
                      LoadStoreCase{DType::kF16, DType::kF32, DType::kF16, true},
                      LoadStoreCase{DType::kF32, DType::kF16, DType::kBF16, false},
                      LoadStoreCase{DType::kBF16, DType::kBF16, DType::kBF16, true},
                      LoadStoreCase{DType::kF16, DType::kF16, DType::kF32, true},
                      LoadStoreCase{DType::kBF16, DType::kF32, DType::kF16, true},
                      LoadStoreCase{DType::kI32, DType::kI32, DType::kI32, true},
                      LoadStoreCase{DType::kI32, DType::kF32, DType::kI32, false},
                      LoadStoreCase{DType::kF32, DType::kI32, DType::kF32, true}),
    [](const ::testing::TestParamInfo<LoadStoreCase>& i) {
      return name_of(i.param.gm_in) + "_" + name_of(i.param.tile) + "_" + name_of(i.param.gm_out) +
             (i.param.strided ? "_strided" : "_dense");
    });

// ================================================================ TFILL

TEST(InstructionTfill, FillsEveryElementInTheTileType) {
  // Low bits 0x9001 make both the bf16 and the f16 rounding go up (above the tie).
  const float v = f32_from(f32_bits(random_floats(1, 801, -100.f, 100.f)[0]) | 0x9001u);
  const int64_t neg = -123456789, wide = 0x123456789ALL;  // i32 tiles keep the low 32 bits
  KernelBuilder b("tfill");
  const uint8_t fv = b.arg_scalar("v", DType::kF32);
  const uint8_t of32 = b.arg_buffer("f32", Access::kOut, DType::kF32);
  const uint8_t oneg = b.arg_buffer("neg", Access::kOut, DType::kI32);
  const uint8_t owide = b.arg_buffer("wide", Access::kOut, DType::kI32);
  const uint8_t obf = b.arg_buffer("bf16", Access::kOut, DType::kBF16);
  const uint8_t ohf = b.arg_buffer("f16", Access::kOut, DType::kF16);
  const Reg zero{0}, x{1}, n{2}, w{3};
  b.li(zero, 0);
  b.arg_value(x, fv);
  b.li(n, neg);
  b.li(w, wide);
  LocalAlloc la;
  b.tdef(Tile{0}, DType::kF32, 3, 5, la.take(60));
  b.tdef(Tile{1}, DType::kI32, 4, 3, la.take(48));
  b.tdef(Tile{2}, DType::kI32, 2, 2, la.take(16));
  b.tdef(Tile{3}, DType::kBF16, 3, 7, la.take(42));
  b.tdef(Tile{4}, DType::kF16, 2, 9, la.take(36));
  b.tfill(Tile{0}, x);
  b.tfill(Tile{1}, n);
  b.tfill(Tile{2}, w);
  b.tfill(Tile{3}, x);
  b.tfill(Tile{4}, x);
  b.tst(Tile{0}, of32, zero, DType::kF32);
  b.tst(Tile{1}, oneg, zero, DType::kI32);
  b.tst(Tile{2}, owide, zero, DType::kI32);
  b.tst(Tile{3}, obf, zero, DType::kBF16);
  b.tst(Tile{4}, ohf, zero, DType::kF16);
  Sim sim;
  const Buf b0 = sim.output(60), b1 = sim.output(48), b2 = sim.output(16), b3 = sim.output(42), b4 = sim.output(36);
  NPURT_ASSERT_OK(sim.run(b, {KernelArg::scalar_f32(v), b0.arg(), b1.arg(), b2.arg(), b3.arg(), b4.arg()}));
  EXPECT_EQ(sim.read<float>(b0), std::vector<float>(15, v));
  EXPECT_EQ(sim.read<int32_t>(b1), std::vector<int32_t>(12, static_cast<int32_t>(neg)));
  EXPECT_EQ(sim.read<int32_t>(b2), std::vector<int32_t>(4, 0x3456789A));
  EXPECT_EQ(sim.read<uint16_t>(b3), std::vector<uint16_t>(21, to_bf16(v)));
  EXPECT_EQ(sim.read<uint16_t>(b4), std::vector<uint16_t>(18, to_f16(v)));
}

// ================================================================ TCVT

// Source elements for conversion tests: rounding ties, range limits, subnormals,
// infinities and signed zero, then random values over a wide range.
Bytes conversion_source(DType t) {
  if (t == DType::kI32) {
    std::vector<int32_t> v = {1, -1, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
                              (1 << 24) + 1, (1 << 24) + 3, 65519, 65520, -70000, 2049, 2051, -2053, 257, 259};
    for (int32_t x : random_ints(34, 901, -3000, 3000)) v.push_back(x);
    for (int32_t x : random_ints(32, 902, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max())) {
      v.push_back(x);
    }
    return to_bytes(v);
  }
  std::vector<float> v = {-0.f, 0.5f, -2.5f, 2.75f, 65504.f, 65519.f, 65520.f, -1e5f, 3e9f, -3e9f, 1e-6f,
                          -3e-8f, std::ldexp(1.f, -25), f32_from(0x3F808000u), f32_from(0x3F818000u),
                          f32_from(0x3F808001u), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 1e-40f, f32_from(0x7F7FFFFFu)};
  for (float x : spread_floats(60, 903, -30, 20)) v.push_back(x);
  return encode(t, v);
}

struct CvtCase {
  DType from, to;
};
class Tcvt : public ::testing::TestWithParam<CvtCase> {};

TEST_P(Tcvt, MatchesHostRounding) {
  const CvtCase p = GetParam();
  constexpr int kRows = 5, kCols = 16;
  const Bytes src = conversion_source(p.from);
  ASSERT_EQ(src.size(), kRows * kCols * esize(p.from));
  KernelBuilder b("tcvt");
  const uint8_t in = b.arg_buffer("in", Access::kIn, p.from);
  const uint8_t out = b.arg_buffer("out", Access::kOut, p.to);
  const Reg zero{0};
  b.li(zero, 0);
  b.tdef(Tile{0}, p.from, kRows, kCols, 0);
  b.tdef(Tile{1}, p.to, kRows, kCols, 512);
  b.tld(Tile{0}, in, zero, p.from);
  b.tcvt(Tile{1}, Tile{0});
  b.tst(Tile{1}, out, zero, p.to);
  Sim sim;
  const Buf i = sim.input(src), o = sim.output(kRows * kCols * esize(p.to));
  NPURT_ASSERT_OK(sim.run(b, {i.arg(), o.arg()}));
  const Bytes got = sim.read<uint8_t>(o), want = convert_host(src, p.from, p.to);
  const size_t es = esize(p.to), fs = esize(p.from);
  for (size_t k = 0; k < kRows * kCols; ++k) {
    ASSERT_EQ(0, std::memcmp(&got[k * es], &want[k * es], es))
        << "element " << k << ": source " << elem_as_f32(p.from, &src[k * fs]) << " -> got "
        << elem_as_f32(p.to, &got[k * es]) << ", want " << elem_as_f32(p.to, &want[k * es]);
  }
}

std::vector<CvtCase> all_cvt_pairs() {
  std::vector<CvtCase> v;
  for (DType f : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) v.push_back({f, t});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tcvt, ::testing::ValuesIn(all_cvt_pairs()),
                         [](const ::testing::TestParamInfo<CvtCase>& i) {
                           return name_of(i.param.from) + "_to_" + name_of(i.param.to);
                         });

// convert() forbids overlapping source and destination of different types, and TCVT
// faults when the two tiles start at the same offset. Tiles that overlap only in
// part must be handled too: either the launch faults, or every element converts.
TEST(InstructionTcvt, PartiallyOverlappingTilesFaultOrConvertCorrectly) {
  const Bytes src = random_elems(DType::kBF16, 64, 950);
  const auto want = decode(DType::kBF16, src);
  for (uint32_t dst_offset : {64u, 192u}) {  // the bf16 source occupies [128, 256)
    SCOPED_TRACE(dst_offset);
    KernelBuilder b("tcvt_overlap");
    const uint8_t in = b.arg_buffer("in", Access::kIn, DType::kBF16);
    const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
    const Reg zero{0};
    b.li(zero, 0);
    b.tdef(Tile{0}, DType::kBF16, 1, 64, 128);
    b.tdef(Tile{1}, DType::kF32, 1, 64, dst_offset);
    b.tld(Tile{0}, in, zero, DType::kBF16);
    b.tcvt(Tile{1}, Tile{0});
    b.tst(Tile{1}, out, zero, DType::kF32);
    Sim sim;
    const Buf bi = sim.input(src), bo = sim.output(256);
    const Status st = sim.run(b, {bi.arg(), bo.arg()});
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
      continue;
    }
    const auto got = sim.read<float>(bo);
    size_t wrong = 0, first = 0;
    for (size_t k = got.size(); k-- > 0;) {
      if (got[k] != want[k]) ++wrong, first = k;
    }
    EXPECT_EQ(wrong, 0u) << "overlapping TCVT neither faulted nor converted correctly; first wrong element " << first
                         << ": got " << got[first] << ", want " << want[first];
  }
}

// ================================================================ TBIN / TSOP

float bin_ref(BinOp op, float a, float b) {
  switch (op) {
    case BinOp::kAdd: return a + b;
    case BinOp::kSub: return a - b;
    case BinOp::kMul: return a * b;
    case BinOp::kDiv: return a / b;
    case BinOp::kMax: return a > b ? a : b;
    case BinOp::kMin: return a < b ? a : b;
    default: ADD_FAILURE(); return 0.f;
  }
}
const char* bin_name(BinOp op) {
  static constexpr const char* kNames[] = {"add", "sub", "mul", "div", "max", "min"};
  return kNames[static_cast<int>(op)];
}
const std::vector<BinOp> kAllBinOps = {BinOp::kAdd, BinOp::kSub, BinOp::kMul, BinOp::kDiv, BinOp::kMax, BinOp::kMin};

struct TbinCase {
  BinOp op;
  uint8_t bcast;
};
class Tbin : public ::testing::TestWithParam<TbinCase> {};

TEST_P(Tbin, MatchesHostExactly) {
  const TbinCase p = GetParam();
  constexpr int kRows = 6, kCols = 19;
  const int yr = p.bcast == kBcastRow ? 1 : kRows, yc = p.bcast == kBcastCol ? 1 : kCols;
  const auto x = spread_floats(kRows * kCols, 1001, -3, 3);
  const auto y = spread_floats(static_cast<size_t>(yr * yc), 1002, -3, 3);
  KernelBuilder b("tbin");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t ay = b.arg_buffer("y", Access::kIn, DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0};
  LocalAlloc la;
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, kRows, kCols, la.take(kRows * kCols * 4));
  b.tdef(Tile{1}, DType::kF32, yr, yc, la.take(static_cast<size_t>(yr * yc) * 4));
  b.tdef(Tile{2}, DType::kF32, kRows, kCols, la.take(kRows * kCols * 4));
  b.tld(Tile{0}, ax, zero, DType::kF32);
  b.tld(Tile{1}, ay, zero, DType::kF32);
  b.tbin(p.op, Tile{2}, Tile{0}, Tile{1}, p.bcast);
  b.tst(Tile{2}, aout, zero, DType::kF32);
  Sim sim;
  const Buf bx = sim.input(x), by = sim.input(y), bo = sim.output(kRows * kCols * 4);
  NPURT_ASSERT_OK(sim.run(b, {bx.arg(), by.arg(), bo.arg()}));
  const auto got = sim.read<float>(bo);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const float yv = y[static_cast<size_t>((p.bcast == kBcastRow ? 0 : r) * yc + (p.bcast == kBcastCol ? 0 : c))];
      const float xv = x[static_cast<size_t>(r * kCols + c)];
      ASSERT_EQ(f32_bits(got[static_cast<size_t>(r * kCols + c)]), f32_bits(bin_ref(p.op, xv, yv)))
          << "(" << r << ", " << c << "): " << xv << " " << bin_name(p.op) << " " << yv;
    }
  }
}

const char* bcast_name(uint8_t flag) {
  static constexpr const char* kNames[] = {"none", "row", "col"};
  return kNames[flag];
}

std::vector<TbinCase> all_tbin_cases() {
  std::vector<TbinCase> v;
  for (BinOp op : kAllBinOps) {
    for (uint8_t bc : {kBcastNone, kBcastRow, kBcastCol}) v.push_back({op, bc});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tbin, ::testing::ValuesIn(all_tbin_cases()),
                         [](const ::testing::TestParamInfo<TbinCase>& i) {
                           return std::string(bin_name(i.param.op)) + "_" + bcast_name(i.param.bcast);
                         });

class Tsop : public ::testing::TestWithParam<BinOp> {};

TEST_P(Tsop, AppliesAnF32ScalarArg) {
  const BinOp op = GetParam();
  constexpr int kRows = 5, kCols = 23;
  const auto x = spread_floats(kRows * kCols, 1101, -3, 3);
  const float s = -1.7320508f;
  KernelBuilder b("tsop");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t as = b.arg_scalar("s", DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0}, sv{1};
  b.li(zero, 0);
  b.arg_value(sv, as);
  b.tdef(Tile{0}, DType::kF32, kRows, kCols, 0);
  b.tdef(Tile{1}, DType::kF32, kRows, kCols, 1024);
  b.tld(Tile{0}, ax, zero, DType::kF32);
  b.tsop(op, Tile{1}, Tile{0}, sv);
  b.tst(Tile{1}, aout, zero, DType::kF32);
  Sim sim;
  const Buf bx = sim.input(x), bo = sim.output(kRows * kCols * 4);
  NPURT_ASSERT_OK(sim.run(b, {bx.arg(), KernelArg::scalar_f32(s), bo.arg()}));
  const auto got = sim.read<float>(bo);
  for (size_t k = 0; k < x.size(); ++k) {
    ASSERT_EQ(f32_bits(got[k]), f32_bits(bin_ref(op, x[k], s))) << k << ": " << x[k];
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tsop, ::testing::ValuesIn(kAllBinOps),
                         [](const ::testing::TestParamInfo<BinOp>& i) { return std::string(bin_name(i.param)); });

// ================================================================ TUN

double un_ref(UnOp op, double x) {
  switch (op) {
    case UnOp::kExp: return std::exp(x);
    case UnOp::kRsqrt: return 1.0 / std::sqrt(x);
    case UnOp::kSqrt: return std::sqrt(x);
    case UnOp::kTanh: return std::tanh(x);
    case UnOp::kGeluTanh: {
      const double k = std::sqrt(2.0 / 3.14159265358979323846);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    }
    case UnOp::kSilu: return x / (1.0 + std::exp(-x));
    case UnOp::kRecip: return 1.0 / x;
    case UnOp::kNeg: return -x;
    case UnOp::kAbs: return std::fabs(x);
    default: ADD_FAILURE(); return 0;
  }
}
const char* un_name(UnOp op) {
  static constexpr const char* kNames[] = {"exp", "rsqrt", "sqrt", "tanh", "gelu_tanh", "silu", "recip", "neg", "abs"};
  return kNames[static_cast<int>(op)];
}

class Tun : public ::testing::TestWithParam<UnOp> {};

TEST_P(Tun, MatchesDoublePrecision) {
  const UnOp op = GetParam();
  constexpr int kRows = 8, kCols = 33;
  auto x = random_floats(kRows * kCols, 1201, -6.f, 6.f);
  if (op == UnOp::kSqrt || op == UnOp::kRsqrt) {
    for (float& v : x) v = std::fabs(v) + 0.01f;
  }
  KernelBuilder b(std::string("tun_") + un_name(op));
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0};
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, kRows, kCols, 0);
  b.tdef(Tile{1}, DType::kF32, kRows, kCols, 2048);
  b.tld(Tile{0}, ax, zero, DType::kF32);
  b.tun(op, Tile{1}, Tile{0});
  b.tst(Tile{1}, aout, zero, DType::kF32);
  Sim sim;
  const Buf bx = sim.input(x), bo = sim.output(x.size() * 4);
  NPURT_ASSERT_OK(sim.run(b, {bx.arg(), bo.arg()}));
  const auto got = sim.read<float>(bo);
  std::vector<double> want(x.size());
  for (size_t k = 0; k < x.size(); ++k) want[k] = un_ref(op, x[k]);
  EXPECT_LE(rel_l2(got, want), 1e-5);
  if (op == UnOp::kNeg || op == UnOp::kAbs || op == UnOp::kSqrt || op == UnOp::kRecip) {
    // Exact IEEE results.
    for (size_t k = 0; k < x.size(); ++k) ASSERT_EQ(got[k], static_cast<float>(want[k])) << x[k];
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tun,
                         ::testing::Values(UnOp::kExp, UnOp::kRsqrt, UnOp::kSqrt, UnOp::kTanh, UnOp::kGeluTanh,
                                           UnOp::kSilu, UnOp::kRecip, UnOp::kNeg, UnOp::kAbs),
                         [](const ::testing::TestParamInfo<UnOp>& i) { return std::string(un_name(i.param)); });

// ================================================================ TRED

const char* red_name(RedOp op) {
  static constexpr const char* kNames[] = {"sum", "max", "sumsq", "argmax"};
  return kNames[static_cast<int>(op)];
}

class Tred : public ::testing::TestWithParam<RedOp> {};

TEST_P(Tred, ReducesEachRow) {
  const RedOp op = GetParam();
  constexpr int kRows = 9, kCols = 37;
  const auto x = random_floats(kRows * kCols, 1301, -3.f, 3.f);
  const DType dt = op == RedOp::kArgmax ? DType::kI32 : DType::kF32;
  KernelBuilder b("tred");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, dt);
  const Reg zero{0};
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, kRows, kCols, 0);
  b.tdef(Tile{1}, dt, kRows, 1, 2048);
  b.tld(Tile{0}, ax, zero, DType::kF32);
  b.tred(op, Tile{1}, Tile{0});
  b.tst(Tile{1}, aout, zero, dt);
  Sim sim;
  const Buf bx = sim.input(x), bo = sim.output(kRows * 4);
  NPURT_ASSERT_OK(sim.run(b, {bx.arg(), bo.arg()}));
  std::vector<double> sums(kRows);
  std::vector<float> maxes(kRows);
  std::vector<int32_t> argmaxes(kRows);
  for (int r = 0; r < kRows; ++r) {
    const float* row = &x[static_cast<size_t>(r * kCols)];
    const float* m = std::max_element(row, row + kCols);  // first of equal maxima
    maxes[static_cast<size_t>(r)] = *m;
    argmaxes[static_cast<size_t>(r)] = static_cast<int32_t>(m - row);
    for (int c = 0; c < kCols; ++c) {
      sums[static_cast<size_t>(r)] += op == RedOp::kSumSq ? double{row[c]} * row[c] : double{row[c]};
    }
  }
  switch (op) {
    case RedOp::kSum:
    case RedOp::kSumSq: EXPECT_LE(rel_l2(sim.read<float>(bo), sums), 1e-6); break;
    case RedOp::kMax: EXPECT_EQ(sim.read<float>(bo), maxes); break;
    case RedOp::kArgmax: EXPECT_EQ(sim.read<int32_t>(bo), argmaxes); break;
    default: FAIL();
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tred, ::testing::Values(RedOp::kSum, RedOp::kMax, RedOp::kSumSq, RedOp::kArgmax),
                         [](const ::testing::TestParamInfo<RedOp>& i) { return std::string(red_name(i.param)); });

// ================================================================ TBCAST

struct BcastCase {
  DType dtype;
  uint8_t flag;
};
class Tbcast : public ::testing::TestWithParam<BcastCase> {};

TEST_P(Tbcast, RepeatsRowOrColumn) {
  const BcastCase p = GetParam();
  constexpr size_t kRows = 6, kCols = 13;
  const bool row = p.flag == kBcastRow;
  const size_t n_src = row ? kCols : kRows;
  const Bytes src = random_elems(p.dtype, n_src, 1401);
  const size_t es = esize(p.dtype);
  KernelBuilder b("tbcast");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, p.dtype);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, p.dtype);
  const Reg zero{0};
  b.li(zero, 0);
  b.tdef(Tile{0}, p.dtype, row ? 1 : static_cast<int>(kRows), row ? static_cast<int>(kCols) : 1, 0);
  b.tdef(Tile{1}, p.dtype, kRows, kCols, 256);
  b.tld(Tile{0}, ax, zero, p.dtype);
  b.tbcast(Tile{1}, Tile{0}, p.flag);
  b.tst(Tile{1}, aout, zero, p.dtype);
  Sim sim;
  const Buf bx = sim.input(src), bo = sim.output(kRows * kCols * es);
  NPURT_ASSERT_OK(sim.run(b, {bx.arg(), bo.arg()}));
  const Bytes got = sim.read<uint8_t>(bo);
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t c = 0; c < kCols; ++c) {
      const size_t s = row ? c : r;
      ASSERT_EQ(0, std::memcmp(&got[(r * kCols + c) * es], &src[s * es], es)) << "(" << r << ", " << c << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tbcast,
                         ::testing::Values(BcastCase{DType::kF32, kBcastRow}, BcastCase{DType::kF32, kBcastCol},
                                           BcastCase{DType::kBF16, kBcastRow}, BcastCase{DType::kBF16, kBcastCol},
                                           BcastCase{DType::kI32, kBcastRow}, BcastCase{DType::kI32, kBcastCol}),
                         [](const ::testing::TestParamInfo<BcastCase>& i) {
                           return name_of(i.param.dtype) + (i.param.flag == kBcastRow ? "_row" : "_col");
                         });

// ================================================================ TMMA

struct MmaCase {
  DType a, b;
  uint8_t flags;
  int m, k, n;
};
class Tmma : public ::testing::TestWithParam<MmaCase> {};

TEST_P(Tmma, MatchesDoublePrecision) {
  const MmaCase p = GetParam();
  const bool trans = p.flags & kTransB, acc = p.flags & kAccumulate;
  const auto m = static_cast<size_t>(p.m), k = static_cast<size_t>(p.k), n = static_cast<size_t>(p.n);
  const Bytes a = encode(p.a, random_floats(m * k, 1501));
  const Bytes bm = encode(p.b, random_floats(k * n, 1502));  // k x n, or n x k when transposed
  const auto c0 = random_floats(m * n, 1503);
  KernelBuilder b("tmma");
  const uint8_t aa = b.arg_buffer("a", Access::kIn, p.a);
  const uint8_t ab = b.arg_buffer("b", Access::kIn, p.b);
  const uint8_t ac = b.arg_buffer("c0", Access::kIn, DType::kF32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0}, nan{1};
  LocalAlloc la;
  b.li(zero, 0);
  b.tdef(Tile{0}, p.a, p.m, p.k, la.take(a.size()));
  b.tdef(Tile{1}, p.b, trans ? p.n : p.k, trans ? p.k : p.n, la.take(bm.size()));
  b.tdef(Tile{2}, DType::kF32, p.m, p.n, la.take(m * n * 4));
  b.tld(Tile{0}, aa, zero, p.a);
  b.tld(Tile{1}, ab, zero, p.b);
  if (acc) {
    b.tld(Tile{2}, ac, zero, DType::kF32);
  } else {
    b.li(nan, bits_imm(std::numeric_limits<float>::quiet_NaN()));  // must be ignored
    b.tfill(Tile{2}, nan);
  }
  b.tmma(Tile{2}, Tile{0}, Tile{1}, p.flags);
  b.tst(Tile{2}, aout, zero, DType::kF32);
  Sim sim;
  const Buf ba = sim.input(a), bb = sim.input(bm), bc = sim.input(c0), bo = sim.output(m * n * 4);
  NPURT_ASSERT_OK(sim.run(b, {ba.arg(), bb.arg(), bc.arg(), bo.arg()}));
  const auto av = decode(p.a, a), bv = decode(p.b, bm);
  std::vector<double> want(m * n);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double s = acc ? c0[i * n + j] : 0.0;
      for (size_t l = 0; l < k; ++l) s += double{av[i * k + l]} * (trans ? bv[j * k + l] : bv[l * n + j]);
      want[i * n + j] = s;
    }
  }
  EXPECT_LE(rel_l2(sim.read<float>(bo), want), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tmma,
                         ::testing::Values(MmaCase{DType::kF32, DType::kF32, 0, 5, 7, 3},
                                           MmaCase{DType::kF32, DType::kF32, kTransB, 5, 7, 3},
                                           MmaCase{DType::kF32, DType::kF32, kAccumulate, 5, 7, 3},
                                           MmaCase{DType::kBF16, DType::kBF16, kTransB | kAccumulate, 5, 7, 3},
                                           MmaCase{DType::kF32, DType::kF32, 0, 32, 64, 48},
                                           MmaCase{DType::kF32, DType::kF32, kTransB | kAccumulate, 32, 64, 48},
                                           MmaCase{DType::kBF16, DType::kBF16, 0, 32, 64, 48},
                                           MmaCase{DType::kBF16, DType::kBF16, kTransB, 32, 64, 48},
                                           MmaCase{DType::kBF16, DType::kBF16, kAccumulate, 32, 64, 48},
                                           MmaCase{DType::kBF16, DType::kF32, kTransB, 32, 64, 48}),
                         [](const ::testing::TestParamInfo<MmaCase>& i) {
                           const MmaCase& c = i.param;
                           return name_of(c.a) + "_" + name_of(c.b) + "_" + std::to_string(c.m) + "x" +
                                  std::to_string(c.k) + "x" + std::to_string(c.n) +
                                  ((c.flags & kTransB) ? "_transb" : "") + ((c.flags & kAccumulate) ? "_acc" : "");
                         });

// ================================================================ TGET

TEST(InstructionTget, ReadsF32I32AndBf16Elements) {
  constexpr int kRows = 4, kCols = 6;
  const std::vector<int> idx = {0, 5, 13, 23};
  const auto f = random_floats(kRows * kCols, 1601);
  auto i = random_ints(kRows * kCols, 1602, -50000, 50000);
  i[13] = -987654321;  // must come back sign-extended to 64 bits
  const Bytes h = random_elems(DType::kBF16, kRows * kCols, 1603);
  KernelBuilder b("tget");
  const uint8_t af = b.arg_buffer("f", Access::kIn, DType::kF32);
  const uint8_t ai = b.arg_buffer("i", Access::kIn, DType::kI32);
  const uint8_t ah = b.arg_buffer("h", Access::kIn, DType::kBF16);
  const uint8_t of = b.arg_buffer("of", Access::kOut, DType::kF32);
  const uint8_t oi = b.arg_buffer("oi", Access::kOut, DType::kI32);
  const Reg zero{0}, k{1}, v{2};
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, kRows, kCols, 0);
  b.tdef(Tile{1}, DType::kI32, kRows, kCols, 256);
  b.tdef(Tile{2}, DType::kBF16, kRows, kCols, 512);
  b.tld(Tile{0}, af, zero, DType::kF32);
  b.tld(Tile{1}, ai, zero, DType::kI32);
  b.tld(Tile{2}, ah, zero, DType::kBF16);
  for (size_t s = 0; s < idx.size(); ++s) {
    b.li(k, idx[s]);
    b.tget(v, Tile{0}, k);
    store_f32(b, v, of, zero, static_cast<int>(s));
    b.tget(v, Tile{2}, k);
    store_f32(b, v, of, zero, static_cast<int>(idx.size() + s));
    b.tget(v, Tile{1}, k);
    store_i64(b, v, oi, zero, static_cast<int>(s));
  }
  Sim sim;
  const Buf bf = sim.input(f), bi = sim.input(i), bh = sim.input(h);
  const Buf bof = sim.output(idx.size() * 8), boi = sim.output(idx.size() * 8);
  NPURT_ASSERT_OK(sim.run(b, {bf.arg(), bi.arg(), bh.arg(), bof.arg(), boi.arg()}));
  const auto rf = sim.read<float>(bof);
  const auto ri = sim.read<int32_t>(boi);
  const auto hv = decode(DType::kBF16, h);
  for (size_t s = 0; s < idx.size(); ++s) {
    const auto e = static_cast<size_t>(idx[s]);
    EXPECT_EQ(rf[s], f[e]) << e;
    EXPECT_EQ(rf[idx.size() + s], hv[e]) << e;
    EXPECT_EQ(i64_at(ri, s), i[e]) << e;
  }
}

// ================================================================ TGATHER

struct GatherCase {
  DType table, tile;
};
class Tgather : public ::testing::TestWithParam<GatherCase> {};

// Gathers 9 of 23 table rows (10 used columns, pitch 13 elements) by the first
// column of a 9x3 index tile; the other index columns hold junk.
TEST_P(Tgather, CopiesIndexedRows) {
  const GatherCase p = GetParam();
  constexpr size_t kTableRows = 23, kPitch = 13, kCols = 10, kN = 9, kIdxCols = 3;
  const Bytes table = random_elems(p.table, kTableRows * kPitch, 1701);
  std::vector<int32_t> idx = random_ints(kN * kIdxCols, 1702, 1000000, 2000000);
  const auto rows = random_ints(kN, 1703, 0, kTableRows - 1);
  for (size_t r = 0; r < kN; ++r) idx[r * kIdxCols] = rows[r];
  idx[2 * kIdxCols] = kTableRows - 1;
  const size_t ts = esize(p.table), ds = esize(p.tile);
  KernelBuilder b("tgather");
  const uint8_t at = b.arg_buffer("table", Access::kIn, p.table);
  const uint8_t ai = b.arg_buffer("idx", Access::kIn, DType::kI32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, p.tile);
  const Reg zero{0}, pitch{1};
  b.li(zero, 0);
  b.li(pitch, static_cast<int64_t>(kPitch * ts));
  b.tdef(Tile{0}, DType::kI32, kN, kIdxCols, 0);
  b.tdef(Tile{1}, p.tile, kN, kCols, 512);
  b.tld(Tile{0}, ai, zero, DType::kI32);
  b.tgather(Tile{1}, at, Tile{0}, pitch, p.table);
  b.tst(Tile{1}, aout, zero, p.tile);
  Sim sim;
  const Buf bt = sim.input(table), bi = sim.input(idx), bo = sim.output(kN * kCols * ds);
  NPURT_ASSERT_OK(sim.run(b, {bt.arg(), bi.arg(), bo.arg()}));
  const Bytes got = sim.read<uint8_t>(bo);
  for (size_t r = 0; r < kN; ++r) {
    const auto first = static_cast<size_t>(idx[r * kIdxCols]) * kPitch * ts;
    const Bytes src(table.begin() + static_cast<ptrdiff_t>(first),
                    table.begin() + static_cast<ptrdiff_t>(first + kCols * ts));
    const Bytes want = convert_host(src, p.table, p.tile);
    ASSERT_EQ(0, std::memcmp(&got[r * kCols * ds], want.data(), want.size())) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Instruction, Tgather,
                         ::testing::Values(GatherCase{DType::kF32, DType::kF32}, GatherCase{DType::kBF16, DType::kF32},
                                           GatherCase{DType::kBF16, DType::kBF16}, GatherCase{DType::kF32, DType::kBF16},
                                           GatherCase{DType::kF16, DType::kF32}, GatherCase{DType::kI32, DType::kI32}),
                         [](const ::testing::TestParamInfo<GatherCase>& i) {
                           return name_of(i.param.table) + "_to_" + name_of(i.param.tile);
                         });

// ================================================================ grids

// y = x * s + chunk index over 45 chunks of 4x16; block b takes chunks b, b + count,
// ... (trip count computed with ALU ops), so any grid size covers every chunk once.
TEST(InstructionGrid, BlocksPartitionWorkByIdAndCount) {
  constexpr int kChunks = 45, kChunkElems = 64;
  const auto x = random_floats(kChunks * kChunkElems, 1801);
  const float s = 0.8125f;
  KernelBuilder b("partition");
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t ay = b.arg_buffer("y", Access::kOut, DType::kF32);
  const uint8_t as = b.arg_scalar("s", DType::kF32);
  const uint8_t an = b.arg_scalar("chunks", DType::kI32);
  const Reg bid{0}, cnt{1}, nch{2}, trips{3}, off{4}, step{5}, idx{6}, fidx{7}, sv{8};
  const Tile t{0};
  b.block_id(bid);
  b.block_count(cnt);
  b.arg_value(nch, an);
  b.arg_value(sv, as);
  b.alu(AluOp::kSub, trips, nch, bid);
  b.alu(AluOp::kAdd, trips, trips, cnt);
  b.alui(AluOp::kSub, trips, trips, 1);
  b.alu(AluOp::kDiv, trips, trips, cnt);
  b.alui(AluOp::kMul, off, bid, kChunkElems * 4);
  b.alui(AluOp::kMul, step, cnt, kChunkElems * 4);
  b.mov(idx, bid);
  b.tdef(t, DType::kF32, 4, 16);
  b.loop_begin(trips);
  b.tld(t, ax, off, DType::kF32);
  b.tsop(BinOp::kMul, t, t, sv);
  b.i2f(fidx, idx);
  b.tsop(BinOp::kAdd, t, t, fidx);
  b.tst(t, ay, off, DType::kF32);
  b.alu(AluOp::kAdd, off, off, step);
  b.alu(AluOp::kAdd, idx, idx, cnt);
  b.loop_end();

  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * s + static_cast<float>(i / kChunkElems);
  for (uint32_t grid : {20u, 1u, 45u}) {
    SCOPED_TRACE(grid);
    Sim sim;
    ASSERT_EQ(sim.dev().info().num_cores, 8u);
    const Buf bx = sim.input(x), by = sim.output(x.size() * 4);
    const auto before = sim.dev().counters();
    NPURT_ASSERT_OK(sim.run(b, {bx.arg(), by.arg(), KernelArg::scalar_f32(s), KernelArg::scalar_i64(kChunks)}, grid));
    EXPECT_EQ((sim.dev().counters() - before).blocks, grid);
    const auto y = sim.read<float>(by);
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], want[i]) << i;
  }
}

// ================================================================ faults

struct FaultCase {
  const char* name;
  std::function<void(KernelBuilder&, uint8_t in, uint8_t out)> emit;
  const char* message;
};

std::ostream& operator<<(std::ostream& os, const FaultCase& c) { return os << c.name; }

const uint32_t kLocalBytes = hal::SimOptions{}.local_memory_bytes;

const std::vector<FaultCase> kFaults = {
    {"alu_div_by_zero",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, 7);
       b.li(Reg{2}, 0);
       b.alu(AluOp::kDiv, Reg{3}, Reg{1}, Reg{2});
     },
     "division"},
    {"alui_rem_by_zero",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, -7);
       b.alui(AluOp::kRem, Reg{3}, Reg{1}, 0);
     },
     "division"},
    {"div_overflow",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, std::numeric_limits<int64_t>::min());
       b.alui(AluOp::kDiv, Reg{3}, Reg{1}, -1);
     },
     "division"},
    {"f2i_out_of_range",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, bits_imm(-1e30f));
       b.f2i(Reg{2}, Reg{1});
     },
     "out of range"},
    {"tdef_register_shape",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, 1000);
       b.li(Reg{2}, 1000);
       b.tdef(Tile{0}, DType::kF32, Reg{1}, Reg{2});
     },
     "exceeds local memory"},
    {"tdef_offset_register",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, kLocalBytes - 32);
       b.tdef(Tile{0}, DType::kF32, 1, 16, 0, Reg{1});
     },
     "exceeds local memory"},
    {"tld_out_of_bounds",
     [](KernelBuilder& b, uint8_t in, uint8_t) {
       b.li(Reg{1}, 4);
       b.tdef(Tile{0}, DType::kF32, 8, 8);
       b.tld(Tile{0}, in, Reg{1}, DType::kF32);
     },
     "out-of-bounds access to arg 0"},
    {"tld_stride_out_of_bounds",
     [](KernelBuilder& b, uint8_t in, uint8_t) {
       b.li(Reg{1}, 0);
       b.li(Reg{2}, 17);
       b.tdef(Tile{0}, DType::kF32, 4, 16);
       b.tld(Tile{0}, in, Reg{1}, DType::kF32, Reg{2});
     },
     "out-of-bounds access to arg 0"},
    {"tst_out_of_bounds",
     [](KernelBuilder& b, uint8_t, uint8_t out) {
       b.li(Reg{1}, 232);
       b.tdef(Tile{0}, DType::kF32, 1, 8);
       b.tst(Tile{0}, out, Reg{1}, DType::kF32);
     },
     "out-of-bounds access to arg 1"},
    {"tgather_out_of_bounds",
     [](KernelBuilder& b, uint8_t in, uint8_t) {
       b.li(Reg{1}, 64);  // row 64 of a 64-row table
       b.li(Reg{2}, 4);
       b.tdef(Tile{0}, DType::kI32, 1, 1);
       b.tdef(Tile{1}, DType::kF32, 1, 1, 64);
       b.tfill(Tile{0}, Reg{1});
       b.tgather(Tile{1}, in, Tile{0}, Reg{2}, DType::kF32);
     },
     "out-of-bounds access to arg 0"},
    {"tget_outside_tile",
     [](KernelBuilder& b, uint8_t, uint8_t) {
       b.li(Reg{1}, 6);
       b.tdef(Tile{0}, DType::kF32, 2, 3);
       b.tget(Reg{2}, Tile{0}, Reg{1});
     },
     "outside tile"},
};

class Faults : public ::testing::TestWithParam<FaultCase> {};

// Each fault fails its launch with kDeviceFault naming the kernel; a new stream
// then runs a good kernel correctly on the same device.
TEST_P(Faults, FailTheLaunchAndLeaveTheDeviceUsable) {
  const FaultCase& c = GetParam();
  const std::string name = std::string("fault_") + c.name;
  KernelBuilder b(name);
  const uint8_t in = b.arg_buffer("in", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  c.emit(b, in, out);
  Sim sim;
  const Buf bi = sim.input(random_floats(64, 1901)), bo = sim.output(256);
  const auto before = sim.dev().counters();
  const Status st = sim.run(b, {bi.arg(), bo.arg()});
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
  EXPECT_TRUE(contains(st, c.message)) << st.to_string();
  EXPECT_TRUE(contains(st, "kernel '" + name + "'")) << st.to_string();
  EXPECT_EQ((sim.dev().counters() - before).kernel_faults, 1u);

  auto good = elementwise_kernel("after_fault", BinOp::kSub);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  const auto x = random_floats(128, 1902), y = random_floats(128, 1903);
  const Buf bx = sim.input(x), by = sim.input(y), bout = sim.output(512);
  const hal::DeviceAddr code = upload(sim.dev(), *good);
  auto fresh = sim.dev().create_stream();
  ASSERT_TRUE(fresh.ok());
  NPURT_ASSERT_OK(sim.dev().launch(*fresh, {code, 2, {bx.arg(), by.arg(), bout.arg()}}));
  NPURT_ASSERT_OK(sim.dev().stream_synchronize(*fresh));
  const auto r = get<float>(sim.dev(), *fresh, bout.addr, 128);
  for (size_t i = 0; i < r.size(); ++i) ASSERT_EQ(r[i], x[i] - y[i]) << i;
  NPURT_ASSERT_OK(sim.dev().destroy_stream(*fresh));
}

INSTANTIATE_TEST_SUITE_P(Instruction, Faults, ::testing::ValuesIn(kFaults),
                         [](const ::testing::TestParamInfo<FaultCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace npurt
