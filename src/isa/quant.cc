#include "npurt/isa/quant.h"

#include <bit>
#include <cstring>
#include <type_traits>

#include "isa/quant_layout.h"
#include "npurt/base/status.h"

namespace npurt::isa {


namespace {

// Blocks may sit at any byte address, so each one is copied out before use.
template <typename Block>
Block load_block(const uint8_t* p) {
  Block b;
  std::memcpy(&b, p, sizeof b);
  return b;
}

void row_q8_0(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(BlockQ8_0), y += 32) {
    const auto b = load_block<BlockQ8_0>(src);
    const float d = f16_to_f32(b.d);
    for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(b.qs[l]) * d;
  }
}

void row_q4_0(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(BlockQ4_0), y += 32) {
    const auto b = load_block<BlockQ4_0>(src);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 15) - 8) * d;
      y[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

// y[l] = q[l] * d over 32 values.
inline void scaled(const int8_t* q, float d, float* y) {
  for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(q[l]) * d;
}

void row_q5_0(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(BlockQ5_0), y += 32) {
    const auto b = load_block<BlockQ5_0>(src);
    const float d = f16_to_f32(b.d);
    const uint32_t qh = uint32_t{b.qh[0]} | uint32_t{b.qh[1]} << 8 | uint32_t{b.qh[2]} << 16 |
                        uint32_t{b.qh[3]} << 24;
    int8_t q[32];
    for (int j = 0; j < 16; ++j) {
      const uint32_t h0 = ((qh >> j) << 4) & 0x10u;
      const uint32_t h1 = (qh >> (j + 12)) & 0x10u;
      q[j] = static_cast<int8_t>(static_cast<int>((b.qs[j] & 15u) | h0) - 16);
      q[j + 16] = static_cast<int8_t>(static_cast<int>((b.qs[j] >> 4) | h1) - 16);
    }
    scaled(q, d, y);
  }
}

// y[l] = d1 * q[l] - m1 over 32 values; the product is rounded before the subtraction.
inline void scaled_minus(const uint8_t* q, float d1, float m1, float* y) {
  for (int l = 0; l < 32; ++l) {
    const float p = d1 * static_cast<float>(q[l]);
    y[l] = p - m1;
  }
}

// Q4_K and Q5_K: the low and high nibbles of each 32-byte run of qs are two
// sub-blocks; Q5_K adds a fifth bit to each value from qh.
template <typename Block>
void row_q4_k_q5_k(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(Block), y += 256) {
    const auto b = load_block<Block>(src);
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc0, m0, sc1, m1;
      scale_min_k4(2 * c, b.scales, &sc0, &m0);
      scale_min_k4(2 * c + 1, b.scales, &sc1, &m1);
      const uint8_t* qs = b.qs + 32 * c;
      uint8_t lo[32], hi[32];
      for (int l = 0; l < 32; ++l) {
        lo[l] = qs[l] & 15;
        hi[l] = qs[l] >> 4;
        if constexpr (std::is_same_v<Block, BlockQ5_K>) {
          // Bit 2c of qh[l] is the fifth bit of the low-nibble value, bit 2c+1 that of the high one.
          lo[l] = static_cast<uint8_t>(lo[l] | (((b.qh[l] >> (2 * c)) & 1) << 4));
          hi[l] = static_cast<uint8_t>(hi[l] | (((b.qh[l] >> (2 * c + 1)) & 1) << 4));
        }
      }
      scaled_minus(lo, d * static_cast<float>(sc0), dmin * static_cast<float>(m0), y + 64 * c);
      scaled_minus(hi, d * static_cast<float>(sc1), dmin * static_cast<float>(m1), y + 64 * c + 32);
    }
  }
}

void row_q6_k(const uint8_t* src, float* y, size_t nb) {
  for (size_t i = 0; i < nb; ++i, src += sizeof(BlockQ6_K), y += 256) {
    const auto b = load_block<BlockQ6_K>(src);
    const float d = f16_to_f32(b.d);
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b.ql + 64 * half;
      const uint8_t* qh = b.qh + 32 * half;
      const int8_t* sc = b.scales + 8 * half;
      float* out = y + 128 * half;
      int8_t q[128];
      unpack_q6_k_half(ql, qh, q);
      // Output group g (16 values at 16g) uses scale sc[is + 2k] with k = g / 2, is = g % 2,
      // which is sc[g]; the product is d * sc, then times q.
      for (int g = 0; g < 8; ++g) {
        const float ds = d * static_cast<float>(sc[g]);
        for (int l = 0; l < 16; ++l) out[16 * g + l] = ds * static_cast<float>(q[16 * g + l]);
      }
    }
  }
}

}  // namespace

void dequantize_row(const void* blocks, DType type, float* out, size_t n) {
  const size_t be = isa::dtype_block_elems(type);
  // Callers pass whole blocks of a quantized type (an npurt bug otherwise).
  NPURT_CHECK(isa::dtype_is_quantized(type) && be != 0 && n % be == 0);
  const auto* src = static_cast<const uint8_t*>(blocks);
  const size_t nb = n / be;
  switch (type) {
    case DType::kQ8_0: row_q8_0(src, out, nb); return;
    case DType::kQ4_0: row_q4_0(src, out, nb); return;
    case DType::kQ5_0: row_q5_0(src, out, nb); return;
    case DType::kQ4_K: row_q4_k_q5_k<BlockQ4_K>(src, out, nb); return;
    case DType::kQ5_K: row_q4_k_q5_k<BlockQ5_K>(src, out, nb); return;
    case DType::kQ6_K: row_q6_k(src, out, nb); return;
    default: NPURT_CHECK(false && "dequantize_row: not a quantized dtype"); return;
  }
}

}  // namespace npurt::isa
