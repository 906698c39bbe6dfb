// Highway implementation of sim::dequantize (see dequant_kernels.h). Each block is
// unpacked to small integers with byte operations, then converted and scaled in f32
// lanes with the reference decoder's operation order (multiply, then subtract; no
// fused multiply-add), which keeps the results bit-identical.

#include "hal/sim/dequant_kernels.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "npurt/isa/quant.h"

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_DL)
#endif
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif

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

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
HWY_INLINE void ScaleMinK4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
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
    ScaleMinK4(j, scales, &sc, &m);
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
    for (int l = 0; l < 32; ++l) {
      q[l] = static_cast<int8_t>(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
      q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
      q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
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

// sum_l f32(q[l]) * x[l] over n values (n a multiple of 16), as a vector of partials.
template <typename DQ, typename Q>
HWY_INLINE hn::Vec<DF> DotQ(const Q* q, const float* x, size_t n) {
  const DF df;
  auto s = hn::Zero(df);
  for (size_t l = 0; l < n; l += hn::Lanes(df)) {
    const auto v = hn::ConvertTo(df, hn::PromoteTo(DI32(), hn::LoadU(DQ(), q + l)));
    s = hn::MulAdd(v, hn::LoadU(df, x + l), s);
  }
  return s;
}

float DotRowQ8_0(const uint8_t* src, const float* x, size_t nb) {
  const DF df;
  auto acc = hn::Zero(df);
  for (size_t i = 0; i < nb; ++i, src += sizeof(isa::BlockQ8_0), x += 32) {
    const auto* q = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ8_0, qs));
    acc = hn::MulAdd(DotQ<DI8>(q, x, 32), hn::Set(df, HalfAt(src)), acc);
  }
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

template <bool kFifthBit>
float DotRowQ4_0Q5_0(const uint8_t* src, const float* x, size_t nb) {
  const DF df;
  auto acc = hn::Zero(df);
  for (size_t i = 0; i < nb; ++i, src += kQ4_0Q5_0Bytes<kFifthBit>, x += 32) {
    int8_t q[32];
    UnpackQ4_0Q5_0<kFifthBit>(src, q);
    acc = hn::MulAdd(DotQ<DI8>(q, x, 32), hn::Set(df, HalfAt(src)), acc);
  }
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

// K types: sum over sub-blocks of (d*sc) * sum(q x) - (dmin*m) * sum(x); the sums of
// x per 32 values (xsum) are computed once per instruction. The values are decoded
// in 32-bit lanes straight from the packed bytes (each lane holds one qs byte, whose
// low and high nibbles belong to sub-blocks 2c and 2c+1), so nothing goes through
// memory between unpacking and the multiply.
template <bool kFifthBit, typename Block>
float DotRowK(const uint8_t* src, const float* x, const float* xsum, size_t nb) {
  const DF df;
  const DI32 di;
  const hn::Rebind<uint32_t, DF> du;
  const auto low = hn::Set(du, 15), one = hn::Set(du, 1);
  auto acc = hn::Zero(df);
  float mins = 0.0f;
  for (size_t i = 0; i < nb; ++i, src += sizeof(Block), x += 256, xsum += 8) {
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
      acc = hn::MulAdd(s_lo, hn::Set(df, k.scale[2 * c]), acc);
      acc = hn::MulAdd(s_hi, hn::Set(df, k.scale[2 * c + 1]), acc);
      mins += k.min[2 * c] * xsum[2 * c] + k.min[2 * c + 1] * xsum[2 * c + 1];
    }
  }
  return hn::GetLane(hn::SumOfLanes(df, acc)) - mins;
}

// Q6_K decoded in 32-bit lanes as for the K types: per half block, lane l combines
// ql[l] / ql[l + 32] nibbles with the 2-bit pairs of qh[l] into the values at l,
// l + 32, l + 64 and l + 96, each 16-value group scaled by its own d * sc.
float DotRowQ6_K(const uint8_t* src, const float* x, size_t nb) {
  const DF df;
  const DI32 di;
  const hn::Rebind<uint32_t, DF> du;
  const auto low = hn::Set(du, 15), three = hn::Set(du, 3);
  const auto bias = hn::Set(di, 32);
  auto acc = hn::Zero(df);
  for (size_t i = 0; i < nb; ++i, src += sizeof(isa::BlockQ6_K), x += 256) {
    const float d = HalfAt(src + offsetof(isa::BlockQ6_K, d));
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = src + offsetof(isa::BlockQ6_K, ql) + 64 * half;
      const uint8_t* qh = src + offsetof(isa::BlockQ6_K, qh) + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(src + offsetof(isa::BlockQ6_K, scales)) + 8 * half;
      const float* xh = x + 128 * half;
      // Group g covers values [16g, 16g + 16) of this half: quarter g / 2, lanes from (g % 2) * 16.
      for (int g = 0; g < 8; ++g) {
        const int quarter = g / 2, first = (g % 2) * 16;
        auto s = hn::Zero(df);
        for (int l = first; l < first + 16; l += static_cast<int>(hn::Lanes(df))) {
          const auto v = hn::PromoteTo(du, hn::LoadU(DU8(), ql + l + (quarter & 1) * 32));
          const auto h = hn::PromoteTo(du, hn::LoadU(DU8(), qh + l));
          const auto nib = quarter < 2 ? hn::And(v, low) : hn::ShiftRight<4>(v);
          const auto hi2 = hn::And(hn::ShiftRightSame(h, 2 * quarter), three);
          const auto q = hn::Sub(hn::BitCast(di, hn::Or(nib, hn::ShiftLeft<4>(hi2))), bias);
          s = hn::MulAdd(hn::ConvertTo(df, q), hn::LoadU(df, xh + 32 * quarter + l), s);
        }
        acc = hn::MulAdd(s, hn::Set(df, d * static_cast<float>(sc[g])), acc);
      }
    }
  }
  return hn::GetLane(hn::SumOfLanes(df, acc));
}

// Plain rows: two accumulators hide the FMA latency; `load` converts a full vector,
// `scalar` one element of the tail.
template <typename LoadF, typename ScalarF>
HWY_INLINE float DotPlain(const float* x, size_t k, LoadF load, ScalarF scalar) {
  const DF df;
  const size_t n = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df);
  size_t l = 0;
  for (; l + 2 * n <= k; l += 2 * n) {
    a0 = hn::MulAdd(load(l), hn::LoadU(df, x + l), a0);
    a1 = hn::MulAdd(load(l + n), hn::LoadU(df, x + l + n), a1);
  }
  for (; l + n <= k; l += n) a0 = hn::MulAdd(load(l), hn::LoadU(df, x + l), a0);
  float tail = 0.0f;
  for (; l < k; ++l) tail += scalar(l) * x[l];
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))) + tail;
}

// Software prefetch distance for streamed weight rows: the hardware prefetchers alone
// leave one core's stream latency-bound well below DRAM bandwidth.
constexpr size_t kPrefetchBytes = 1024;

// GM rows may start at any byte: scalar reads go through memcpy.
template <typename T>
HWY_INLINE T LoadAt(const T* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

float DotRowPlain(const uint8_t* row, isa::DType type, const float* x, size_t k) {
  const DF df;
  if (type == isa::DType::kF32) {
    const auto* w = reinterpret_cast<const float*>(row);
    return DotPlain(x, k, [&](size_t l) { return hn::LoadU(df, w + l); }, [&](size_t l) { return LoadAt<float>(w + l); });
  }
  const auto* w = reinterpret_cast<const uint16_t*>(row);
  const hn::Rebind<uint16_t, DF> d16;
  if (type == isa::DType::kBF16) {
    const hn::Rebind<uint32_t, DF> d32;
    return DotPlain(
        x, k, [&](size_t l) { return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16, w + l)))); },
        [&](size_t l) { return isa::bf16_to_f32(LoadAt<uint16_t>(w + l)); });
  }
  const hn::Rebind<hwy::float16_t, DF> dh;
  return DotPlain(
      x, k, [&](size_t l) { return hn::PromoteTo(df, hn::BitCast(dh, hn::LoadU(d16, w + l))); },
      [&](size_t l) { return isa::f16_to_f32(LoadAt<uint16_t>(w + l)); });
}

// Four plain rows at once: each x vector is loaded once for four rows and four weight
// streams are in flight, which one core needs to get near DRAM bandwidth. The tail
// (k not a multiple of the vector length) goes through DotRowPlain's scalar path.
void DotFourRowsPlain(const uint8_t* row0, size_t stride, isa::DType type, const float* x, size_t k, float out[4]) {
  const DF df;
  const size_t n = hn::Lanes(df);
  const size_t body = k / n * n;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<uint32_t, DF> d32;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto load = [&](int r, size_t l) {
    const uint8_t* row = row0 + static_cast<size_t>(r) * stride;
    if (type == isa::DType::kF32) return hn::LoadU(df, reinterpret_cast<const float*>(row) + l);
    const auto h = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(row) + l);
    if (type == isa::DType::kBF16) return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, h)));
    return hn::PromoteTo(df, hn::BitCast(dh, h));
  };
  const size_t esize = isa::dtype_size(type);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  for (size_t l = 0; l < body; l += n) {
    if ((l * esize) % 64 == 0) {  // one prefetch per cache line of each row
      for (int r = 0; r < 4; ++r) hwy::Prefetch(row0 + r * stride + l * esize + kPrefetchBytes);
    }
    const auto xv = hn::LoadU(df, x + l);
    a0 = hn::MulAdd(load(0, l), xv, a0);
    a1 = hn::MulAdd(load(1, l), xv, a1);
    a2 = hn::MulAdd(load(2, l), xv, a2);
    a3 = hn::MulAdd(load(3, l), xv, a3);
  }
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
  if (body == k) return;
  for (int r = 0; r < 4; ++r) {
    out[r] += DotRowPlain(row0 + r * stride + body * esize, type, x + body, k - body);
  }
}

// Four Q8_0 rows at once, for the same reason as DotFourRowsPlain.
void DotFourRowsQ8_0(const uint8_t* row0, size_t stride, const float* x, size_t nb, float out[4]) {
  const DF df;
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  constexpr size_t kBlock = sizeof(isa::BlockQ8_0);
  const auto block = [&](int r, size_t b) { return row0 + r * stride + b * kBlock; };
  const auto dot = [&](int r, size_t b) {
    const uint8_t* p = block(r, b);
    return hn::Mul(DotQ<DI8>(reinterpret_cast<const int8_t*>(p + offsetof(isa::BlockQ8_0, qs)), x + 32 * b, 32),
                   hn::Set(df, HalfAt(p)));
  };
  for (size_t b = 0; b < nb; ++b) {
    if (b % 2 == 0) {
      for (int r = 0; r < 4; ++r) hwy::Prefetch(block(r, b) + kPrefetchBytes);
    }
    a0 = hn::Add(a0, dot(0, b));
    a1 = hn::Add(a1, dot(1, b));
    a2 = hn::Add(a2, dot(2, b));
    a3 = hn::Add(a3, dot(3, b));
  }
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}

void MatVec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate) {
  const auto* base = static_cast<const uint8_t*>(w);
  const size_t nb = k / isa::dtype_block_elems(type);
  // Sums of x per 32 values for the K types' minimum terms.
  std::vector<float> xsum;
  if (type == isa::DType::kQ4_K || type == isa::DType::kQ5_K) {
    xsum.resize(k / 32);
    for (size_t j = 0; j < xsum.size(); ++j) {
      float s = 0.0f;
      for (size_t l = 0; l < 32; ++l) s += x[32 * j + l];
      xsum[j] = s;
    }
  }
  size_t i = 0;
  if (isa::dtype_is_plain(type) || type == isa::DType::kQ8_0) {
    for (; i + 4 <= rows; i += 4) {
      float v[4];
      const uint8_t* row = base + i * row_stride_bytes;
      if (type == isa::DType::kQ8_0) {
        DotFourRowsQ8_0(row, row_stride_bytes, x, nb, v);
      } else {
        DotFourRowsPlain(row, row_stride_bytes, type, x, k, v);
      }
      for (int r = 0; r < 4; ++r) y[i + r] = accumulate ? y[i + r] + v[r] : v[r];
    }
  }
  for (; i < rows; ++i) {
    const uint8_t* row = base + i * row_stride_bytes;
    float v;
    switch (type) {
      case isa::DType::kQ8_0: v = DotRowQ8_0(row, x, nb); break;
      case isa::DType::kQ4_0: v = DotRowQ4_0Q5_0<false>(row, x, nb); break;
      case isa::DType::kQ5_0: v = DotRowQ4_0Q5_0<true>(row, x, nb); break;
      case isa::DType::kQ4_K: v = DotRowK<false, isa::BlockQ4_K>(row, x, xsum.data(), nb); break;
      case isa::DType::kQ5_K: v = DotRowK<true, isa::BlockQ5_K>(row, x, xsum.data(), nb); break;
      case isa::DType::kQ6_K: v = DotRowQ6_K(row, x, nb); break;
      default: v = DotRowPlain(row, type, x, k); break;
    }
    y[i] = accumulate ? y[i] + v : v;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace npurt::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace npurt::sim {

HWY_EXPORT(Dequantize);
HWY_EXPORT(MatVec);

void matvec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatVec)(w, type, row_stride_bytes, rows, x, k, y, accumulate);
}

void dequantize(const void* blocks, isa::DType type, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(Dequantize)(blocks, type, out, n);
}

}  // namespace npurt::sim
#endif  // HWY_ONCE
