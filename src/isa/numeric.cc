#include "npurt/isa/numeric.h"

#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

#include "npurt/isa/quant.h"

namespace npurt::isa {

float f16_subnormal_to_f32(uint32_t sign, uint32_t man) {
  // Normalize the mantissa into an f32 normal number.
  uint32_t e = 113;  // f32 biased exponent of 2^-14
  while ((man & 0x400u) == 0) {
    man <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((man & 0x3FFu) << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is an f16 subnormal (or zero): scale so the f16 ulp (2^-24) is 1 and round.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // exact: power of two
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t round = 0xFFFu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + round) >> 13));
}

float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

uint64_t dtype_bytes(DType t, uint64_t elements) {
  const uint64_t be = dtype_block_elems(t);
  if (elements % be != 0) return 0;
  return elements / be * dtype_block_bytes(t);
}

void to_f32(const void* src, DType t, float* dst, size_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, p, n * 4);
      return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    case DType::kBF16:
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        dst[i] = t == DType::kBF16 ? bf16_to_f32(v) : f16_to_f32(v);
      }
      return;
    default:
      dequantize_row(p, t, dst, n);
  }
}

std::vector<float> to_f32(std::span<const uint8_t> bytes, DType t) {
  const size_t n = dtype_is_plain(t) ? bytes.size() / dtype_size(t)
                                     : bytes.size() / dtype_block_bytes(t) * dtype_block_elems(t);
  std::vector<float> out(n);
  to_f32(bytes.data(), t, out.data(), n);
  return out;
}

void from_f32(const float* src, DType t, void* dst, size_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::kF32:
        std::memcpy(p + 4 * i, &src[i], 4);
        break;
      case DType::kI32: {
        const int32_t v = std::isnan(src[i]) ? 0 : static_cast<int32_t>(std::fmax(std::fmin(src[i], 2147483520.f), -2147483648.f));
        std::memcpy(p + 4 * i, &v, 4);
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        const uint16_t v = t == DType::kBF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
        std::memcpy(p + 2 * i, &v, 2);
        break;
      }
      default:
        assert(false && "from_f32: quantized types are not encoded here");
        return;
    }
  }
}

}  // namespace npurt::isa
