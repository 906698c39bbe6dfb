// Highway implementation of the simulated cores' tile math (see tile_kernels.h).
//
// foreach_target.h re-includes this file once per compiled target; everything inside
// HWY_NAMESPACE is compiled for each. Each target fills one KernelTable; the public
// functions at the end pick a table once and call through it.

#include "hal/sim/tile_kernels.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "npurt/base/math.h"
#include "npurt/base/status.h"

#include "hal/sim/hwy_targets.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "hal/sim/tile_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// Highway headers below must follow foreach_target.h.
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

// ---- Declarations shared by all targets (compiled once) -------------------------
#ifndef NPURT_HAL_SIM_TILE_KERNELS_SHARED_
#define NPURT_HAL_SIM_TILE_KERNELS_SHARED_

namespace npurt::sim::detail {

// Plain dtypes index kernel tables by their code.
static_assert(static_cast<int>(isa::DType::kF32) == 0 && static_cast<int>(isa::DType::kBF16) == 1 &&
              static_cast<int>(isa::DType::kF16) == 2 && static_cast<int>(isa::DType::kI32) == 3);
inline constexpr size_t kNumPlainTypes = 4;
inline constexpr size_t kPlainSize[kNumPlainTypes] = {4, 2, 2, 4};
inline constexpr size_t kNumBinOps = static_cast<size_t>(isa::BinOp::kEnd);
inline constexpr size_t kNumUnOps = static_cast<size_t>(isa::UnOp::kEnd);
inline constexpr size_t kNumRedOps = static_cast<size_t>(isa::RedOp::kEnd);

using ConvertFn = void (*)(const void* src, void* dst, size_t n);
using BinaryFn = void (*)(const float* a, const float* b, float* out, size_t n);
using BinaryScalarFn = void (*)(const float* a, float s, float* out, size_t n);
using UnaryFn = void (*)(const float* in, float* out, size_t n);
using ReduceFn = void (*)(const float* in, size_t rows, size_t cols, void* out);
using TransposeFn = void (*)(const float* src, size_t src_stride, size_t rows, size_t cols, float* dst,
                            size_t dst_stride);
using MatmulFn = void (*)(const void* a, isa::DType a_type, const void* b, isa::DType b_type,
                          float* c, size_t m, size_t n, size_t k, bool trans_b, bool accumulate);

// Every kernel of one target. Ops index the arrays by enum value; convert by
// [src code][dst code] (identical types are a plain move, handled by the caller).
struct KernelTable {
  int64_t target;
  ConvertFn convert[kNumPlainTypes][kNumPlainTypes];
  BinaryFn binary[kNumBinOps];
  BinaryScalarFn binary_scalar[kNumBinOps];
  UnaryFn unary[kNumUnOps];
  ReduceFn reduce[kNumRedOps];
  MatmulFn matmul;
  TransposeFn transpose;
  uint64_t (*fma_probe)(uint64_t rounds);
};

// Per-thread, grow-only buffers for matmul's repacked operands.
enum ScratchSlot { kScratchA, kScratchB, kScratchBRows, kNumScratchSlots };
float* scratch_floats(ScratchSlot slot, size_t count);

}  // namespace npurt::sim::detail

#endif  // NPURT_HAL_SIM_TILE_KERNELS_SHARED_

// ---- Per-target kernels ------------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace npurt::sim {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using isa::DType;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DH = hn::Rebind<uint16_t, DF>;  // one 16-bit lane per f32 lane
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;
using VH = hn::Vec<DH>;
constexpr size_t kN = hn::MaxLanes(DF());

#if HWY_TARGET <= HWY_AVX3
constexpr size_t kVectorRegs = 32;
#else
constexpr size_t kVectorRegs = 16;
#endif

// ---- Element formats and conversions ------------------------------------------------

// Element formats as types, so that kernels are instantiated per format.
struct F32 { using T = float; };
struct BF16 { using T = uint16_t; };  // raw bf16 bits
struct F16 { using T = uint16_t; };   // raw IEEE binary16 bits
struct I32 { using T = int32_t; };

HWY_INLINE VF BF16ToF32(VH h) {
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), h)));
}

HWY_INLINE VH F32ToBF16(VF v) {
  const DU du;
  const VU bits = hn::BitCast(du, v);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even. NaNs are
  // handled apart: the carry could turn them into infinities.
  const VU lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const VU rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb)));
  const VU quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
  return hn::TruncateTo(DH(), hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded));
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// F16C (part of every AVX2/AVX-512 target) converts exactly, rounding to nearest even.
HWY_INLINE VF F16ToF32(VH h) {
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::PromoteTo(DF(), hn::BitCast(df16, h));
}

HWY_INLINE VH F32ToF16(VF v) {
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::BitCast(DH(), hn::DemoteTo(df16, v));
}
#else
// Integer versions with the same results as F16C (Highway's portable f16 conversions
// truncate and mishandle infinities).
HWY_INLINE VF F16ToF32(VH h) {
  const DF df;
  const DU du;
  const DI di;
  const VU bits = hn::PromoteTo(du, h);
  const VU sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000u)));
  const VU mag = hn::And(bits, hn::Set(du, 0x7FFFu));
  const VI mag_i = hn::BitCast(di, mag);
  // Normal numbers: move the fields and rebias the exponent (15 -> 127).
  const VU normal = hn::Add(hn::ShiftLeft<13>(mag), hn::Set(du, 112u << 23));
  // Subnormals: mantissa * 2^-24 is exact in f32.
  const VU subnormal =
      hn::BitCast(du, hn::Mul(hn::ConvertTo(df, mag_i), hn::Set(df, 0x1.0p-24f)));
  // Infinities and NaNs keep their payload; NaNs are quieted as F16C does.
  const VU inf_nan = hn::Or(hn::ShiftLeft<13>(mag), hn::Set(du, 0x7F800000u));
  const VU quieted = hn::IfThenElse(hn::RebindMask(du, hn::Gt(mag_i, hn::Set(di, 0x7C00))),
                                    hn::Or(inf_nan, hn::Set(du, 0x00400000u)), inf_nan);
  VU r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(mag_i, hn::Set(di, 0x0400))), subnormal,
                        normal);
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(mag_i, hn::Set(di, 0x7BFF))), quieted, r);
  return hn::BitCast(df, hn::Or(r, sign));
}

HWY_INLINE VH F32ToF16(VF v) {
  const DF df;
  const DU du;
  const DI di;
  const VU bits = hn::BitCast(du, v);
  const VU sign = hn::And(bits, hn::Set(du, 0x80000000u));
  const VU mag = hn::Xor(bits, sign);
  const VI mag_i = hn::BitCast(di, mag);
  // Normal results: rebias the exponent (127 -> 15, i.e. add 0xC8000000 modulo 2^32)
  // and round the mantissa to nearest even; a carry out of the mantissa bumps the
  // exponent, up to infinity, which is the correct rounding.
  const VU odd = hn::And(hn::ShiftRight<13>(mag), hn::Set(du, 1u));
  const VU normal = hn::ShiftRight<13>(hn::Add(hn::Add(mag, hn::Set(du, 0xC8000FFFu)), odd));
  // Subnormal results (|v| < 2^-14): adding 0.5 places the f16 ulp (2^-24) at the f32
  // ulp of 0.5, so the FPU's own nearest-even rounding does the work.
  const VU subnormal = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, mag), hn::Set(df, 0.5f))),
                               hn::Set(du, 0x3F000000u));
  const VU payload = hn::And(hn::ShiftRight<13>(mag), hn::Set(du, 0x3FFu));
  const VU nan = hn::Or(hn::Set(du, 0x7E00u), payload);
  const VU inf_nan = hn::IfThenElse(hn::RebindMask(du, hn::Gt(mag_i, hn::Set(di, 0x7F800000))),
                                    nan, hn::Set(du, 0x7C00u));
  VU r = hn::IfThenElse(hn::RebindMask(du, hn::Lt(mag_i, hn::Set(di, 113 << 23))), subnormal,
                        normal);
  // |v| >= 2^16 overflows even before rounding.
  r = hn::IfThenElse(hn::RebindMask(du, hn::Gt(mag_i, hn::Set(di, (143 << 23) - 1))), inf_nan,
                     r);
  return hn::TruncateTo(DH(), hn::Or(r, hn::ShiftRight<16>(sign)));
}
#endif

HWY_INLINE VI F32ToI32(VF v) {
  const DF df;
  const DI di;
  const VF x = hn::IfThenZeroElse(hn::IsNaN(v), v);
  const VF two31 = hn::Set(df, 2147483648.0f);
  // Clamp into the convertible range first: out-of-range conversions differ between
  // targets (and are undefined in C++). 2147483520 is the largest f32 below 2^31.
  const VF clamped = hn::Min(hn::Max(x, hn::Neg(two31)), hn::Set(df, 2147483520.0f));
  return hn::IfThenElse(hn::RebindMask(di, hn::Ge(x, two31)),
                        hn::Set(di, std::numeric_limits<int32_t>::max()),
                        hn::ConvertTo(di, clamped));
}

// Loads / stores kN elements of a format as f32 lanes.
HWY_INLINE VF LoadF32(F32, const float* p) { return hn::LoadU(DF(), p); }
HWY_INLINE VF LoadF32(BF16, const uint16_t* p) { return BF16ToF32(hn::LoadU(DH(), p)); }
HWY_INLINE VF LoadF32(F16, const uint16_t* p) { return F16ToF32(hn::LoadU(DH(), p)); }
HWY_INLINE VF LoadF32(I32, const int32_t* p) { return hn::ConvertTo(DF(), hn::LoadU(DI(), p)); }
HWY_INLINE void StoreF32(F32, VF v, float* p) { hn::StoreU(v, DF(), p); }
HWY_INLINE void StoreF32(BF16, VF v, uint16_t* p) { hn::StoreU(F32ToBF16(v), DH(), p); }
HWY_INLINE void StoreF32(F16, VF v, uint16_t* p) { hn::StoreU(F32ToF16(v), DH(), p); }
HWY_INLINE void StoreF32(I32, VF v, int32_t* p) { hn::StoreU(F32ToI32(v), DI(), p); }

template <class Src, class Dst>
void ConvertKernel(const void* src, void* dst, size_t n) {
  const auto* in = static_cast<const typename Src::T*>(src);
  auto* out = static_cast<typename Dst::T*>(dst);
  size_t i = 0;
  for (; i + kN <= n; i += kN) StoreF32(Dst(), LoadF32(Src(), in + i), out + i);
  if (i == n) return;
  // The tail goes through stack buffers: not every target has 16-bit masked loads.
  typename Src::T in_tail[kN] = {};
  typename Dst::T out_tail[kN];
  std::memcpy(in_tail, in + i, (n - i) * sizeof(*in));
  StoreF32(Dst(), LoadF32(Src(), in_tail), out_tail);
  std::memcpy(out + i, out_tail, (n - i) * sizeof(*out));
}

// Converts n elements of type `type` (f32, bf16 or f16) to f32.
void ToF32(DType type, const void* src, float* dst, size_t n) {
  switch (type) {
    case DType::kBF16:
      return ConvertKernel<BF16, F32>(src, dst, n);
    case DType::kF16:
      return ConvertKernel<F16, F32>(src, dst, n);
    default:
      std::memcpy(dst, src, n * sizeof(float));
  }
}

const void* ElementAt(const void* base, DType type, size_t index) {
  return static_cast<const uint8_t*>(base) + index * detail::kPlainSize[static_cast<size_t>(type)];
}

// ---- Elementwise ops ---------------------------------------------------------------

struct OpAdd { HWY_INLINE VF operator()(VF a, VF b) const { return hn::Add(a, b); } };
struct OpSub { HWY_INLINE VF operator()(VF a, VF b) const { return hn::Sub(a, b); } };
struct OpMul { HWY_INLINE VF operator()(VF a, VF b) const { return hn::Mul(a, b); } };
struct OpDiv { HWY_INLINE VF operator()(VF a, VF b) const { return hn::Div(a, b); } };
// Spelled as compare + select: hn::Max/Min treat NaN differently on each target.
struct OpMax {
  HWY_INLINE VF operator()(VF a, VF b) const { return hn::IfThenElse(hn::Gt(a, b), a, b); }
};
struct OpMin {
  HWY_INLINE VF operator()(VF a, VF b) const { return hn::IfThenElse(hn::Lt(a, b), a, b); }
};

template <class Op>
void BinaryKernel(const float* a, const float* b, float* out, size_t n) {
  const DF d;
  const Op op;
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(op(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  if (i == n) return;
  const auto mask = hn::FirstN(d, n - i);
  hn::BlendedStore(op(hn::MaskedLoad(mask, d, a + i), hn::MaskedLoad(mask, d, b + i)), mask, d,
                   out + i);
}

template <class Op>
void BinaryScalarKernel(const float* a, float s, float* out, size_t n) {
  const DF d;
  const Op op;
  const VF vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(op(hn::LoadU(d, a + i), vs), d, out + i);
  if (i == n) return;
  const auto mask = hn::FirstN(d, n - i);
  hn::BlendedStore(op(hn::MaskedLoad(mask, d, a + i), vs), mask, d, out + i);
}

// f(x) with x clamped to [lo, hi], for Highway functions that are only valid on a
// range; NaN lanes are passed through.
template <typename F>
HWY_INLINE VF OnClamped(VF x, float lo, float hi, F f) {
  const DF d;
  const auto nan = hn::IsNaN(x);
  const VF clamped = hn::Min(hn::Max(hn::IfThenZeroElse(nan, x), hn::Set(d, lo)), hn::Set(d, hi));
  return hn::IfThenElse(nan, x, f(d, clamped));
}

// Highway's Exp is valid on [-FLT_MAX, 104] and turns NaN into 0; clamping keeps large
// inputs at +inf / 0.
HWY_INLINE VF ExpChecked(VF x) {
  return OnClamped(x, -105.0f, 104.0f, [](DF d, VF v) { return hn::Exp(d, v); });
}

// tanh is +-1 in f32 beyond |x| ~ 9; clamping keeps Highway's expm1 in its valid range.
HWY_INLINE VF TanhChecked(VF x) {
  return OnClamped(x, -20.0f, 20.0f, [](DF d, VF v) { return hn::Tanh(d, v); });
}

struct OpExp { HWY_INLINE VF operator()(VF x) const { return ExpChecked(x); } };
struct OpRsqrt {
  HWY_INLINE VF operator()(VF x) const { return hn::Div(hn::Set(DF(), 1.0f), hn::Sqrt(x)); }
};
struct OpSqrt { HWY_INLINE VF operator()(VF x) const { return hn::Sqrt(x); } };
struct OpTanh { HWY_INLINE VF operator()(VF x) const { return TanhChecked(x); } };
// 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)); the second form has no cancellation for x < 0.
struct OpGeluTanh {
  HWY_INLINE VF operator()(VF x) const {
    const DF d;
    constexpr float kC0 = 0.7978845608028654f;  // sqrt(2/pi)
    constexpr float kC1 = kC0 * 0.044715f;
    const VF minus_2u = hn::Mul(x, hn::MulAdd(hn::Set(d, -2.0f * kC1), hn::Mul(x, x),
                                              hn::Set(d, -2.0f * kC0)));
    return hn::Div(x, hn::Add(hn::Set(d, 1.0f), ExpChecked(minus_2u)));
  }
};
struct OpSilu {
  HWY_INLINE VF operator()(VF x) const {
    return hn::Div(x, hn::Add(hn::Set(DF(), 1.0f), ExpChecked(hn::Neg(x))));
  }
};
struct OpRecip {
  HWY_INLINE VF operator()(VF x) const { return hn::Div(hn::Set(DF(), 1.0f), x); }
};
struct OpNeg { HWY_INLINE VF operator()(VF x) const { return hn::Neg(x); } };
struct OpAbs { HWY_INLINE VF operator()(VF x) const { return hn::Abs(x); } };

template <class Op>
void UnaryKernel(const float* in, float* out, size_t n) {
  const DF d;
  const Op op;
  size_t i = 0;
  for (; i + kN <= n; i += kN) hn::StoreU(op(hn::LoadU(d, in + i)), d, out + i);
  if (i == n) return;
  const auto mask = hn::FirstN(d, n - i);
  hn::BlendedStore(op(hn::MaskedLoad(mask, d, in + i)), mask, d, out + i);
}

// Ops whose Highway form is accurate on part of the f32 line only. Lanes outside it
// (rare: RoPE angles, for instance, stay far inside) get the C library's result in
// double, so every input has a defined, IEEE-conforming answer. The vector form
// never sees such lanes: they are replaced by 1 first, which keeps its integer
// range reduction away from overflow.
//
// Highway's Sin/Cos reduce with a four-part pi and are accurate to a few ulp for
// |x| <= 39000 (math-inl.h); beyond that the reduction loses bits.
constexpr float kTrigMaxArg = 39000.0f;

struct OpSin {
  static bool InRange(float x) { return std::fabs(x) <= kTrigMaxArg; }
  static float Scalar(float x) { return static_cast<float>(std::sin(static_cast<double>(x))); }
  HWY_INLINE hn::Mask<DF> Outside(VF x) const { return hn::Not(hn::Le(hn::Abs(x), hn::Set(DF(), kTrigMaxArg))); }
  // Highway's Sin(-0) is +0; keep the sign of zero as IEEE sin does.
  HWY_INLINE VF operator()(VF x) const {
    return hn::IfThenElse(hn::Eq(x, hn::Zero(DF())), x, hn::Sin(DF(), x));
  }
};
struct OpCos {
  static bool InRange(float x) { return OpSin::InRange(x); }
  static float Scalar(float x) { return static_cast<float>(std::cos(static_cast<double>(x))); }
  HWY_INLINE hn::Mask<DF> Outside(VF x) const { return OpSin().Outside(x); }
  HWY_INLINE VF operator()(VF x) const { return hn::Cos(DF(), x); }
};
// Highway's Log is valid on (0, FLT_MAX], subnormals included; 0, negatives, +inf and
// NaN take the scalar path (-inf, NaN, +inf, NaN).
struct OpLog {
  static bool InRange(float x) { return x > 0.0f && x < std::numeric_limits<float>::infinity(); }
  static float Scalar(float x) { return static_cast<float>(std::log(static_cast<double>(x))); }
  HWY_INLINE hn::Mask<DF> Outside(VF x) const {
    const DF d;
    return hn::Not(hn::And(hn::Gt(x, hn::Zero(d)), hn::Lt(x, hn::Inf(d))));
  }
  HWY_INLINE VF operator()(VF x) const { return hn::Log(DF(), x); }
};

template <class Op>
void RangedUnaryKernel(const float* in, float* out, size_t n) {
  const DF d;
  const Op op;
  const VF one = hn::Set(d, 1.0f);
  for (size_t i = 0; i < n; i += kN) {
    const size_t lanes = std::min(kN, n - i);
    const auto valid = hn::FirstN(d, lanes);
    const VF x = hn::MaskedLoad(valid, d, in + i);
    const auto outside = op.Outside(x);
    VF y = op(hn::IfThenElse(outside, one, x));
    if (HWY_UNLIKELY(!hn::AllFalse(d, hn::And(outside, valid)))) {
      HWY_ALIGN float ys[kN];
      hn::Store(y, d, ys);
      // `out` may alias `in`, but these lanes of it are written only below.
      for (size_t j = 0; j < lanes; ++j) {
        if (!Op::InRange(in[i + j])) ys[j] = Op::Scalar(in[i + j]);
      }
      y = hn::Load(d, ys);
    }
    hn::BlendedStore(y, valid, d, out + i);
  }
}

// ---- The canonical order of sums ------------------------------------------------------
//
// A kernel's results are a property of the tile ISA, not of the vector width that
// simulates it: every sum runs on kLanes = 16 lanes, which AVX-512 holds in one
// vector, AVX2 in two and the fallback in sixteen, and ends in one halving tree.
// Every target with FMA (AVX-512, AVX2) therefore gives the same bits; the fallback
// keeps the order, but Highway's scalar MulAdd rounds twice.

constexpr size_t kLanes = 16;
static_assert(kLanes % kN == 0, "the canonical lanes are whole vectors");
constexpr size_t kLaneVecs = kLanes / kN;

HWY_INLINE float Tree4(const float* t) { return (t[0] + t[2]) + (t[1] + t[3]); }

// Lane l + lane l + 8, then l + l + 4, l + l + 2 and l + l + 1: the matvec kernels' tree.
HWY_INLINE float Tree16(const VF (&lanes)[kLaneVecs]) {
#if HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2
#if HWY_TARGET <= HWY_AVX3
  const hn::Half<DF> d8;
  const auto h8 = hn::Add(hn::LowerHalf(d8, lanes[0]), hn::UpperHalf(d8, lanes[0]));
#else
  const DF d8;
  const VF h8 = hn::Add(lanes[0], lanes[1]);
#endif
  const hn::Half<std::remove_const_t<decltype(d8)>> d4;
  float q[4];
  hn::StoreU(hn::Add(hn::LowerHalf(d4, h8), hn::UpperHalf(d4, h8)), d4, q);
  return Tree4(q);
#else
  // Narrower targets (the fallback; SSE2 or EMU128 where a compiler builds them).
  float t[kLanes], h[8], q[4];
  for (size_t v = 0; v < kLaneVecs; ++v) hn::StoreU(lanes[v], DF(), t + v * kN);
  for (size_t l = 0; l < 8; ++l) h[l] = t[l] + t[l + 8];
  for (size_t l = 0; l < 4; ++l) q[l] = h[l] + h[l + 4];
  return Tree4(q);
#endif
}

// ---- Row reductions ------------------------------------------------------------------

// Sum (or sum of squares) in the canonical order: the row zero-padded to whole runs
// of kLanes, lane l summing the values at l, l + kLanes, ... in order, then Tree16.
template <bool kSquares>
float RowSum(const float* p, size_t cols) {
  const DF d;
  const auto add = [](VF acc, VF v) { return kSquares ? hn::MulAdd(v, v, acc) : hn::Add(acc, v); };
  VF acc[kLaneVecs];
  for (VF& a : acc) a = hn::Zero(d);
  size_t i = 0;
  for (; i + kLanes <= cols; i += kLanes) {
#pragma GCC unroll 16
    for (size_t v = 0; v < kLaneVecs; ++v) acc[v] = add(acc[v], hn::LoadU(d, p + i + v * kN));
  }
  for (size_t v = 0; i + v * kN < cols; ++v) {
    const size_t at = i + v * kN;
    acc[v] = add(acc[v], hn::MaskedLoad(hn::FirstN(d, std::min(kN, cols - at)), d, p + at));
  }
  return Tree16(acc);
}

// Lanes past the end of a row read as -inf, which never wins a max.
HWY_INLINE VF LoadTailOrMinusInf(const float* p, size_t count) {
  const DF d;
  const auto mask = hn::FirstN(d, count);
  return hn::IfThenElse(mask, hn::MaskedLoad(mask, d, p),
                        hn::Set(d, -std::numeric_limits<float>::infinity()));
}

// "v > acc" is false for NaN, so NaNs count as -inf.
HWY_INLINE VF TakeGreater(VF acc, VF v) { return hn::IfThenElse(hn::Gt(v, acc), v, acc); }

float RowMax(const float* p, size_t cols) {
  const DF d;
  const VF minus_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  VF m0 = minus_inf, m1 = minus_inf;
  size_t i = 0;
  for (; i + 2 * kN <= cols; i += 2 * kN) {
    m0 = TakeGreater(m0, hn::LoadU(d, p + i));
    m1 = TakeGreater(m1, hn::LoadU(d, p + i + kN));
  }
  for (; i + kN <= cols; i += kN) m0 = TakeGreater(m0, hn::LoadU(d, p + i));
  if (i < cols) m1 = TakeGreater(m1, LoadTailOrMinusInf(p + i, cols - i));
  return hn::GetLane(hn::MaxOfLanes(d, TakeGreater(m0, m1)));
}

// Each lane keeps its first maximum and that element's index; the answer is the
// smallest index among lanes holding the overall maximum. If nothing beats -inf
// (all elements -inf or NaN), element 0 is a maximum.
int32_t RowArgmax(const float* p, size_t cols) {
  if (cols == 0) return -1;
  const DF d;
  const DI di;
  VF best = hn::Set(d, -std::numeric_limits<float>::infinity());
  VI best_index = hn::Zero(di);
  VI index = hn::Iota(di, 0);
  const VI step = hn::Set(di, static_cast<int32_t>(kN));
  size_t i = 0;
  const auto update = [&](VF v) {
    const auto greater = hn::Gt(v, best);
    best = hn::IfThenElse(greater, v, best);
    best_index = hn::IfThenElse(hn::RebindMask(di, greater), index, best_index);
    index = hn::Add(index, step);
  };
  for (; i + kN <= cols; i += kN) update(hn::LoadU(d, p + i));
  if (i < cols) update(LoadTailOrMinusInf(p + i, cols - i));
  const VF max = hn::MaxOfLanes(d, best);
  if (hn::GetLane(max) == -std::numeric_limits<float>::infinity()) return 0;
  const VI candidates = hn::IfThenElse(hn::RebindMask(di, hn::Eq(best, max)), best_index,
                                       hn::Set(di, std::numeric_limits<int32_t>::max()));
  return hn::GetLane(hn::MinOfLanes(di, candidates));
}

void ReduceSum(const float* in, size_t rows, size_t cols, void* out) {
  auto* o = static_cast<float*>(out);
  for (size_t r = 0; r < rows; ++r) o[r] = RowSum<false>(in + r * cols, cols);
}
void ReduceSumSq(const float* in, size_t rows, size_t cols, void* out) {
  auto* o = static_cast<float*>(out);
  for (size_t r = 0; r < rows; ++r) o[r] = RowSum<true>(in + r * cols, cols);
}
void ReduceMax(const float* in, size_t rows, size_t cols, void* out) {
  auto* o = static_cast<float*>(out);
  for (size_t r = 0; r < rows; ++r) o[r] = RowMax(in + r * cols, cols);
}
void ReduceArgmax(const float* in, size_t rows, size_t cols, void* out) {
  auto* o = static_cast<int32_t*>(out);
  for (size_t r = 0; r < rows; ++r) o[r] = RowArgmax(in + r * cols, cols);
}

// ---- Matmul, dot-product form ----------------------------------------------------------
//
// Used with trans_b (every C element is the dot product of two contiguous rows) when
// the outer-product form does not pay off, and for non-transposed B narrower than
// kLanes (transposed into rows first). A block of R rows of A and S rows of B is
// computed at once, so each loaded B vector serves R rows and each A vector S columns.
// Rows are consumed in chunks of kDotChunk = 32 values, zero-padded at the end.
//
// Each dot product runs in the canonical order: lane l of its kLanes accumulators
// sums, by FMA in order, the products of the values at l, l + 16, ... (f32, f16), or
// at 2l and 2l + 1 of every chunk (bf16), then Tree16. With R*S >= 4 pairs per block
// the chains hide the FMA latency.
//
// bf16 A rows are widened without shuffles: a u32 lane holding elements (2i, 2i+1)
// gives element 2i by a left shift and 2i+1 by masking, so one pair of vectors holds
// the even, then the odd elements of 2*kN inputs. B is repacked in that order.

constexpr size_t kDotChunk = 32;
constexpr size_t kDotVecs = kDotChunk / kN;
// Block shape: R = kDotRows rows of A against up to kDotCols rows of B, or
// kDotRowsOneCol rows of A when B has a single row; sized to the vector registers.
constexpr size_t kDotRows = kN == 1 ? 1 : (kVectorRegs == 32 ? 4 : 2);
constexpr size_t kDotCols = kN == 1 ? 2 : (kVectorRegs == 32 ? 4 : 2);
constexpr size_t kDotRowsOneCol = kN == 1 ? 2 : (kVectorRegs == 32 ? 8 : 4);

struct RowF32 {
  using T = float;
  using Format = F32;
  static constexpr bool kEvenOdd = false;
  static HWY_INLINE void Load(const float* p, VF& lo, VF& hi) {
    lo = hn::LoadU(DF(), p);
    hi = hn::LoadU(DF(), p + kN);
  }
};

struct RowBF16 {
  using T = uint16_t;
  using Format = BF16;
  static constexpr bool kEvenOdd = true;
  static HWY_INLINE void Load(const uint16_t* p, VF& even, VF& odd) {
    const DU du;
    const VU pairs = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
    even = hn::BitCast(DF(), hn::ShiftLeft<16>(pairs));
    odd = hn::BitCast(DF(), hn::And(pairs, hn::Set(du, 0xFFFF0000u)));
  }
};

struct RowF16 {
  using T = uint16_t;
  using Format = F16;
  static constexpr bool kEvenOdd = false;
  static HWY_INLINE void Load(const uint16_t* p, VF& lo, VF& hi) {
    lo = F16ToF32(hn::LoadU(DH(), p));
    hi = F16ToF32(hn::LoadU(DH(), p + kN));
  }
};

// How far ahead of use A rows are prefetched. With several A rows streaming at once
// the hardware prefetchers alone leave the bf16 GEMV shape waiting on L2.
constexpr size_t kDotPrefetchBytes = 512;

// The address is computed as an integer: it may lie past the end of the row's array,
// which a prefetch tolerates but pointer arithmetic does not.
HWY_INLINE void PrefetchAhead(const void* p) {
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(p) + kDotPrefetchBytes;
  hwy::Prefetch(reinterpret_cast<const uint8_t*>(ahead));
}

// One chunk: accumulates A[r] chunk vector v * B[s] chunk vector v into the
// accumulator of v's canonical lanes.
template <class Row, size_t R, size_t S, size_t kAcc>
HWY_INLINE void DotStep(const typename Row::T* a, size_t lda, const float* b, size_t ldb,
                        VF (&acc)[R][S][kAcc]) {
  const DF d;
#pragma GCC unroll 8
  for (size_t q = 0; q < kDotVecs; q += 2) {
    // The canonical lanes of the two vectors: (even, odd) of one run of 2 * kN values,
    // or two consecutive runs of kN.
    const size_t kLo = Row::kEvenOdd ? (q / 2) % kLaneVecs : q % kLaneVecs;
    const size_t kHi = Row::kEvenOdd ? kLo : (q + 1) % kLaneVecs;
    VF b_lo[S], b_hi[S];
#pragma GCC unroll 8
    for (size_t s = 0; s < S; ++s) {
      b_lo[s] = hn::LoadU(d, b + s * ldb + q * kN);
      b_hi[s] = hn::LoadU(d, b + s * ldb + (q + 1) * kN);
    }
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      VF lo, hi;
      PrefetchAhead(a + r * lda + q * kN);
      Row::Load(a + r * lda + q * kN, lo, hi);
#pragma GCC unroll 8
      for (size_t s = 0; s < S; ++s) {
        acc[r][s][kLo] = hn::MulAdd(lo, b_lo[s], acc[r][s][kLo]);
        acc[r][s][kHi] = hn::MulAdd(hi, b_hi[s], acc[r][s][kHi]);
      }
    }
  }
}

// C[R x S] (+)= A[R rows] . B[S rows]. a_tail holds the last partial chunk of each A
// row, zero-padded (row stride kDotChunk); B rows are zero-padded to whole chunks.
template <class Row, size_t R, size_t S>
HWY_NOINLINE void DotBlock(const typename Row::T* a, size_t lda, const typename Row::T* a_tail,
                           const float* b, size_t ldb, size_t k, float* c, size_t ldc,
                           bool accumulate) {
  const DF d;
  constexpr size_t kAcc = kLaneVecs;
  VF acc[R][S][kAcc];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (size_t s = 0; s < S; ++s) {
#pragma GCC unroll 8
      for (size_t v = 0; v < kAcc; ++v) acc[r][s][v] = hn::Zero(d);
    }
  }

  const size_t full = k - k % kDotChunk;
  for (size_t p = 0; p < full; p += kDotChunk) {
    DotStep<Row, R, S, kAcc>(a + p, lda, b + p, ldb, acc);
  }
  if (full != k) DotStep<Row, R, S, kAcc>(a_tail, kDotChunk, b + full, ldb, acc);

#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (size_t s = 0; s < S; ++s) {
      const float dot = Tree16(acc[r][s]);
      float& out = c[r * ldc + s];
      out = accumulate ? out + dot : dot;
    }
  }
}

template <class Row>
using DotBlockFn = void (*)(const typename Row::T*, size_t, const typename Row::T*,
                            const float*, size_t, size_t, float*, size_t, bool);

// Blocks of 1..sizeof(R) rows of A against S rows of B, indexed by rows - 1.
template <class Row, size_t S, size_t... R>
constexpr std::array<DotBlockFn<Row>, sizeof...(R)> DotBlockRow(std::index_sequence<R...>) {
  return {&DotBlock<Row, R + 1, S>...};
}

// [B rows - 1][A rows - 1] for blocks of up to kDotRows x kDotCols.
template <class Row, size_t... S>
constexpr std::array<std::array<DotBlockFn<Row>, kDotRows>, sizeof...(S)> DotBlocks(
    std::index_sequence<S...>) {
  return {DotBlockRow<Row, S + 1>(std::make_index_sequence<kDotRows>())...};
}

// C = A . B^T with B given as n rows of f32 (row stride ldb, zero-padded to a whole
// chunk past k, in the order Row expects).
template <class Row>
void DotMatmul(const typename Row::T* a, const float* b, size_t ldb, float* c, size_t m,
               size_t n, size_t k, bool accumulate) {
  using T = typename Row::T;
  static constexpr auto kBlocks = DotBlocks<Row>(std::make_index_sequence<kDotCols>());
  static constexpr auto kOneColBlocks =
      DotBlockRow<Row, 1>(std::make_index_sequence<kDotRowsOneCol>());
  // A single B row has no other row to share A's loads with, so more A rows keep the
  // same number of accumulators busy.
  const size_t block_rows = n == 1 ? kDotRowsOneCol : kDotRows;
  const size_t tail = k % kDotChunk;
  T a_tail[std::max(kDotRows, kDotRowsOneCol) * kDotChunk] = {};
  for (size_t i0 = 0; i0 < m; i0 += block_rows) {
    const size_t rows = std::min(block_rows, m - i0);
    const T* a_block = a + i0 * k;
    for (size_t r = 0; r < rows && tail != 0; ++r) {
      std::memcpy(a_tail + r * kDotChunk, a_block + r * k + (k - tail), tail * sizeof(T));
    }
    float* c_block = c + i0 * n;
    if (n == 1) {
      kOneColBlocks[rows - 1](a_block, k, a_tail, b, ldb, k, c_block, n, accumulate);
      continue;
    }
    for (size_t j = 0; j < n; j += kDotCols) {
      const size_t cols = std::min(kDotCols, n - j);
      kBlocks[cols - 1][rows - 1](a_block, k, a_tail, b + j * ldb, ldb, k, c_block + j, n,
                                  accumulate);
    }
  }
}

// Reorders each run of 2*kN floats into (even elements, odd elements): the order in
// which RowBF16 widens A.
void DeinterleavePairs(float* row, size_t len) {
#if HWY_TARGET == HWY_SCALAR
  (void)row;  // with one lane the (even, odd) order is the natural order
  (void)len;
#else
  const DF d;
  for (size_t p = 0; p < len; p += 2 * kN) {
    const VF lo = hn::LoadU(d, row + p);
    const VF hi = hn::LoadU(d, row + p + kN);
    hn::StoreU(hn::ConcatEven(d, hi, lo), d, row + p);
    hn::StoreU(hn::ConcatOdd(d, hi, lo), d, row + p + kN);
  }
#endif
}

// Column j of the k x n matrix B as a contiguous f32 row j of `out`. Used for n < kN,
// where each B row is a single partial vector.
void TransposeToF32(const void* b, DType type, size_t n, size_t k, float* out, size_t ld_out) {
  float row[kN];
  for (size_t p = 0; p < k; ++p) {
    for (size_t j0 = 0; j0 < n; j0 += kN) {
      const size_t count = std::min(kN, n - j0);
      ToF32(type, ElementAt(b, type, p * n + j0), row, count);
      for (size_t j = 0; j < count; ++j) out[(j0 + j) * ld_out + p] = row[j];
    }
  }
}

// B as the dot form wants it: n rows of f32, row stride *ldb. f32 B rows are used in
// place when no padding or reordering is needed; otherwise B is repacked into scratch.
const float* DotOperandB(const void* b, DType type, bool trans_b, size_t n, size_t k,
                         bool even_odd, size_t* ldb) {
  if (trans_b && type == DType::kF32 && !even_odd && k % kDotChunk == 0) {
    *ldb = k;
    return static_cast<const float*>(b);
  }
  const size_t padded = ceil_div(k, kDotChunk) * kDotChunk;
  float* packed = detail::scratch_floats(detail::kScratchB, n * padded);
  if (trans_b) {
    for (size_t j = 0; j < n; ++j) ToF32(type, ElementAt(b, type, j * k), packed + j * padded, k);
  } else {
    TransposeToF32(b, type, n, k, packed, padded);
  }
  for (size_t j = 0; j < n; ++j) {
    float* row = packed + j * padded;
    std::fill(row + k, row + padded, 0.0f);
    if (even_odd) DeinterleavePairs(row, padded);
  }
  *ldb = padded;
  return packed;
}

// ---- Matmul, outer-product form ---------------------------------------------------------
//
// C is computed in register blocks of up to kOuterRows rows x kOuterVecs vectors: each
// step broadcasts one A element per row and multiplies it with the vectors of one B
// row. k is cut into slices so that a slice of a B panel stays in L1 while every row
// block uses it; C is updated once per slice, which also bounds rounding error growth.
// Each C element sums a slice's products by FMA in order from zero and is then added
// to C: lanes are columns, so only the slice length (fixed) decides the order.

constexpr size_t kOuterRows = kN == 1 ? 4 : 6;
constexpr size_t kOuterVecs = kVectorRegs == 32 ? 4 : 2;
constexpr size_t kOuterWidth = kOuterVecs * kN;
// The same slices on every target, so that every C element sees the same sums.
constexpr size_t kOuterSlice = 128;

// Writes an R x V register block to C, adding to C if add_to_c; only the first `cols`
// columns exist in C.
template <size_t R, size_t V>
HWY_INLINE void StoreOuterBlock(const VF (&acc)[R][V], float* c, size_t ldc, size_t cols,
                                bool add_to_c) {
  const DF d;
  if (cols == V * kN) {
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (size_t v = 0; v < V; ++v) {
        float* out = c + r * ldc + v * kN;
        hn::StoreU(add_to_c ? hn::Add(hn::LoadU(d, out), acc[r][v]) : acc[r][v], d, out);
      }
    }
    return;
  }
  float row[V * kN];
  for (size_t r = 0; r < R; ++r) {
    for (size_t v = 0; v < V; ++v) hn::StoreU(acc[r][v], d, row + v * kN);
    float* out = c + r * ldc;
    for (size_t j = 0; j < cols; ++j) out[j] = add_to_c ? out[j] + row[j] : row[j];
  }
}

// C[R x cols] (+)= A[R x kc] (f32, row stride lda) * B[kc x V vectors] (row stride ldb).
template <size_t R, size_t V>
HWY_NOINLINE void OuterBlock(const float* a, size_t lda, const float* b, size_t ldb, size_t kc,
                             float* c, size_t ldc, size_t cols, bool add_to_c) {
  const DF d;
  VF acc[R][V];
#pragma GCC unroll 8
  for (size_t r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (size_t v = 0; v < V; ++v) acc[r][v] = hn::Zero(d);

  for (size_t p = 0; p < kc; ++p) {
    VF bv[V];
#pragma GCC unroll 8
    for (size_t v = 0; v < V; ++v) bv[v] = hn::LoadU(d, b + p * ldb + v * kN);
#pragma GCC unroll 8
    for (size_t r = 0; r < R; ++r) {
      const VF av = hn::Set(d, a[r * lda + p]);
#pragma GCC unroll 8
      for (size_t v = 0; v < V; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  StoreOuterBlock(acc, c, ldc, cols, add_to_c);
}

using OuterBlockFn = void (*)(const float*, size_t, const float*, size_t, size_t, float*, size_t,
                              size_t, bool);

template <size_t R, size_t... V>
constexpr std::array<OuterBlockFn, sizeof...(V)> OuterBlockRow(std::index_sequence<V...>) {
  return {&OuterBlock<R, V + 1>...};
}

// [rows - 1][vectors - 1]
template <size_t... R>
constexpr std::array<std::array<OuterBlockFn, kOuterVecs>, sizeof...(R)> OuterBlocks(
    std::index_sequence<R...>) {
  return {OuterBlockRow<R + 1>(std::make_index_sequence<kOuterVecs>())...};
}

// B for the outer form, as column panels: panel q holds columns
// [q * width, (q + 1) * width) as a k x width f32 matrix with row stride `ld`, starting
// `stride` floats after panel q - 1. Columns past n are zero.
struct OuterOperand {
  const float* data;
  size_t ld;
  size_t width;
  size_t stride;
};

// C = A * B with A in Format (row stride k). Non-f32 A is converted one k slice at a
// time (m x slice floats in scratch), so each element is converted once and the
// slice stays in cache while every panel uses it.
template <class Format>
void OuterMatmul(const typename Format::T* a, const OuterOperand& b, float* c, size_t m,
                 size_t n, size_t k, bool accumulate) {
  static constexpr auto kBlocks = OuterBlocks(std::make_index_sequence<kOuterRows>());
  constexpr bool kConvertA = !std::is_same_v<Format, F32>;
  float* a_slice = kConvertA ? detail::scratch_floats(detail::kScratchA, m * kOuterSlice) : nullptr;
  for (size_t p0 = 0; p0 < k; p0 += kOuterSlice) {
    const size_t kc = std::min(kOuterSlice, k - p0);
    const bool add_to_c = accumulate || p0 != 0;
    const float* a_rows = nullptr;
    size_t lda = k;
    if constexpr (kConvertA) {
      if (kc == k) {  // one slice: the rows are contiguous
        ConvertKernel<Format, F32>(a, a_slice, m * k);
      } else {
        for (size_t i = 0; i < m; ++i) {
          ConvertKernel<Format, F32>(a + i * k + p0, a_slice + i * kc, kc);
        }
      }
      a_rows = a_slice;
      lda = kc;
    } else {
      a_rows = a + p0;
    }
    for (size_t j0 = 0; j0 < n; j0 += b.width) {
      const size_t cols = std::min(b.width, n - j0);
      const size_t vecs = ceil_div(cols, kN);
      const float* b_slice = b.data + j0 / b.width * b.stride + p0 * b.ld;
      for (size_t i0 = 0; i0 < m; i0 += kOuterRows) {
        const size_t rows = std::min(kOuterRows, m - i0);
        kBlocks[rows - 1][vecs - 1](a_rows + i0 * lda, lda, b_slice, b.ld, kc, c + i0 * n + j0,
                                    n, cols, add_to_c);
      }
    }
  }
}

#if HWY_TARGET != HWY_SCALAR
// Blocks of 8 x 8 floats are transposed in registers where a vector holds 8 of them.
using D8 = hn::CappedTag<float, 8>;
constexpr bool kTranspose8 = hn::MaxLanes(D8()) == 8;

// out[c * out_stride + r] = in[r * in_stride + c] for r, c < 8: pairs of rows
// interleaved by 32-bit, then 64-bit lanes, then 128-bit halves joined.
HWY_INLINE void Transpose8x8(const float* in, size_t in_stride, float* out, size_t out_stride) {
  const D8 d;
  const hn::Repartition<uint64_t, D8> d64;
  using V = hn::Vec<D8>;
  V r[8], t[8];
#pragma GCC unroll 8
  for (size_t i = 0; i < 8; ++i) r[i] = hn::LoadU(d, in + i * in_stride);
#pragma GCC unroll 4
  for (size_t i = 0; i < 8; i += 2) {
    t[i] = hn::InterleaveLower(d, r[i], r[i + 1]);
    t[i + 1] = hn::InterleaveUpper(d, r[i], r[i + 1]);
  }
  const auto pairs_lo = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  const auto pairs_hi = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
#pragma GCC unroll 2
  for (size_t i = 0; i < 8; i += 4) {
    r[i] = pairs_lo(t[i], t[i + 2]);
    r[i + 1] = pairs_hi(t[i], t[i + 2]);
    r[i + 2] = pairs_lo(t[i + 1], t[i + 3]);
    r[i + 3] = pairs_hi(t[i + 1], t[i + 3]);
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < 4; ++i) {
    hn::StoreU(hn::ConcatLowerLower(d, r[i + 4], r[i]), d, out + i * out_stride);
    hn::StoreU(hn::ConcatUpperUpper(d, r[i + 4], r[i]), d, out + (i + 4) * out_stride);
  }
}
#endif

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols.
void TransposeKernel(const float* src, size_t src_stride, size_t rows, size_t cols, float* dst, size_t dst_stride) {
  // A few source rows at a time: with power-of-two row strides, many concurrent row
  // streams would map to one L1 set and evict each other.
  constexpr size_t kRowsAtOnce = 8;
  for (size_t r0 = 0; r0 < rows; r0 += kRowsAtOnce) {
    const size_t r_end = std::min(rows, r0 + kRowsAtOnce);
    size_t c = 0;
#if HWY_TARGET != HWY_SCALAR
    if (kTranspose8 && r_end - r0 == kRowsAtOnce) {
      for (; c + 8 <= cols; c += 8) {
        Transpose8x8(src + r0 * src_stride + c, src_stride, dst + c * dst_stride + r0, dst_stride);
      }
    }
#endif
    for (; c < cols; ++c) {
      for (size_t r = r0; r < r_end; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
    }
  }
}

// Writes rows [0, cols) of an f32 matrix (row stride k) transposed into a k x width
// panel, zero-padding the columns past cols.
void TransposeIntoPanel(const float* rows, size_t k, size_t cols, size_t width, float* panel) {
  TransposeKernel(rows, k, cols, k, panel, width);
  if (cols == width) return;
  for (size_t p = 0; p < k; ++p) std::fill(panel + p * width + cols, panel + (p + 1) * width, 0.0f);
}

// B as the outer form wants it: in place if f32, not transposed and with whole vectors
// per row; otherwise repacked into zero-padded f32 panels in scratch, as narrow as n
// allows.
OuterOperand OuterOperandB(const void* b, DType type, bool trans_b, size_t n, size_t k) {
  if (!trans_b && type == DType::kF32 && n % kN == 0) {
    return {static_cast<const float*>(b), n, kOuterWidth, kOuterWidth};
  }
  const size_t width = std::min(kOuterWidth, ceil_div(n, kN) * kN);
  float* packed = detail::scratch_floats(detail::kScratchB, ceil_div(n, width) * k * width);
  const float* rows = static_cast<const float*>(b);  // trans_b: B as f32 rows
  if (trans_b && type != DType::kF32) {
    float* converted = detail::scratch_floats(detail::kScratchBRows, n * k);
    ToF32(type, b, converted, n * k);
    rows = converted;
  }
  for (size_t j0 = 0; j0 < n; j0 += width) {
    const size_t cols = std::min(width, n - j0);
    float* panel = packed + j0 / width * k * width;
    if (trans_b) {
      TransposeIntoPanel(rows + j0 * k, k, cols, width, panel);
      continue;
    }
    for (size_t p = 0; p < k; ++p) {
      float* row = panel + p * width;
      ToF32(type, ElementAt(b, type, p * n + j0), row, cols);
      std::fill(row + cols, row + width, 0.0f);
    }
  }
  return {packed, width, width, k * width};
}

// ---- Matmul entry --------------------------------------------------------------------------

// With trans_b, the outer form needs B transposed (n*k scalar moves) and beats the
// dot form only once A has enough rows and B enough columns to amortize that
// (measured on AVX-512 for k from 256 to 2048).
constexpr size_t kOuterMinRowsTransB = 64;
constexpr size_t kOuterMinColsTransB = 2 * kLanes;

template <class Row>
void MatmulWithA(const typename Row::T* a, const void* b, DType b_type, float* c, size_t m,
                 size_t n, size_t k, bool trans_b, bool accumulate) {
  // The forms sum in different orders, so the choice depends on the shape alone, never
  // on the vector width. The dot form suits narrow C.
  const bool outer = trans_b ? (m >= kOuterMinRowsTransB && n >= kOuterMinColsTransB) : n >= kLanes;
  if (!outer) {
    size_t ldb = 0;
    const float* bp = DotOperandB(b, b_type, trans_b, n, k, Row::kEvenOdd, &ldb);
    DotMatmul<Row>(a, bp, ldb, c, m, n, k, accumulate);
    return;
  }
  const OuterOperand bp = OuterOperandB(b, b_type, trans_b, n, k);
  OuterMatmul<typename Row::Format>(a, bp, c, m, n, k, accumulate);
}

// Shapes are non-empty and types valid (checked by the caller).
void Matmul(const void* a, DType a_type, const void* b, DType b_type, float* c, size_t m,
            size_t n, size_t k, bool trans_b, bool accumulate) {
  switch (a_type) {
    case DType::kF32:
      return MatmulWithA<RowF32>(static_cast<const float*>(a), b, b_type, c, m, n, k, trans_b,
                                 accumulate);
    case DType::kBF16:
      return MatmulWithA<RowBF16>(static_cast<const uint16_t*>(a), b, b_type, c, m, n, k,
                                  trans_b, accumulate);
    default:
      return MatmulWithA<RowF16>(static_cast<const uint16_t*>(a), b, b_type, c, m, n, k,
                                 trans_b, accumulate);
  }
}

// ---- FMA throughput probe ------------------------------------------------------------------

uint64_t FmaProbe(uint64_t rounds) {
  const DF d;
  // More independent chains than FMA latency x FMA ports on current x86 cores, so the
  // loop is bound by FMA throughput alone.
  constexpr size_t kChains = 12;
  VF acc[kChains];
#pragma GCC unroll 16
  for (size_t i = 0; i < kChains; ++i) acc[i] = hn::Set(d, 1.0f + 0.001f * static_cast<float>(i));
  // Converges to 1 and never reaches subnormals or infinities.
  const VF mul = hn::Set(d, 0.999999f);
  const VF add = hn::Set(d, 0.000001f);
  for (uint64_t round = 0; round < rounds; ++round) {
#pragma GCC unroll 16
    for (size_t i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], mul, add);
  }
  VF sum = acc[0];
#pragma GCC unroll 16
  for (size_t i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  // The volatile store keeps the loop from being optimized away.
  volatile float sink = hn::GetLane(hn::SumOfLanes(d, sum));
  (void)sink;
  return rounds * kChains * kN * 2;
}

// ---- Table -----------------------------------------------------------------------------------

constexpr detail::KernelTable kTable = {
    HWY_TARGET,
    {
        // Identical types never reach the table.
        {nullptr, &ConvertKernel<F32, BF16>, &ConvertKernel<F32, F16>, &ConvertKernel<F32, I32>},
        {&ConvertKernel<BF16, F32>, nullptr, &ConvertKernel<BF16, F16>, &ConvertKernel<BF16, I32>},
        {&ConvertKernel<F16, F32>, &ConvertKernel<F16, BF16>, nullptr, &ConvertKernel<F16, I32>},
        {&ConvertKernel<I32, F32>, &ConvertKernel<I32, BF16>, &ConvertKernel<I32, F16>, nullptr},
    },
    // Order of isa::BinOp.
    {&BinaryKernel<OpAdd>, &BinaryKernel<OpSub>, &BinaryKernel<OpMul>, &BinaryKernel<OpDiv>,
     &BinaryKernel<OpMax>, &BinaryKernel<OpMin>},
    {&BinaryScalarKernel<OpAdd>, &BinaryScalarKernel<OpSub>, &BinaryScalarKernel<OpMul>,
     &BinaryScalarKernel<OpDiv>, &BinaryScalarKernel<OpMax>, &BinaryScalarKernel<OpMin>},
    // Order of isa::UnOp.
    {&UnaryKernel<OpExp>, &UnaryKernel<OpRsqrt>, &UnaryKernel<OpSqrt>, &UnaryKernel<OpTanh>,
     &UnaryKernel<OpGeluTanh>, &UnaryKernel<OpSilu>, &UnaryKernel<OpRecip>, &UnaryKernel<OpNeg>,
     &UnaryKernel<OpAbs>, &RangedUnaryKernel<OpSin>, &RangedUnaryKernel<OpCos>, &RangedUnaryKernel<OpLog>},
    // Order of isa::RedOp.
    {&ReduceSum, &ReduceMax, &ReduceSumSq, &ReduceArgmax},
    &Matmul,
    &TransposeKernel,
    &FmaProbe,
};

}  // namespace

const detail::KernelTable* GetKernelTable() { return &kTable; }

}  // namespace HWY_NAMESPACE
}  // namespace npurt::sim
HWY_AFTER_NAMESPACE();

// ---- Dispatch and public functions (compiled once) ---------------------------------------
#if HWY_ONCE

namespace npurt::sim {

// The table arrays above are listed in enum order; catch an enum that grows.
static_assert(detail::kNumBinOps == 6 && detail::kNumUnOps == 12 && detail::kNumRedOps == 4,
              "update the kernel tables for the new ops");

float* detail::scratch_floats(ScratchSlot slot, size_t count) {
  struct Buffer {
    hwy::AlignedFreeUniquePtr<float[]> data;
    size_t capacity = 0;
  };
  thread_local Buffer buffers[kNumScratchSlots];
  Buffer& buffer = buffers[slot];
  if (buffer.capacity < count) {
    buffer.data = hwy::AllocateAligned<float>(count);
    NPURT_CHECK(buffer.data != nullptr);
    buffer.capacity = count;
  }
  return buffer.data.get();
}

HWY_EXPORT(GetKernelTable);

namespace {

std::atomic<const detail::KernelTable*> g_kernels{nullptr};

const detail::KernelTable& Kernels() {
  const detail::KernelTable* table = g_kernels.load(std::memory_order_acquire);
  if (HWY_UNLIKELY(table == nullptr)) {
    table = HWY_DYNAMIC_DISPATCH(GetKernelTable)();
    g_kernels.store(table, std::memory_order_release);
  }
  return *table;
}

size_t PlainIndex(isa::DType type) {
  const auto index = static_cast<size_t>(type);
  NPURT_CHECK(index < detail::kNumPlainTypes);
  return index;
}

bool IsMatmulType(isa::DType type) {
  return type == isa::DType::kF32 || type == isa::DType::kBF16 || type == isa::DType::kF16;
}

template <typename Enum>
size_t OpIndex(Enum op, size_t count) {
  const auto index = static_cast<size_t>(op);
  NPURT_CHECK(index < count);
  return index;
}

}  // namespace

void convert(const void* src, isa::DType src_type, void* dst, isa::DType dst_type, size_t n) {
  const size_t from = PlainIndex(src_type);
  const size_t to = PlainIndex(dst_type);
  if (n == 0) return;
  if (from == to) {
    std::memmove(dst, src, n * detail::kPlainSize[from]);
    return;
  }
  Kernels().convert[from][to](src, dst, n);
}

void transpose(const float* src, size_t src_stride, size_t rows, size_t cols, float* dst, size_t dst_stride) {
  Kernels().transpose(src, src_stride, rows, cols, dst, dst_stride);
}

void binary(isa::BinOp op, const float* a, const float* b, float* out, size_t n) {
  Kernels().binary[OpIndex(op, detail::kNumBinOps)](a, b, out, n);
}

void binary_scalar(isa::BinOp op, const float* a, float s, float* out, size_t n) {
  Kernels().binary_scalar[OpIndex(op, detail::kNumBinOps)](a, s, out, n);
}

void unary(isa::UnOp op, const float* in, float* out, size_t n) {
  Kernels().unary[OpIndex(op, detail::kNumUnOps)](in, out, n);
}

void reduce_rows(isa::RedOp op, const float* in, size_t rows, size_t cols, void* out) {
  Kernels().reduce[OpIndex(op, detail::kNumRedOps)](in, rows, cols, out);
}

void matmul(const void* a, isa::DType a_type, const void* b, isa::DType b_type, float* c,
            size_t m, size_t n, size_t k, bool trans_b, bool accumulate) {
  NPURT_CHECK(IsMatmulType(a_type) && IsMatmulType(b_type));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) std::fill(c, c + m * n, 0.0f);
    return;
  }
  Kernels().matmul(a, a_type, b, b_type, c, m, n, k, trans_b, accumulate);
}

const char* tile_kernels_target() { return hwy::TargetName(Kernels().target); }

uint64_t tile_kernels_fma_probe(uint64_t rounds) { return Kernels().fma_probe(rounds); }

std::vector<int64_t> tile_kernels_targets() {
  // The fallback always runs, whether or not the CPU query lists it.
  const int64_t runnable = (hwy::SupportedTargets() | HWY_STATIC_TARGET | HWY_SCALAR) & HWY_TARGETS;
  std::vector<int64_t> targets;
  for (int64_t rest = runnable; rest != 0; rest &= rest - 1) targets.push_back(rest & -rest);
  return targets;
}

void tile_kernels_set_target_for_test(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  g_kernels.store(HWY_DYNAMIC_DISPATCH(GetKernelTable)(), std::memory_order_release);
}

}  // namespace npurt::sim

#endif  // HWY_ONCE
