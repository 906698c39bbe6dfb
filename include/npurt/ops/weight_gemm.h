// WeightGemm: y = x W^T for a batch of rows (the projections of batched prefill), with
// W in any stored weight type.
//
// Arguments, in kernel order:
//   "w" (in, `weight`, m x k: output feature i is row i, quantized rows are k /
//       block_elems consecutive blocks, as GGUF stores them);
//   "x" (in, f32, rows x k), "y" (out, f32, rows x m);
//   with rows_runtime, the i32 scalar "rows" (last): a launch computes only the first
//   `rows` rows of y (0 <= rows <= the compiled rows) and leaves the others as they are.
//
// Each block takes a range of m tiles (tile_m output features). For every k chunk
// (tile_k values) it decodes the chunk of its W rows once into a local tile, stored
// transposed by TLDQ (k x tile_m, so the tile matrix multiply uses it in place), and
// multiplies every tile_t rows of x with it into f32 accumulators that hold all rows
// of its m tile; the accumulators are stored once at the end. So each weight byte is
// read and decoded once per launch, whatever the number of rows: the weight traffic
// of a chunk of T prompt tokens is that of one decode step.
//
// Accuracy: weights are decoded exactly (docs/isa.md), products and sums are f32
// (TMMA). Against the reference (double sums over the decoded weights) the relative L2
// error is that of an f32 dot product of length k, about 1e-7 .. 1e-6. This is not bit
// for bit the GEMV (TMV) result, which sums blocks in another order.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct WeightGemmParams {
  uint64_t m = 0;     // output features (rows of W)
  uint64_t k = 0;     // input features
  uint64_t rows = 0;  // rows of x and y (the compiled maximum with rows_runtime)
  isa::DType weight = isa::DType::kF32;  // f32, bf16, f16 or a quantized block type
  bool rows_runtime = false;
  uint32_t tile_m = 0;  // output features per tile, a multiple of 16; 0: chosen by the operator
  uint32_t tile_k = 0;  // k chunk, dividing k, a multiple of the block size; 0: chosen
  uint32_t tile_t = 0;  // rows of x per multiply; 0: chosen by the operator
  uint32_t cores = 0;   // blocks; 0: the target's cores
};

class WeightGemm final : public OperatorWith<WeightGemmParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
};

}  // namespace npurt::ops
