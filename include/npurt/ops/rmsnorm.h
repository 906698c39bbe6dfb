// RmsNorm: out = x / sqrt(mean(x^2) + eps), times w when weighted, over `rows`
// groups of `dim` contiguous elements.
//
// rows = 1 normalizes a vector (Gemma's hidden state, dim 640); rows = n_heads
// normalizes each head of a q/k projection separately (dim = head_dim) with the
// same weight vector.
//
// Arguments: "x" (in, rows x dim of `dtype`), "w" (in, f32, dim elements; only when
// `weighted`), "out" (out, rows x dim of `dtype`). `dtype` is f32, bf16 or f16; math
// is f32 on the cores (sum of squares in f32, the reference sums in double).
//
// In place: `out` may be bound to the same buffer as `x`. Every tile is loaded
// completely before it is written back, and the blocks own disjoint rows, so no
// element is read after it was overwritten.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct RmsNormParams {
  uint64_t rows = 1;
  uint32_t dim = 0;
  float eps = 1e-6f;
  bool weighted = true;
  isa::DType dtype = isa::DType::kF32;
  uint32_t rows_per_tile = 0;  // 0: chosen by the operator
  uint32_t cores = 0;          // blocks; 0: the target's cores
  // Adds the i32 scalar "rows" (last argument): only the first `rows` rows are
  // normalized at run time, the others are left as they are (batched prefill).
  bool rows_runtime = false;
};

class RmsNorm final : public OperatorWith<RmsNormParams, InPlace::kSafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint64_t rows_per_tile(const Target& target) const;
  uint64_t local_bytes(uint64_t rows_per_tile) const;
};

}  // namespace npurt::ops
