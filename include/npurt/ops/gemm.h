// Matrix product C = A B: prefill projections and batched work.
//
// Arguments, in kernel order:
//   "a" (in, `dtype`, m * k elements): A, m x k row-major.
//   "b" (in, `dtype`, k * n elements): B, k x n row-major (GemmBLayout::kRowMajor), or
//       stored as B^T, n x k row-major (kColMajor: the layout of a weight matrix
//       whose rows are output features).
//   "c" (out, `out_dtype`, m * n elements): C, m x n row-major.
// Inputs are f32 or bf16 (A and B alike), outputs f32 or bf16. Products are
// accumulated in f32 and rounded once to `out_dtype` on store.
//
// C is cut into tile_m x tile_n tiles, each accumulated over k in chunks of tile_k;
// every block computes a contiguous range of C tiles. Edge tiles may be short in
// any dimension, so any shape works.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

enum class GemmBLayout : uint8_t { kRowMajor, kColMajor };

struct GemmParams {
  uint64_t m = 0, n = 0, k = 0;
  isa::DType dtype = isa::DType::kF32;      // of A and B: f32 or bf16
  isa::DType out_dtype = isa::DType::kF32;  // of C: f32 or bf16
  GemmBLayout b_layout = GemmBLayout::kRowMajor;
  uint32_t tile_m = 0, tile_n = 0, tile_k = 0;  // 0: chosen by the operator
  uint32_t cores = 0;                           // blocks; 0: the target's cores
};

class Gemm final : public OperatorWith<GemmParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
};

}  // namespace npurt::ops
