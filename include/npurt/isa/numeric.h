// Scalar conversions between the ISA's element types and f32, on the host.
//
// These are the reference semantics of the element types: host references of
// operators, tests and file loaders use them. They round exactly as the simulated
// cores do (round to nearest even, NaN stays NaN), so a value converted here and on
// the device has the same bits. They are plain loops, not a fast path.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "npurt/isa/isa.h"

namespace npurt::isa {

// The rare path of f16_to_f32: a subnormal f16 (exponent 0, mantissa != 0).
float f16_subnormal_to_f32(uint32_t sign, uint32_t man);

// Exact f16 (raw bits) -> f32, subnormals, infinities and NaN included. Inline: block
// decoders call it once per block in their inner loops.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  return f16_subnormal_to_f32(sign, man);
}
// f32 -> f16 bits, round to nearest even; beyond the f16 range -> infinity;
// NaN -> quiet NaN.
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
// f32 -> bf16 bits, round to nearest even; NaN -> quiet NaN.
uint16_t f32_to_bf16(float f);

// Bytes that hold `elements` values of `t`: whole blocks for quantized types (the
// count must then be a multiple of the block size, else 0 is returned).
uint64_t dtype_bytes(DType t, uint64_t elements);

// Decodes `n` elements of type `t` (plain or quantized) starting at `src` to f32.
// For quantized types n must be a multiple of the block size.
void to_f32(const void* src, DType t, float* dst, size_t n);
std::vector<float> to_f32(std::span<const uint8_t> bytes, DType t);
// Encodes n f32 values as plain type `t` (f32, bf16, f16, i32: truncation toward
// zero). Quantized types are not supported here.
void from_f32(const float* src, DType t, void* dst, size_t n);

}  // namespace npurt::isa
