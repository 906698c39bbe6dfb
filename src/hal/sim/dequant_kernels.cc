// Highway implementation of sim::dequantize (see dequant_kernels.h). Each block is
// unpacked to small integers with byte operations, then converted and scaled in f32
// lanes with the reference decoder's operation order (multiply, then subtract; no
// fused multiply-add), which keeps the results bit-identical.

#include "hal/sim/dequant_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <type_traits>
#include <cstring>
#include <vector>

#include "isa/quant_layout.h"
#include "npurt/isa/quant.h"

#include "hal/sim/hwy_targets.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "hal/sim/dequant_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace npurt::sim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI32 = hn::Rebind<int32_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;
using DU8 = hn::Rebind<uint8_t, DF>;

// y[l] = f32(q[l]) * d for l < n (n a multiple of 16, which every block size is).
HWY_INLINE void ScaleI8(const int8_t* q, float d, float* y, size_t n) {
  const DF df;
  const auto vd = hn::Set(df, d);
  for (size_t l = 0; l < n; l += hn::Lanes(df)) {
    const auto v = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DI8(), q + l)));
    hn::StoreU(hn::Mul(v, vd), df, y + l);
  }
}

// y[l] = (d1 * f32(q[l])) - m1 for l < 32, the K-type reconstruction.
HWY_INLINE void ScaleMinusU8(const uint8_t* q, float d1, float m1, float* y) {
  const DF df;
  const auto vd = hn::Set(df, d1), vm = hn::Set(df, m1);
  for (size_t l = 0; l < 32; l += hn::Lanes(df)) {
    const auto v = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DU8(), q + l)));
    hn::StoreU(hn::Sub(hn::Mul(vd, v), vm), df, y + l);
  }
}

// q[j] = (qs[j] & 15 | h[j]) - bias and q[j + 16] = (qs[j] >> 4 | h[j + 16]) - bias for
// j < 16 (h may be null): the 32 values of a Q4_0 / Q5_0 block, in byte lanes.
HWY_INLINE void UnpackNibbles(const uint8_t* qs, const uint8_t* h, uint8_t bias, int8_t* q) {
  const hn::CappedTag<uint8_t, 16> d;
  const auto low = hn::Set(d, 15), vbias = hn::Set(d, bias);
  auto* out = reinterpret_cast<uint8_t*>(q);  // two's complement: u8 wrap == i8 result
  for (size_t j = 0; j < 16; j += hn::Lanes(d)) {
    const auto v = hn::LoadU(d, qs + j);
    auto lo = hn::And(v, low), hi = hn::ShiftRight<4>(v);
    if (h != nullptr) {
      lo = hn::Or(lo, hn::LoadU(d, h + j));
      hi = hn::Or(hi, hn::LoadU(d, h + 16 + j));
    }
    hn::StoreU(hn::Sub(lo, vbias), d, out + j);
    hn::StoreU(hn::Sub(hi, vbias), d, out + 16 + j);
  }
}

// Fields are read in place: copying a whole block to the stack first makes the
// narrower field loads wait on store forwarding.
HWY_INLINE float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return isa::f16_to_f32(h);
}

void RowQ8_0(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(isa::BlockQ8_0), y += 32) {
    ScaleI8(reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ8_0, qs)), HalfAt(src), y, 32);
  }
}

// kFifthBits[v] spreads the 8 bits of v over 8 bytes, each 0x10 or 0: the fifth bits
// of eight Q5_0 values in byte lanes, without a per-value shift.
constexpr auto kFifthBits = [] {
  std::array<uint64_t, 256> t{};
  for (int v = 0; v < 256; ++v) {
    for (int bit = 0; bit < 8; ++bit) {
      if (v & (1 << bit)) t[v] |= uint64_t{0x10} << (8 * bit);
    }
  }
  return t;
}();

// The 32 signed values of a Q4_0 (kFifthBit false) or Q5_0 block.
template <bool kFifthBit>
HWY_INLINE void UnpackQ4_0Q5_0(const uint8_t* src, int8_t* q) {
  if constexpr (kFifthBit) {
    // Bit j of qh is the fifth bit of value j (low nibbles), bit j + 16 of value j + 16.
    const uint8_t* qh = src + offsetof(isa::BlockQ5_0, qh);
    uint8_t h[32];
    for (int k = 0; k < 4; ++k) std::memcpy(h + 8 * k, &kFifthBits[qh[k]], 8);
    UnpackNibbles(src + offsetof(isa::BlockQ5_0, qs), h, 16, q);
  } else {
    UnpackNibbles(src + offsetof(isa::BlockQ4_0, qs), nullptr, 8, q);
  }
}

template <bool kFifthBit>
constexpr size_t kQ4_0Q5_0Bytes = kFifthBit ? sizeof(isa::BlockQ5_0) : sizeof(isa::BlockQ4_0);

template <bool kFifthBit>
void RowQ4_0Q5_0(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += kQ4_0Q5_0Bytes<kFifthBit>, y += 32) {
    int8_t q[32];
    UnpackQ4_0Q5_0<kFifthBit>(src, q);
    ScaleI8(q, HalfAt(src), y, 32);
  }
}

// d * sc_j and dmin * m_j for the eight 32-value sub-blocks of a Q4_K / Q5_K block.
struct KScales {
  float scale[8], min[8];
};

template <typename Block>
HWY_INLINE KScales DecodeKScales(const uint8_t* src) {
  const float d = HalfAt(src + offsetof(Block, d)), dmin = HalfAt(src + offsetof(Block, dmin));
  const uint8_t* scales = src + offsetof(Block, scales);
  KScales k;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    isa::scale_min_k4(j, scales, &sc, &m);
    k.scale[j] = d * static_cast<float>(sc);
    k.min[j] = dmin * static_cast<float>(m);
  }
  return k;
}

// Calls f(j, q, d * sc_j, dmin * m_j) for the eight 32-value sub-blocks j of a Q4_K or
// Q5_K block, q holding the sub-block's unsigned values (Q5_K adds a fifth bit from qh).
template <bool kFifthBit, typename Block, typename F>
HWY_INLINE void ForEachSubBlockK(const uint8_t* src, F&& f) {
  const hn::CappedTag<uint8_t, 32> d8;
  const KScales k = DecodeKScales<Block>(src);
  [[maybe_unused]] const uint8_t* qh = src + (kFifthBit ? offsetof(isa::BlockQ5_K, qh) : 0);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* qs = src + offsetof(Block, qs) + 32 * c;
    uint8_t lo[32], hi[32];
    for (size_t l = 0; l < 32; l += hn::Lanes(d8)) {
      const auto v = hn::LoadU(d8, qs + l);
      auto vlo = hn::And(v, hn::Set(d8, 15)), vhi = hn::ShiftRight<4>(v);
      if constexpr (kFifthBit) {
        // Bit 2c of qh[l] is the fifth bit of the low-nibble value, bit 2c+1 that of the high one.
        const auto h = hn::LoadU(d8, qh + l), one = hn::Set(d8, 1);
        vlo = hn::Or(vlo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), one)));
        vhi = hn::Or(vhi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), one)));
      }
      hn::StoreU(vlo, d8, lo + l);
      hn::StoreU(vhi, d8, hi + l);
    }
    f(2 * c, lo, k.scale[2 * c], k.min[2 * c]);
    f(2 * c + 1, hi, k.scale[2 * c + 1], k.min[2 * c + 1]);
  }
}

// Calls f(g, q, d * sc_g) for the sixteen 16-value groups g of a Q6_K block, q holding
// the group's signed values.
template <typename F>
HWY_INLINE void ForEachGroupQ6_K(const uint8_t* src, F&& f) {
  const float d = HalfAt(src + offsetof(isa::BlockQ6_K, d));
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = src + offsetof(isa::BlockQ6_K, ql) + 64 * half;
    const uint8_t* qh = src + offsetof(isa::BlockQ6_K, qh) + 32 * half;
    const auto* sc = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ6_K, scales)) + 8 * half;
    int8_t q[128];
    isa::unpack_q6_k_half(ql, qh, q);
    // Group g of 16 outputs uses scale sc[g]: (d * sc) * q, as the reference.
    for (int g = 0; g < 8; ++g) f(8 * half + g, q + 16 * g, d * static_cast<float>(sc[g]));
  }
}

template <bool kFifthBit, typename Block>
void RowK(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(Block), y += 256) {
    ForEachSubBlockK<kFifthBit, Block>(src, [&](int j, const uint8_t* q, float scale, float min) {
      ScaleMinusU8(q, scale, min, y + 32 * j);
    });
  }
}

void RowQ6_K(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(isa::BlockQ6_K), y += 256) {
    ForEachGroupQ6_K(src, [&](int g, const int8_t* q, float scale) { ScaleI8(q, scale, y + 16 * g, 16); });
  }
}

void Dequantize(const void* blocks, isa::DType type, float* out, size_t n) {
  const auto* src = static_cast<const uint8_t*>(blocks);
  const size_t nb = n / isa::dtype_block_elems(type);
  switch (type) {
    case isa::DType::kQ8_0: return RowQ8_0(src, out, nb);
    case isa::DType::kQ4_0: return RowQ4_0Q5_0<false>(src, out, nb);
    case isa::DType::kQ5_0: return RowQ4_0Q5_0<true>(src, out, nb);
    case isa::DType::kQ4_K: return RowK<false, isa::BlockQ4_K>(src, out, nb);
    case isa::DType::kQ5_K: return RowK<true, isa::BlockQ5_K>(src, out, nb);
    case isa::DType::kQ6_K: return RowQ6_K(src, out, nb);
    default: return isa::dequantize_row(blocks, type, out, n);  // asserts: not quantized
  }
}

// ---- row dot products: y[i] (+)= sum_k row_i[k] * x[k] -----------------------------
// Each block's integer values are converted and multiplied with x in f32 lanes; the
// block (or sub-block) sum is then scaled once, so no f32 weight tile is materialized.

// GM rows may start at any byte: scalar reads go through memcpy.
template <typename T>
HWY_INLINE T LoadAt(const T* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// sum_l f32(q[l]) * x[l] over n values (n a multiple of 16), as a vector of partials.
template <typename DQ, typename Q>
HWY_INLINE hn::Vec<DF> DotQ(const Q* q, const float* x, size_t n) {
  const DF df;
  auto s = hn::Mul(hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DQ(), q))), hn::LoadU(df, x));
  for (size_t l = hn::Lanes(df); l < n; l += hn::Lanes(df)) {
    const auto v = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DQ(), q + l)));
    s = hn::MulAdd(v, hn::LoadU(df, x + l), s);
  }
  return s;
}

// The f16 d at the start of a Q8_0 / Q4_0 / Q5_0 block (8 bytes or more) in every
// lane. The decode saturates the shuffle port, which the scalar decoder's register
// broadcast would also take: F16C converts the 8 bytes at p (d and 3 unused halves)
// and lane 0 is broadcast back from the stack, a load.
HWY_INLINE hn::Vec<DF> BroadcastBlockHalf(const uint8_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  HWY_ALIGN float f[4];
  _mm_store_ps(f, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  asm("" : "+m"(f));  // keeps the store and the broadcast load
  return hn::Set(DF(), f[0]);
#else
  return hn::Set(DF(), HalfAt(p));
#endif
}

// A row's running state: `acc` holds vector partials of the scaled block sums,
// `min_acc` (vector) or `mins` (scalar) the K types' minimum terms; the row's result
// is sum(acc - min_acc) - mins.
struct RowAcc {
  hn::Vec<DF> acc, min_acc;
  float mins;
};

// QuantBlock<T>::Dot(block, x, xsum, state) adds one block of type T, kElems values
// and kBytes bytes, to a row's state; x points at the block's values, xsum at its
// kXsumPerBlock entries (see MatVecQuant).

template <isa::DType T>
struct QuantBlock;
template <>
struct QuantBlock<isa::DType::kQ8_0> {
  static constexpr size_t kBytes = sizeof(isa::BlockQ8_0), kElems = 32, kXsumPerBlock = 0;
  static HWY_INLINE void Dot(const uint8_t* src, const float* x, const float*, RowAcc& a) {
    const auto* q = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ8_0, qs));
    a.acc = hn::MulAdd(DotQ<DI8>(q, x, 32), BroadcastBlockHalf(src), a.acc);
  }
  // Dot for N vectors (x[t] at the block's values): the block is converted once, and
  // each vector gets Dot's operations in Dot's order, so Dot's bits.
  template <size_t N>
  static HWY_INLINE void DotN(const uint8_t* src, const float* const* x, const float* const*, RowAcc* a) {
    const DF df;
    const size_t lanes = hn::Lanes(df), vecs = 32 / lanes;
    const auto* q = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ8_0, qs));
    hn::Vec<DF> v[32];  // 32 / lanes used
    for (size_t j = 0; j < vecs; ++j) v[j] = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DI8(), q + j * lanes)));
    const auto d = BroadcastBlockHalf(src);
#pragma GCC unroll 8
    for (size_t t = 0; t < N; ++t) {
      auto s = hn::Mul(v[0], hn::LoadU(df, x[t]));
      for (size_t j = 1; j < vecs; ++j) s = hn::MulAdd(v[j], hn::LoadU(df, x[t] + j * lanes), s);
      a[t].acc = hn::MulAdd(s, d, a[t].acc);
    }
  }
};

template <bool kFifthBit>
struct QuantBlockQ4_0Q5_0 {
  static constexpr size_t kBytes = kQ4_0Q5_0Bytes<kFifthBit>, kElems = 32, kXsumPerBlock = 0;
  static HWY_INLINE void Dot(const uint8_t* src, const float* x, const float*, RowAcc& a) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // One lane per qs byte; a permute of the table [-bias, 16 - bias) maps its low
    // nibble (vpermps reads only an index's low 4 bits) or, after a shift, its high
    // nibble to the value, and Q5_0's fifth bits add 16 under masks taken from qh.
    const DF df;
    const __m512i v = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (kFifthBit ? offsetof(isa::BlockQ5_0, qs) : offsetof(isa::BlockQ4_0, qs)))));
    const __m512 table = hn::Iota(df, kFifthBit ? -16.0f : -8.0f).raw;
    __m512 lo = _mm512_permutexvar_ps(v, table), hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
    if constexpr (kFifthBit) {
      const uint32_t qh = LoadAt(reinterpret_cast<const uint32_t*>(src + offsetof(isa::BlockQ5_0, qh)));
      const __m512 sixteen = _mm512_set1_ps(16.0f);
      lo = _mm512_mask_add_ps(lo, static_cast<__mmask16>(qh), lo, sixteen);
      hi = _mm512_mask_add_ps(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
    }
    const auto sum = hn::MulAdd(hn::Vec<DF>{hi}, hn::LoadU(df, x + 16), hn::Mul(hn::Vec<DF>{lo}, hn::LoadU(df, x)));
    a.acc = hn::MulAdd(sum, BroadcastBlockHalf(src), a.acc);
#else
    int8_t q[32];
    UnpackQ4_0Q5_0<kFifthBit>(src, q);
    a.acc = hn::MulAdd(DotQ<DI8>(q, x, 32), BroadcastBlockHalf(src), a.acc);
#endif
  }
};
template <>
struct QuantBlock<isa::DType::kQ4_0> : QuantBlockQ4_0Q5_0<false> {};
template <>
struct QuantBlock<isa::DType::kQ5_0> : QuantBlockQ4_0Q5_0<true> {};

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// [d * sc_0..7, dmin * m_0..7] of a Q4_K block: the 6-bit scales and mins are decoded
// with 32-bit word operations (as ggml does) and converted in one vector.
HWY_INLINE __m512 Q4KScalesMins(const uint8_t* src) {
  const DF df;
  uint32_t u[4];
  std::memcpy(u, src + offsetof(isa::BlockQ4_K, scales), 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_lo = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_lo;
  u[0] &= kLow6;  // bytes of u: sc_0..7, then m_0..7
  // d and dmin (adjacent f16) converted together, then spread to [d x 8, dmin x 8].
  const __m128 d_dmin = _mm_cvtph_ps(_mm_cvtsi32_si128(LoadAt(reinterpret_cast<const int32_t*>(src))));
  const __m512 dd = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                          _mm512_castps128_ps512(d_dmin));
  const auto sc_m = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DU8(), reinterpret_cast<uint8_t*>(u))));
  return _mm512_mul_ps(dd, sc_m.raw);
}
#endif

// K types: sum over sub-blocks of (d*sc) * sum(q x) - (dmin*m) * sum(x); the sums of
// x per 32 values (xsum) are computed once per instruction. The values are decoded
// in 32-bit lanes straight from the packed bytes (each lane holds one qs byte, whose
// low and high nibbles belong to sub-blocks 2c and 2c+1), so nothing goes through
// memory between unpacking and the multiply.
template <bool kFifthBit, typename Block>
struct QuantBlockK {
  static constexpr size_t kBytes = sizeof(Block), kElems = 256, kXsumPerBlock = 8;
  static HWY_INLINE void Dot(const uint8_t* src, const float* x, const float* xsum, RowAcc& a) {
    const DF df;
    const DI32 di;
    const hn::Rebind<uint32_t, DF> du;
    const auto low = hn::Set(du, 15), one = hn::Set(du, 1);
    const KScales k = DecodeKScales<Block>(src);
    [[maybe_unused]] const uint8_t* qh = src + (kFifthBit ? offsetof(isa::BlockQ5_K, qh) : 0);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* qs = src + offsetof(Block, qs) + 32 * c;
      const float* xl = x + 64 * c;
      auto s_lo = hn::Zero(df), s_hi = hn::Zero(df);
      for (size_t l = 0; l < 32; l += hn::Lanes(df)) {
        const auto v = hn::PromoteTo(du, hn::LoadU(DU8(), qs + l));
        auto lo = hn::And(v, low), hi = hn::ShiftRight<4>(v);
        if constexpr (kFifthBit) {
          const auto h = hn::PromoteTo(du, hn::LoadU(DU8(), qh + l));
          lo = hn::Or(lo, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c), one)));
          hi = hn::Or(hi, hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, 2 * c + 1), one)));
        }
        s_lo = hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, lo)), hn::LoadU(df, xl + l), s_lo);
        s_hi = hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, hi)), hn::LoadU(df, xl + 32 + l), s_hi);
      }
      a.acc = hn::MulAdd(s_lo, hn::Set(df, k.scale[2 * c]), a.acc);
      a.acc = hn::MulAdd(s_hi, hn::Set(df, k.scale[2 * c + 1]), a.acc);
      a.mins += k.min[2 * c] * xsum[2 * c] + k.min[2 * c + 1] * xsum[2 * c + 1];
    }
  }
};
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Q4_K with 16 f32 lanes: a nibble becomes its f32 value by one table permute (vpermps
// reads only an index's low 4 bits, so the low nibble needs no mask), which replaces
// mask + convert; the sub-block scales and mins are decoded with 32-bit word operations
// (as ggml does) and converted in one vector, and the minimum terms accumulate as one
// FMA per block against xsum laid out [0 x 8, xsum of the block's 8 sub-blocks].
template <>
struct QuantBlock<isa::DType::kQ4_K> {
  static constexpr size_t kBytes = sizeof(isa::BlockQ4_K), kElems = 256, kXsumPerBlock = 16;
  static HWY_INLINE void Dot(const uint8_t* src, const float* x, const float* xsum, RowAcc& a) {
    const DF df;
    const auto sm = hn::Vec<DF>{Q4KScalesMins(src)};
    HWY_ALIGN float scale[16];
    hn::Store(sm, df, scale);
    // Opaque to the compiler, so each scale is broadcast from memory (a load-port
    // operation) rather than permuted out of the register (two shuffle-port ones).
    asm("" : "+m"(scale));
    a.min_acc = hn::MulAdd(sm, hn::LoadU(df, xsum), a.min_acc);
    const auto table = hn::Iota(df, 0.0f);
    const uint8_t* qs = src + offsetof(isa::BlockQ4_K, qs);
    for (int c = 0; c < 4; ++c, qs += 32, x += 64) {
      hn::Vec<DF> s_lo, s_hi;
      for (int l = 0; l < 32; l += 16) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + l)));
        const hn::Vec<DF> lo{_mm512_permutexvar_ps(v, table.raw)};
        const hn::Vec<DF> hi{_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table.raw)};
        s_lo = l == 0 ? hn::Mul(lo, hn::LoadU(df, x)) : hn::MulAdd(lo, hn::LoadU(df, x + l), s_lo);
        s_hi = l == 0 ? hn::Mul(hi, hn::LoadU(df, x + 32)) : hn::MulAdd(hi, hn::LoadU(df, x + 32 + l), s_hi);
      }
      a.acc = hn::MulAdd(s_lo, hn::Set(df, scale[2 * c]), a.acc);
      a.acc = hn::MulAdd(s_hi, hn::Set(df, scale[2 * c + 1]), a.acc);
    }
  }
};
#else
template <>
struct QuantBlock<isa::DType::kQ4_K> : QuantBlockK<false, isa::BlockQ4_K> {};
#endif
template <>
struct QuantBlock<isa::DType::kQ5_K> : QuantBlockK<true, isa::BlockQ5_K> {};

// Q6_K: per half block the 128 values are assembled as signed bytes 32 at a time
// (values l, l + 32, l + 64, l + 96 take the low / high nibbles of ql[l] / ql[l + 32]
// and the 2-bit pairs of qh[l]), then each 16-value group is converted, multiplied
// with x and scaled by its d * sc. Byte lanes do the bit work for 4x the values per
// operation of 32-bit lanes.
template <>
struct QuantBlock<isa::DType::kQ6_K> {
  static constexpr size_t kBytes = sizeof(isa::BlockQ6_K), kElems = 256, kXsumPerBlock = 0;
  static HWY_INLINE void Dot(const uint8_t* src, const float* x, const float*, RowAcc& a) {
    const DF df;
    const hn::CappedTag<uint8_t, 32> d8;
    const auto low4 = hn::Set(d8, 15), pair = hn::Set(d8, 0x30), bias = hn::Set(d8, 32);
    // d * sc for the 16 groups, broadcast from memory below.
    HWY_ALIGN float scale[16];
    const auto d = hn::Set(df, HalfAt(src + offsetof(isa::BlockQ6_K, d)));
    const auto* sc = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ6_K, scales));
    for (size_t g = 0; g < 16; g += hn::Lanes(df)) {
      hn::Store(hn::Mul(d, hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DI8(), sc + g)))), df, scale + g);
    }
#if HWY_ARCH_X86
    asm("" : "+m"(scale));  // as for Q4_K: broadcasts from memory, not register shuffles
#endif
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + offsetof(isa::BlockQ6_K, ql) + 64 * half;
      const uint8_t* qh = src + offsetof(isa::BlockQ6_K, qh) + 32 * half;
      HWY_ALIGN uint8_t q[128];  // two's complement: u8 wrap == the i8 value
      for (size_t l = 0; l < 32; l += hn::Lanes(d8)) {
        const auto v0 = hn::LoadU(d8, ql + l), v1 = hn::LoadU(d8, ql + 32 + l), h = hn::LoadU(d8, qh + l);
        hn::Store(hn::Sub(hn::Or(hn::And(v0, low4), hn::And(hn::ShiftLeft<4>(h), pair)), bias), d8, q + l);
        hn::Store(hn::Sub(hn::Or(hn::And(v1, low4), hn::And(hn::ShiftLeft<2>(h), pair)), bias), d8, q + 32 + l);
        hn::Store(hn::Sub(hn::Or(hn::ShiftRight<4>(v0), hn::And(h, pair)), bias), d8, q + 64 + l);
        hn::Store(hn::Sub(hn::Or(hn::ShiftRight<4>(v1), hn::And(hn::ShiftRight<2>(h), pair)), bias), d8, q + 96 + l);
      }
      for (int g = 0; g < 8; ++g) {
        const auto s = DotQ<DI8>(reinterpret_cast<const int8_t*>(q) + 16 * g, x + 128 * half + 16 * g, 16);
        a.acc = hn::MulAdd(s, hn::Set(df, scale[8 * half + g]), a.acc);
      }
    }
  }
};

// Software prefetch distance for streamed weight rows: the hardware prefetchers alone
// leave one core's stream latency-bound well below DRAM bandwidth.
constexpr size_t kPrefetchBytes = 1024;

// Quantized rows at row[0..R), block by block across the rows, so R weight streams
// are in flight; each cache line is prefetched once per row, kPrefetchBytes ahead.
template <isa::DType T, size_t R>
HWY_INLINE void DotRowsQuant(const uint8_t* const* row, const float* x, const float* xsum, size_t nb, float* out) {
  using Q = QuantBlock<T>;
  RowAcc a[R];
  for (size_t r = 0; r < R; ++r) a[r] = {hn::Zero(DF()), hn::Zero(DF()), 0.0f};
  size_t pf = 0;  // next byte offset (within each row) to prefetch
  for (size_t b = 0; b < nb; ++b) {
    for (; pf < (b + 1) * Q::kBytes; pf += 64) {
      for (size_t r = 0; r < R; ++r) hwy::Prefetch(row[r] + pf + kPrefetchBytes);
    }
#pragma GCC unroll 16  // keeps the row states in registers
    for (size_t r = 0; r < R; ++r) Q::Dot(row[r] + b * Q::kBytes, x + b * Q::kElems, xsum + b * Q::kXsumPerBlock, a[r]);
  }
  for (size_t r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(DF(), hn::Sub(a[r].acc, a[r].min_acc))) - a[r].mins;
}

// Rows of a TMV are mostly contiguous: kStreams rows far apart (one from each of
// kStreams equal sub-ranges of the rows) are computed together. One core then reads
// kStreams independent sequential streams, as the STREAM-style read does, where
// adjacent rows would be a single stream; that took the Q8_0 LM head from ~0.6 to
// ~0.95 of the read's bandwidth.
constexpr size_t kStreams = 4;
template <size_t N>
using RowCount = std::integral_constant<size_t, N>;

// Every row's dot product into y (stored, or added with `accumulate`): kStreams rows
// far apart per pass, then the rows left over one by one. dot(rp, out, RowCount<n>)
// computes the n rows starting at rp[0..n) into out[0..n).
template <typename Dot>
void StreamRows(const uint8_t* base, size_t stride, size_t rows, float* y, bool accumulate, const Dot& dot) {
  const auto put = [&](size_t i, float v) { y[i] = accumulate ? y[i] + v : v; };
  const size_t seg = rows / kStreams;
  for (size_t j = 0; j < seg; ++j) {
    const uint8_t* rp[kStreams];
    float v[kStreams];
    for (size_t s = 0; s < kStreams; ++s) rp[s] = base + (s * seg + j) * stride;
    dot(rp, v, RowCount<kStreams>{});
    for (size_t s = 0; s < kStreams; ++s) put(s * seg + j, v[s]);
  }
  for (size_t i = kStreams * seg; i < rows; ++i) {
    const uint8_t* rp = base + i * stride;
    float v;
    dot(&rp, &v, RowCount<1>{});
    put(i, v);
  }
}

// Weight rows a group of a batched TMV holds: small enough to stay in L2 while every
// vector of the batch reads them, so each weight byte crosses DRAM once.
constexpr size_t kBatchGroupBytes = 192 << 10;

// Calls f(t, r0, n) for every vector t of the batch and every group [r0, r0 + n) of
// rows: one vector takes all rows at once (the plain GEMV), several take the rows in
// groups, every vector in turn. A row's result never depends on its group (every row
// kernel below keeps its own accumulators), which is what makes a batched TMV give
// each vector the bits a TMV of that vector alone gives.
template <typename F>
HWY_INLINE void ForEachRowGroup(size_t stride, size_t rows, size_t batch, const F& f) {
  const size_t group = batch == 1 ? rows : std::max<size_t>(kStreams, kBatchGroupBytes / std::max<size_t>(stride, 1));
  for (size_t r0 = 0; r0 < rows; r0 += group) {
    for (size_t t = 0; t < batch; ++t) f(t, r0, std::min(group, rows - r0));
  }
}

// Vectors one pass over a row takes at once in a batched TMV: they share each block's
// decoding, and the accumulators of all of them stay in registers. The f32 kernels
// keep one vector of state per vector (8 fit); the integer kernels keep scales too,
// and measured faster with 4.
constexpr size_t kBatchChunk = 8, kIntegerBatchChunk = 4;
// One flag per vector of a batch (at most a TMV's), kept off the heap: a TMV runs
// per row tile, hundreds of times per decode step.
using VectorFlags = std::array<uint8_t, isa::kMaxTmvBatch>;
template <size_t N>
using VecCount = std::integral_constant<size_t, N>;

// The batched form of StreamRows: rows one at a time, each against the batch's vectors
// kChunk at a time; dot(row, t0, out, VecCount<n>) computes the row against vectors
// t0 .. t0 + n into out[0..n). A row is read from memory by its first chunk and from
// cache by the others.
template <size_t kChunk = kBatchChunk, typename Dot>
void BatchRows(const uint8_t* base, size_t stride, size_t rows, size_t batch, float* y, size_t y_pitch,
               bool accumulate, const Dot& dot) {
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* row = base + i * stride;
    for (size_t t0 = 0; t0 < batch; t0 += kChunk) {
      float v[kBatchChunk];
      const size_t n = std::min(kChunk, batch - t0);
      switch (n) {
        case 1: dot(row, t0, v, VecCount<1>{}); break;
        case 2: dot(row, t0, v, VecCount<2>{}); break;
        case 3: dot(row, t0, v, VecCount<3>{}); break;
        case 4: dot(row, t0, v, VecCount<4>{}); break;
        case 5: dot(row, t0, v, VecCount<5>{}); break;
        case 6: dot(row, t0, v, VecCount<6>{}); break;
        case 7: dot(row, t0, v, VecCount<7>{}); break;
        default: dot(row, t0, v, VecCount<8>{}); break;
      }
      for (size_t j = 0; j < n; ++j) {
        float& out = y[(t0 + j) * y_pitch + i];
        out = accumulate ? out + v[j] : v[j];
      }
    }
  }
}

// Whether block type Q computes several vectors at once (DotN); if not, each vector
// takes Dot in turn (the block then comes from cache).
template <typename Q>
concept HasDotN = requires(const uint8_t* s, const float* const* x, RowAcc* a) { Q::template DotN<1>(s, x, x, a); };

// DotRowsQuant for one row against N vectors (x[t], xsum[t]): each vector's state
// takes the same steps as in DotRowsQuant, so it ends with the same bits.
template <isa::DType T, size_t N>
HWY_INLINE void DotRowQuantN(const uint8_t* row, const float* const* x, const float* const* xsum, size_t nb,
                             float* out) {
  using Q = QuantBlock<T>;
  // Every loop over the vectors unrolled, so their states stay in registers.
  RowAcc a[N];
#pragma GCC unroll 8
  for (size_t t = 0; t < N; ++t) a[t] = {hn::Zero(DF()), hn::Zero(DF()), 0.0f};
  size_t pf = 0;
  const float* xb[N];
  const float* sb[N];
  for (size_t b = 0; b < nb; ++b) {
    for (; pf < (b + 1) * Q::kBytes; pf += 64) hwy::Prefetch(row + pf + kPrefetchBytes);
#pragma GCC unroll 8
    for (size_t t = 0; t < N; ++t) {
      xb[t] = x[t] + b * Q::kElems;
      sb[t] = xsum[t] + b * Q::kXsumPerBlock;
    }
    if constexpr (HasDotN<Q>) {
      Q::template DotN<N>(row + b * Q::kBytes, xb, sb, a);
    } else {
#pragma GCC unroll 8
      for (size_t t = 0; t < N; ++t) Q::Dot(row + b * Q::kBytes, xb[t], sb[t], a[t]);
    }
  }
#pragma GCC unroll 8
  for (size_t t = 0; t < N; ++t) out[t] = hn::GetLane(hn::SumOfLanes(DF(), hn::Sub(a[t].acc, a[t].min_acc))) - a[t].mins;
}

template <isa::DType T>
void MatVecQuant(const uint8_t* base, size_t stride, size_t rows, const float* x, size_t k, size_t batch,
                 size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  const size_t nb = k / QuantBlock<T>::kElems;
  // Sums of x per 32 values for the K types' minimum terms, the last 8 of each
  // block's kXsumPerBlock entries (any before them stay 0), per vector.
  constexpr size_t kPer = QuantBlock<T>::kXsumPerBlock;
  std::vector<float> xsum(batch * nb * kPer, 0.0f);
  for (size_t t = 0; kPer > 0 && t < batch; ++t) {
    const float* xt = x + t * x_pitch;
    float* st = xsum.data() + t * nb * kPer;
    for (size_t i = 0; i < nb; ++i) {
      for (size_t j = 0; j < 8; ++j) {
        float s = 0.0f;
        for (size_t l = 0; l < 32; ++l) s += xt[256 * i + 32 * j + l];
        st[kPer * (i + 1) - 8 + j] = s;
      }
    }
  }
  if (batch == 1) {
    StreamRows(base, stride, rows, y, accumulate, [&](const uint8_t* const* rp, float* out, auto count) {
      DotRowsQuant<T, decltype(count)::value>(rp, x, xsum.data(), nb, out);
    });
    return;
  }
  BatchRows(base, stride, rows, batch, y, y_pitch, accumulate, [&](const uint8_t* row, size_t t0, float* out, auto n) {
    constexpr size_t N = decltype(n)::value;
    const float* xs[N];
    const float* ss[N];
    for (size_t j = 0; j < N; ++j) {
      xs[j] = x + (t0 + j) * x_pitch;
      ss[j] = xsum.data() + (t0 + j) * nb * kPer;
    }
    DotRowQuantN<T, N>(row, xs, ss, nb, out);
  });
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC_ACTUAL || HWY_COMPILER_CLANG)  // also at MatVec
// ---- TMV for Q4_0, Q5_0, Q4_K and Q6_K with AVX512_VNNI (Cascade Lake and later, Zen 4)
// In f32 lanes these types are compute-bound (each value needs a widening shuffle or
// table permute, a convert and an FMA). Here x is converted once per instruction to
// fixed point per group of 16 or 32 values: x = s * X with s a power of two, |X| <=
// 2^20, stored as three signed digits X = x2 * 2^14 + x1 * 2^7 + x0 (|digit| <= 64).
// The weights stay unsigned bytes (nibbles by one AND, or a shift and an AND, per 64
// values), VPDPBUSD sums q * digit over 4 bytes into i32 lanes, and the digits are
// combined in i32 (shift by 7 between them), so each lane holds the exact sum of
// q * X over 4 values of one (sub-)block; the format's bias (q - 8, q - 16, q - 32) is
// subtracted as bias * sum X. That is converted to f32 and scaled by d (* sc) * s, so
// blocks and sub-blocks are still summed before their scale. The one error beyond f32
// rounding is rounding x to s * X: at most 2^-20 max|x| over its group (measured: 5e-7
// rel-L2 against a double reference, 1.3e-7 of the row's sum |w x|, vs 1-2e-7 for the
// f32 kernels). Rows of Q4_K 262144x768 went from 0.71 to ~0.96 of the DRAM read.
// Tried first: x = x_hi + x_lo in bf16 with VDPBF16PS (exact products), but on the
// development machine (Sapphire Rapids class) VDPBF16PS has a quarter of the FMA
// throughput and Q4_K became 1.5x slower.
// Every function carries the attribute itself: clang does not extend the target of
// functions inside Highway's per-target region with a nested pragma.
#define NPURT_VNNI __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
namespace tmv_vnni {

// x = s * X per group of values: s = 2^e, a power of two with |x / s| <= 2^20 (so the
// i32 lane sums stay below 2^31), and X = round(x / s) as three digits X = x2 * 2^14 +
// x1 * 2^7 + x0, each in [-64, 64].

// e for the n values at x (n = 16 or 32), or kNotFinite.
constexpr int kNotFinite = -1000;
HWY_INLINE NPURT_VNNI int ScaleExp(const float* x, size_t n) {
  constexpr int kInfNaN = 0x01 | 0x08 | 0x10 | 0x80;  // VFPCLASSPS: QNaN, +inf, -inf, SNaN
  const __m512 v0 = _mm512_loadu_ps(x), v1 = n == 32 ? _mm512_loadu_ps(x + 16) : v0;
  if ((_mm512_fpclass_ps_mask(v0, kInfNaN) | _mm512_fpclass_ps_mask(v1, kInfNaN)) != 0) return kNotFinite;
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  int e = 0;
  std::frexp(m, &e);  // m < 2^e
  return std::max(e - 20, -149);
}

// The digits of 16 values at d, d + stride and d + 2 * stride; X to big.
HWY_INLINE NPURT_VNNI void PutDigits16(const float* x, int e, int8_t* d, size_t stride, int32_t* big) {
  // VSCALEFPS: x * 2^-e, exact, where 2^-e itself may not be a finite f32.
  const __m512i X = _mm512_cvtps_epi32(_mm512_scalef_ps(_mm512_loadu_ps(x), _mm512_set1_ps(static_cast<float>(-e))));
  const __m512i x2 = _mm512_srai_epi32(_mm512_add_epi32(X, _mm512_set1_epi32(1 << 13)), 14);
  const __m512i r = _mm512_sub_epi32(X, _mm512_slli_epi32(x2, 14));
  const __m512i x1 = _mm512_srai_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(64)), 7);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm512_cvtepi32_epi8(x2));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + stride), _mm512_cvtepi32_epi8(x1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * stride),
                   _mm512_cvtepi32_epi8(_mm512_sub_epi32(r, _mm512_slli_epi32(x1, 7))));
  _mm512_storeu_si512(big, X);
}

// bias[i] = kBias * (big[4i] + ... + big[4i + 3]) for i < n / 4.
template <int kBias>
HWY_INLINE NPURT_VNNI void BiasTerms(const int32_t* big, size_t n, int8_t* out) {
  int32_t bias[16];
  for (size_t i = 0; i < n / 4; ++i) bias[i] = kBias * (big[4 * i] + big[4 * i + 1] + big[4 * i + 2] + big[4 * i + 3]);
  std::memcpy(out, bias, sizeof(int32_t) * (n / 4));
}

// Per i32 lane, sum over its 4 bytes of q (u8) * X, X given by the digits at xd,
// xd + 64 and xd + 128; exact.
HWY_INLINE NPURT_VNNI __m512i DotDigits(__m512i q, const int8_t* xd) {
  const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(xd));
  const __m512i t2 = _mm512_dpbusd_epi32(_mm512_slli_epi32(t, 7), q, _mm512_loadu_si512(xd + 64));
  return _mm512_dpbusd_epi32(_mm512_slli_epi32(t2, 7), q, _mm512_loadu_si512(xd + 128));
}

// Q4_K. Per block: the digits of x in the order the kernel reads it (per 64-byte
// vector: 64 x2, 64 x1, 64 x0) and 32 floats [s of sub-blocks 0..7, 1 x 8, 0 x 8, sums
// of x of sub-blocks 0..7].
struct Q4K {
  static constexpr size_t kBytes = sizeof(isa::BlockQ4_K), kElems = 256, kDigitBytes = 3 * 256, kFloats = 32;
  using Acc = RowAcc;
  static NPURT_VNNI Acc Zero() { return {hn::Zero(DF()), hn::Zero(DF()), 0.0f}; }
  static HWY_INLINE NPURT_VNNI float Sum(const Acc& a) { return hn::GetLane(hn::SumOfLanes(DF(), hn::Sub(a.acc, a.min_acc))); }

  // A 64-byte vector v (0..3) of a block holds the low (v even) or high nibbles of
  // qs bytes 64 (v / 2) .. + 63: sub-block 4 (v / 2) + v % 2 in bytes 0..31 and the
  // one two further on in bytes 32..63. Returns the sub-block of byte half h of v.
  static constexpr size_t SubBlock(size_t v, size_t h) { return 4 * (v / 2) + v % 2 + 2 * h; }

  static HWY_INLINE NPURT_VNNI void Dot(const uint8_t* src, const int8_t* xd, const float* xf, Acc& a) {
    DotN<1>(src, &xd, &xf, &a);
  }


  // N vectors at once: the nibbles are unpacked once, and each vector's state takes
  // the steps of N = 1 (Dot) in their order, so it ends with the same bits.
  template <size_t N>
  static HWY_INLINE NPURT_VNNI void DotN(const uint8_t* src, const int8_t* const* xd, const float* const* xf, Acc* a) {
    const DF df;
    const __m512 scales_mins = Q4KScalesMins(src);
    __m512 sm[N];
    for (size_t t = 0; t < N; ++t) {
      sm[t] = _mm512_mul_ps(scales_mins, _mm512_loadu_ps(xf[t]));
      a[t].min_acc = hn::MulAdd(hn::Vec<DF>{sm[t]}, hn::LoadU(df, xf[t] + 16), a[t].min_acc);
    }
    const __m512i low4 = _mm512_set1_epi8(15);
    const uint8_t* qs = src + offsetof(isa::BlockQ4_K, qs);
    for (int half = 0; half < 2; ++half, qs += 64) {
      const __m512i w = _mm512_loadu_si512(qs);
      const __m512i q[2] = {_mm512_and_si512(w, low4), _mm512_and_si512(_mm512_srli_epi16(w, 4), low4)};
      for (int n = 0; n < 2; ++n) {
        const int j = static_cast<int>(SubBlock(2 * half + n, 0)), j2 = j + 2;
        const __m512i idx = _mm512_set_epi32(j2, j2, j2, j2, j2, j2, j2, j2, j, j, j, j, j, j, j, j);
        for (size_t t = 0; t < N; ++t) {
          const __m512i d = DotDigits(q[n], xd[t] + 192 * (2 * half + n));
          a[t].acc = hn::MulAdd(hn::Vec<DF>{_mm512_cvtepi32_ps(d)}, hn::Vec<DF>{_mm512_permutexvar_ps(idx, sm[t])}, a[t].acc);
        }
      }
    }
  }

  static NPURT_VNNI bool Prepare(const float* x, int8_t* xd, float* xf) {
    int32_t big[16];
    for (size_t j = 0; j < 8; ++j) {
      const int e = ScaleExp(x + 32 * j, 32);
      if (e == kNotFinite) return false;
      xf[j] = std::ldexp(1.0f, e);
      xf[8 + j] = 1.0f;
      xf[16 + j] = 0.0f;
      xf[24 + j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x + 32 * j), _mm512_loadu_ps(x + 32 * j + 16)));
      // Sub-block j is bytes 32 * (j / 2 % 2) .. + 31 of vector 2 (j / 4) + j % 2.
      int8_t* d = xd + 192 * (2 * (j / 4) + j % 2) + 32 * (j / 2 % 2);
      PutDigits16(x + 32 * j, e, d, 64, big);
      PutDigits16(x + 32 * j + 16, e, d + 16, 64, big);
    }
    return true;
  }
};

// Q4_0 / Q5_0, two consecutive blocks (64 values) in the byte lanes of one vector:
// each block's 16 qs bytes broadcast to a 256-bit half, whose upper 128 bits are
// shifted for the high nibbles, and Q5_0's fifth bits added under the qh masks. The
// values are unbiased (0..31); the bias times the sum of X over each lane's 4 values
// is subtracted in i32. Lanes 0..7 then hold sums of the first block, 8..15 of the
// second. Per pair: digits (64 x2, 64 x1, 64 x0), the i32 bias terms, and 16 floats
// [s of the first block x 8, of the second x 8]. Rows with an odd number of blocks
// take the f32 kernel.
template <bool kFifthBit>
struct Q4_0Q5_0 {
  static constexpr size_t kBlock = kQ4_0Q5_0Bytes<kFifthBit>;
  static constexpr size_t kBytes = 2 * kBlock, kElems = 64, kDigitBytes = 256, kFloats = 16;
  static constexpr int kBias = kFifthBit ? 16 : 8;
  using Acc = __m512;
  static NPURT_VNNI Acc Zero() { return _mm512_setzero_ps(); }
  static HWY_INLINE NPURT_VNNI float Sum(Acc a) { return hn::GetLane(hn::SumOfLanes(DF(), hn::Vec<DF>{a})); }

  static HWY_INLINE NPURT_VNNI void Dot(const uint8_t* src, const int8_t* xd, const float* xf, Acc& a) {
    DotN<1>(src, &xd, &xf, &a);
  }


  // N vectors at once, the values and scales decoded once (as Q4K::DotN).
  template <size_t N>
  static HWY_INLINE NPURT_VNNI void DotN(const uint8_t* src, const int8_t* const* xd, const float* const* xf, Acc* a) {
    const uint8_t* qs = src + (kFifthBit ? offsetof(isa::BlockQ5_0, qs) : offsetof(isa::BlockQ4_0, qs));
    const auto load128 = [](const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); };
    __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(load128(qs)), 0xff00, load128(qs + kBlock));
    v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00, v, 4), _mm512_set1_epi8(15));
    if constexpr (kFifthBit) {
      const uint8_t* qh = src + offsetof(isa::BlockQ5_0, qh);
      const uint64_t h = LoadAt(reinterpret_cast<const uint32_t*>(qh)) |
                         uint64_t{LoadAt(reinterpret_cast<const uint32_t*>(qh + kBlock))} << 32;
      v = _mm512_mask_add_epi8(v, h, v, _mm512_set1_epi8(16));
    }
    const __m128i dh = _mm_insert_epi16(_mm_cvtsi32_si128(LoadAt(reinterpret_cast<const uint16_t*>(src))),
                                        LoadAt(reinterpret_cast<const uint16_t*>(src + kBlock)), 1);
    const __m512 d = _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                           _mm512_castps128_ps512(_mm_cvtph_ps(dh)));
    for (size_t i = 0; i < N; ++i) {
      const __m512i t = _mm512_sub_epi32(DotDigits(v, xd[i]), _mm512_loadu_si512(xd[i] + 192));
      a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, _mm512_loadu_ps(xf[i])), a[i]);
    }
  }

  static NPURT_VNNI bool Prepare(const float* x, int8_t* xd, float* xf) {
    int32_t big[64];
    for (size_t h = 0; h < 2; ++h) {
      const int e = ScaleExp(x + 32 * h, 32);
      if (e == kNotFinite) return false;
      for (size_t j = 0; j < 8; ++j) xf[8 * h + j] = std::ldexp(1.0f, e);
      PutDigits16(x + 32 * h, e, xd + 32 * h, 64, big + 32 * h);
      PutDigits16(x + 32 * h + 16, e, xd + 32 * h + 16, 64, big + 32 * h + 16);
    }
    BiasTerms<kBias>(big, 64, xd + 192);
    return true;
  }
};

// Q6_K: per half block, the 64 ql bytes are one vector and the 32 qh bytes are
// broadcast to both 256-bit halves; the low nibbles with their 2-bit pairs (shifted
// into bits 4..5 by a per-half word shift: bits leaking across bytes are masked off)
// are values 0..63 of the half, the high nibbles with theirs values 64..127, so x is in
// natural order. Values are unbiased (0..63), the bias 32 times the sum of X over each
// lane's 4 values subtracted in i32; i32 lane i of a vector holds 4 values of 16-value
// group i / 4 (+ 4 for the high nibbles, + 8 in the second half). Per block, for each
// 64 values: digits (64 x2, 64 x1, 64 x0), the i32 bias terms; 16 floats, s per group.
struct Q6K {
  static constexpr size_t kBytes = sizeof(isa::BlockQ6_K), kElems = 256, kDigitBytes = 4 * 256, kFloats = 16;
  using Acc = __m512;
  static NPURT_VNNI Acc Zero() { return _mm512_setzero_ps(); }
  static HWY_INLINE NPURT_VNNI float Sum(Acc a) { return hn::GetLane(hn::SumOfLanes(DF(), hn::Vec<DF>{a})); }

  static HWY_INLINE NPURT_VNNI void Dot(const uint8_t* src, const int8_t* xd, const float* xf, Acc& a) {
    DotN<1>(src, &xd, &xf, &a);
  }


  // N vectors at once, the values decoded once (as Q4K::DotN).
  template <size_t N>
  static HWY_INLINE NPURT_VNNI void DotN(const uint8_t* src, const int8_t* const* xd, const float* const* xf, Acc* a) {
    const __m512 d = _mm512_set1_ps(HalfAt(src + offsetof(isa::BlockQ6_K, d)));
    const __m512i sc = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + offsetof(isa::BlockQ6_K, scales))));
    const __m512 dsc = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    __m512 scale[N];
    for (size_t t = 0; t < N; ++t) scale[t] = _mm512_mul_ps(dsc, _mm512_loadu_ps(xf[t]));
    const __m512i low4 = _mm512_set1_epi8(15), pair = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + offsetof(isa::BlockQ6_K, ql) + 64 * half;
      const uint8_t* qh = src + offsetof(isa::BlockQ6_K, qh) + 32 * half;
      const __m512i l = _mm512_loadu_si512(ql);
      const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)));
      const __m512i q_lo = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_sllv_epi16(h, shl), pair), l, low4, 0xD8);
      const __m512i q_hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srlv_epi16(h, shr), pair),
                                                     _mm512_srli_epi16(l, 4), low4, 0xD8);
      for (int n = 0; n < 2; ++n) {
        const int g = 8 * half + 4 * n;
        const __m512i idx = _mm512_set_epi32(g + 3, g + 3, g + 3, g + 3, g + 2, g + 2, g + 2, g + 2, g + 1, g + 1, g + 1,
                                             g + 1, g, g, g, g);
        for (size_t i = 0; i < N; ++i) {
          const int8_t* x = xd[i] + 256 * (2 * half + n);
          const __m512i t = _mm512_sub_epi32(DotDigits(n == 0 ? q_lo : q_hi, x), _mm512_loadu_si512(x + 192));
          a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_permutexvar_ps(idx, scale[i]), a[i]);
        }
      }
    }
  }

  static NPURT_VNNI bool Prepare(const float* x, int8_t* xd, float* xf) {
    int32_t big[64];
    for (size_t v = 0; v < 4; ++v, xd += 256) {
      for (size_t c = 0; c < 4; ++c) {
        const size_t g = 4 * v + c;
        const int e = ScaleExp(x + 16 * g, 16);
        if (e == kNotFinite) return false;
        xf[g] = std::ldexp(1.0f, e);
        PutDigits16(x + 16 * g, e, xd + 16 * c, 64, big + 16 * c);
      }
      BiasTerms<32>(big, 64, xd + 192);
    }
    return true;
  }
};

template <typename Q, size_t R>
HWY_INLINE NPURT_VNNI void DotRows(const uint8_t* const* row, const int8_t* xd, const float* xf, size_t nb, float* out) {
  typename Q::Acc a[R];
  for (size_t r = 0; r < R; ++r) a[r] = Q::Zero();
  size_t pf = 0;  // as DotRowsQuant
  for (size_t b = 0; b < nb; ++b) {
    for (; pf < (b + 1) * Q::kBytes; pf += 64) {
      for (size_t r = 0; r < R; ++r) hwy::Prefetch(row[r] + pf + kPrefetchBytes);
    }
#pragma GCC unroll 16
    for (size_t r = 0; r < R; ++r) Q::Dot(row[r] + b * Q::kBytes, xd + b * Q::kDigitBytes, xf + b * Q::kFloats, a[r]);
  }
  for (size_t r = 0; r < R; ++r) out[r] = Q::Sum(a[r]);
}

// StreamRows' dot for Q over prepared x. A functor, not a lambda, so that its call
// operator carries the VNNI target too.
template <typename Q>
struct Rows {
  const int8_t* xd;
  const float* xf;
  size_t nb;
  template <size_t N>
  NPURT_VNNI void operator()(const uint8_t* const* rp, float* out, RowCount<N>) const {
    DotRows<Q, N>(rp, xd, xf, nb, out);
  }
};

// DotRows for one row against N prepared vectors (Q::DotN).
template <typename Q, size_t N>
HWY_INLINE NPURT_VNNI void DotRowN(const uint8_t* row, const int8_t* const* xd, const float* const* xf, size_t nb,
                                   float* out) {
  typename Q::Acc a[N];
#pragma GCC unroll 8
  for (size_t t = 0; t < N; ++t) a[t] = Q::Zero();
  size_t pf = 0;
  const int8_t* db[N];
  const float* fb[N];
  for (size_t b = 0; b < nb; ++b) {
    for (; pf < (b + 1) * Q::kBytes; pf += 64) hwy::Prefetch(row + pf + kPrefetchBytes);
#pragma GCC unroll 8
    for (size_t t = 0; t < N; ++t) {
      db[t] = xd[t] + b * Q::kDigitBytes;
      fb[t] = xf[t] + b * Q::kFloats;
    }
    Q::template DotN<N>(row + b * Q::kBytes, db, fb, a);
  }
#pragma GCC unroll 8
  for (size_t t = 0; t < N; ++t) out[t] = Q::Sum(a[t]);
}

// BatchRows' dot for Q: the vectors of a chunk that the integer path kept, prepared.
template <typename Q>
struct RowsN {
  const int8_t* const* xd;  // per vector of the batch
  const float* const* xf;
  size_t nb;
  template <size_t N>
  NPURT_VNNI void operator()(const uint8_t* row, size_t t0, float* out, VecCount<N>) const {
    DotRowN<Q, N>(row, xd + t0, xf + t0, nb, out);
  }
};

// As MatVecQuant, each vector prepared for Q. Returns false (nothing written) if k
// does not suit Q; a vector that is not finite is left out and flagged in `declined`
// (its column is then the f32 kernel's, as a TMV of that vector alone would give).
template <typename Q>
NPURT_VNNI bool MatVec(const uint8_t* base, size_t stride, size_t rows, const float* x, size_t k, size_t batch,
                       size_t x_pitch, float* y, size_t y_pitch, bool accumulate, VectorFlags& declined) {
  if (k % Q::kElems != 0) return false;
  const size_t nb = k / Q::kElems;
  std::vector<int8_t> xd(batch * nb * Q::kDigitBytes);
  std::vector<float> xf(batch * nb * Q::kFloats);
  declined.fill(0);
  bool any = false;
  for (size_t t = 0; t < batch; ++t) {
    int8_t* dt = xd.data() + t * nb * Q::kDigitBytes;
    float* ft = xf.data() + t * nb * Q::kFloats;
    for (size_t b = 0; b < nb && !declined[t]; ++b) {
      declined[t] = !Q::Prepare(x + t * x_pitch + b * Q::kElems, dt + b * Q::kDigitBytes, ft + b * Q::kFloats);
    }
    any = any || !declined[t];
  }
  if (!any) return false;
  if (batch == 1) {
    StreamRows(base, stride, rows, y, accumulate, Rows<Q>{xd.data(), xf.data(), nb});
    return true;
  }
  // The kept vectors, packed, and where their results go.
  std::vector<const int8_t*> kd;
  std::vector<const float*> kf;
  std::vector<size_t> kept;
  for (size_t t = 0; t < batch; ++t) {
    if (declined[t]) continue;
    kd.push_back(xd.data() + t * nb * Q::kDigitBytes);
    kf.push_back(xf.data() + t * nb * Q::kFloats);
    kept.push_back(t);
  }
  // Consecutive kept vectors write consecutive rows of y only when none was declined.
  if (kept.size() == batch) {
    BatchRows<kIntegerBatchChunk>(base, stride, rows, batch, y, y_pitch, accumulate, RowsN<Q>{kd.data(), kf.data(), nb});
    return true;
  }
  for (size_t j = 0; j < kept.size(); ++j) {
    BatchRows<kIntegerBatchChunk>(base, stride, rows, 1, y + kept[j] * y_pitch, y_pitch, accumulate,
                                  RowsN<Q>{kd.data() + j, kf.data() + j, nb});
  }
  return true;
}

}  // namespace tmv_vnni
#undef NPURT_VNNI
#endif

// Plain rows (f32, bf16, f16), R at a time: each x vector is loaded once for R rows
// and R weight streams are in flight, which one core needs to get near DRAM bandwidth.
// Every row has one accumulator and the same tail (k not a multiple of the vector
// length: a scalar sum added last), so its result is the same whatever R.
template <size_t R>
HWY_INLINE void DotRowsPlain(const uint8_t* row0, size_t stride, isa::DType type, const float* x, size_t k,
                             float* out) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const size_t body = k / n * n;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<uint32_t, DF> d32;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto load = [&](size_t r, size_t l) {
    const uint8_t* row = row0 + r * stride;
    if (type == isa::DType::kF32) return hn::LoadU(df, reinterpret_cast<const float*>(row) + l);
    const auto h = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(row) + l);
    if (type == isa::DType::kBF16) return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, h)));
    return hn::PromoteTo(df, hn::BitCast(dh, h));
  };
  const auto scalar = [&](size_t r, size_t l) {
    const uint8_t* row = row0 + r * stride;
    if (type == isa::DType::kF32) return LoadAt(reinterpret_cast<const float*>(row) + l);
    const uint16_t h = LoadAt(reinterpret_cast<const uint16_t*>(row) + l);
    return type == isa::DType::kBF16 ? isa::bf16_to_f32(h) : isa::f16_to_f32(h);
  };
  const size_t esize = isa::dtype_size(type);
  hn::Vec<DF> a[R];
  for (size_t r = 0; r < R; ++r) a[r] = hn::Zero(df);
  for (size_t l = 0; l < body; l += n) {
    if ((l * esize) % 64 == 0) {  // one prefetch per cache line of each row
      for (size_t r = 0; r < R; ++r) hwy::Prefetch(row0 + r * stride + l * esize + kPrefetchBytes);
    }
    const auto xv = hn::LoadU(df, x + l);
#pragma GCC unroll 4
    for (size_t r = 0; r < R; ++r) a[r] = hn::MulAdd(load(r, l), xv, a[r]);
  }
  for (size_t r = 0; r < R; ++r) {
    float tail = 0.0f;
    for (size_t l = body; l < k; ++l) tail += scalar(r, l) * x[l];
    out[r] = hn::GetLane(hn::SumOfLanes(df, a[r])) + tail;
  }
}

void MatVecPlain(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                 float* y, bool accumulate) {
  size_t i = 0;
  float v[4];
  const auto put = [&](size_t at, size_t n) {
    for (size_t r = 0; r < n; ++r) y[at + r] = accumulate ? y[at + r] + v[r] : v[r];
  };
  for (; i + 4 <= rows; i += 4) {
    DotRowsPlain<4>(base + i * stride, stride, type, x, k, v);
    put(i, 4);
  }
  for (; i < rows; ++i) {
    DotRowsPlain<1>(base + i * stride, stride, type, x, k, v);
    put(i, 1);
  }
}

// What matvec_set_batch_reorder_for_test turns on: the row dequantized, then its
// products added last to first.
void MatVecReordered(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                     float* y, bool accumulate) {
  std::vector<float> w(k);
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* row = base + i * stride;
    if (isa::dtype_is_quantized(type)) {
      Dequantize(row, type, w.data(), k);
    } else {
      for (size_t l = 0; l < k; ++l) w[l] = type == isa::DType::kF32 ? LoadAt(reinterpret_cast<const float*>(row) + l)
                                          : type == isa::DType::kBF16 ? isa::bf16_to_f32(LoadAt(reinterpret_cast<const uint16_t*>(row) + l))
                                                                      : isa::f16_to_f32(LoadAt(reinterpret_cast<const uint16_t*>(row) + l));
    }
    float s = 0.0f;
    for (size_t l = k; l-- > 0;) s += w[l] * x[l];
    y[i] = accumulate ? y[i] + s : s;
  }
}

// MatVecBatch for at most isa::kMaxTmvBatch vectors.
void MatVecSlice(const uint8_t* base, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                 size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  // Vectors the integer kernels left to the f32 ones (each flag set: that vector).
  VectorFlags rest;
  rest.fill(1);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && (HWY_COMPILER_GCC_ACTUAL || HWY_COMPILER_CLANG)
  // The VNNI kernels where the CPU has AVX512_VNNI; they decline a non-finite vector,
  // and Q4_0 / Q5_0 rows of an odd number of blocks, for the f32 ones.
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  if (vnni && matvec_integer_path()) {
    const auto run = [&](auto q) {
      VectorFlags declined;
      if (tmv_vnni::MatVec<decltype(q)>(base, row_stride_bytes, rows, x, k, batch, x_pitch, y, y_pitch, accumulate,
                                         declined)) {
        rest = declined;
      }
    };
    switch (type) {
      case isa::DType::kQ4_0: run(tmv_vnni::Q4_0Q5_0<false>{}); break;
      case isa::DType::kQ5_0: run(tmv_vnni::Q4_0Q5_0<true>{}); break;
      case isa::DType::kQ4_K: run(tmv_vnni::Q4K{}); break;
      case isa::DType::kQ6_K: run(tmv_vnni::Q6K{}); break;
      default: break;
    }
  }
#endif
  for (size_t t0 = 0; t0 < batch;) {
    // Runs of vectors left to the f32 kernels go together.
    if (!rest[t0]) {
      ++t0;
      continue;
    }
    size_t t1 = t0 + 1;
    while (t1 < batch && rest[t1]) ++t1;
    const float* xs = x + t0 * x_pitch;
    float* ys = y + t0 * y_pitch;
    const size_t n = t1 - t0;
    switch (type) {
#define NPURT_QUANT_CASE(T)                                                                       \
  case isa::DType::T:                                                                             \
    MatVecQuant<isa::DType::T>(base, row_stride_bytes, rows, xs, k, n, x_pitch, ys, y_pitch, accumulate); \
    break;
      NPURT_QUANT_CASE(kQ8_0)
      NPURT_QUANT_CASE(kQ4_0)
      NPURT_QUANT_CASE(kQ5_0)
      NPURT_QUANT_CASE(kQ4_K)
      NPURT_QUANT_CASE(kQ5_K)
      NPURT_QUANT_CASE(kQ6_K)
#undef NPURT_QUANT_CASE
      default:
        ForEachRowGroup(row_stride_bytes, rows, n, [&](size_t t, size_t r0, size_t g) {
          MatVecPlain(base + r0 * row_stride_bytes, type, row_stride_bytes, g, xs + t * x_pitch, k,
                      ys + t * y_pitch + r0, accumulate);
        });
        break;
    }
    t0 = t1;
  }
}

void MatVecBatch(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                 size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  const auto* base = static_cast<const uint8_t*>(w);
  if (batch > 1 && matvec_batch_reorder()) {
    for (size_t t = 0; t < batch; ++t) MatVecReordered(base, type, row_stride_bytes, rows, x + t * x_pitch, k, y + t * y_pitch, accumulate);
    return;
  }
  for (size_t t0 = 0; t0 < batch; t0 += isa::kMaxTmvBatch) {
    MatVecSlice(base, type, row_stride_bytes, rows, x + t0 * x_pitch, k, std::min<size_t>(isa::kMaxTmvBatch, batch - t0),
                x_pitch, y + t0 * y_pitch, y_pitch, accumulate);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace npurt::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace npurt::sim {

HWY_EXPORT(Dequantize);
HWY_EXPORT(MatVecBatch);

namespace {
std::atomic<bool> g_integer_path{true};
std::atomic<bool> g_batch_reorder{false};
}  // namespace

bool matvec_integer_path() { return g_integer_path.load(std::memory_order_relaxed); }
void matvec_set_integer_path_for_test(bool enabled) { g_integer_path.store(enabled, std::memory_order_relaxed); }

void matvec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatVecBatch)(w, type, row_stride_bytes, rows, x, k, 1, k, y, rows, accumulate);
}

void matvec_batch(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                  size_t batch, float* y, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatVecBatch)(w, type, row_stride_bytes, rows, x, k, batch, k, y, rows, accumulate);
}

bool matvec_batch_reorder() { return g_batch_reorder.load(std::memory_order_relaxed); }
void matvec_set_batch_reorder_for_test(bool reorder) { g_batch_reorder.store(reorder, std::memory_order_relaxed); }

void dequantize(const void* blocks, isa::DType type, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(Dequantize)(blocks, type, out, n);
}

}  // namespace npurt::sim
#endif  // HWY_ONCE
