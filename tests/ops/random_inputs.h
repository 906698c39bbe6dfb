// Fresh random contents for operator arguments, shared by the operator tests and
// benchmarks: plain types uniform in [-1, 1), quantized types random blocks whose f16
// scales are small finite values, so dequantized weights stay around [-1, 1].
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "npurt/isa/numeric.h"
#include "npurt/ops/operator.h"

namespace npurt::testing {

using Bytes = std::vector<uint8_t>;

// Random quantized blocks of `t` holding `elements` values, every f16 scale field a
// small finite value of either sign so dequantized weights stay around [-1, 1].
inline Bytes random_quant_blocks(isa::DType t, uint64_t elements, std::mt19937& rng) {
  const size_t bb = isa::dtype_block_bytes(t), nb = elements / isa::dtype_block_elems(t);
  Bytes b(nb * bb);
  for (size_t i = 0; i < b.size(); i += 4) {  // four bytes per draw: LM-head tables are 100+ MB
    const uint32_t r = rng();
    std::memcpy(&b[i], &r, std::min<size_t>(4, b.size() - i));
  }
  std::vector<size_t> halves;
  switch (t) {
    case isa::DType::kQ4_K:
    case isa::DType::kQ5_K: halves = {0, 2}; break;
    case isa::DType::kQ6_K: halves = {208}; break;
    default: halves = {0};
  }
  // Q8_0/Q6_K values reach +-128/+-32 and K-type sub-scales up to 63: smaller d.
  const float scale = t == isa::DType::kQ8_0 ? 1.f / 128 : t == isa::DType::kQ4_0 || t == isa::DType::kQ5_0 ? 1.f / 16 : 1.f / 512;
  std::uniform_real_distribution<float> mag(0.25f * scale, scale);
  for (size_t i = 0; i < nb; ++i) {
    for (size_t off : halves) {
      const float v = (rng() & 1) ? mag(rng) : -mag(rng);
      const uint16_t h = isa::f32_to_f16(v);
      std::memcpy(&b[i * bb + off], &h, 2);
    }
  }
  return b;
}

inline Bytes random_bytes_for(const isa::ArgSpec& a, std::mt19937& rng) {
  if (isa::dtype_is_quantized(a.dtype)) return random_quant_blocks(a.dtype, a.elements, rng);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(a.elements);
  for (float& x : v) x = u(rng);
  Bytes b(a.bytes());
  isa::from_f32(v.data(), a.dtype, b.data(), v.size());
  return b;
}

}  // namespace npurt::testing
