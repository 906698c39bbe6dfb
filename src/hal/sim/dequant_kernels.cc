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
    default: return isa::dequantize_row(blocks, type, out, n);  // checks: not quantized
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace npurt::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace npurt::sim {

HWY_EXPORT(Dequantize);

void dequantize(const void* blocks, isa::DType type, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(Dequantize)(blocks, type, out, n);
}

}  // namespace npurt::sim
#endif  // HWY_ONCE
