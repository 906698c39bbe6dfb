// Matrix-vector product y = epilogue(A x): the projections of single-token inference.
//
// Arguments, in kernel order:
//   "w" (in, `weight` dtype, m * k elements): A, m rows of k values, rows contiguous.
//       Quantized types hold each row as k / block_elems consecutive GGUF blocks,
//       which is exactly GGUF's layout of a [k, m] tensor.
//   "x" (in, f32, k elements)
//   "y" (out, f32, m elements)
// Weights may be f32, bf16, f16 or q8_0, q4_0, q5_0, q4_K, q5_K, q6_K. The kernel
// streams them from GM with TMV (docs/isa.md): no weight tile is copied to local
// memory, quantized blocks are decoded in registers, each block's (or K sub-block's)
// products with x are summed in f32 and scaled once. Results therefore match the
// reference on the dequantized weights to f32 rounding (the reference sums in
// double); activations are never quantized. The epilogue runs on the cores'
// approximations of gelu_tanh / silu (a few ulp).
//
// Each block takes a contiguous range of rows and walks it in tiles of rows_per_tile
// rows (default: up to 4096, so one instruction covers megabytes of weights); x is
// loaded once per block when it fits local memory, otherwise in k_tile chunks whose
// products accumulate. The last row tile may be short, and k need not be a multiple
// of k_tile.
//
// Batched (batch > 1, or batch_runtime): x holds `batch` vectors (batch x k, rows
// contiguous) and y their products (batch x m); with batch_runtime the i32 scalar
// "rows" (last argument) says how many (clamped to 1 .. batch), the others left as
// they are. One batched TMV per row tile reads each weight block once for every
// vector, and each vector's result is bitwise the batch = 1 kernel's for that vector,
// whatever the batch and the vector's place in it (docs/isa.md, TMV): the decode step
// and the verification of several drafted tokens compute the same bits. The k chunks
// are the one-vector kernel's; the row tiles shrink so every vector's accumulator fits.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

enum class GemvEpilogue : uint8_t { kNone, kGeluTanh, kSilu };

struct GemvParams {
  uint64_t m = 0;  // rows of A, elements of y
  uint64_t k = 0;  // columns of A, elements of x; a multiple of the block for quantized weights
  isa::DType weight = isa::DType::kF32;
  GemvEpilogue epilogue = GemvEpilogue::kNone;
  uint32_t rows_per_tile = 0;  // 0: chosen by the operator
  uint32_t k_tile = 0;         // columns per tile (a multiple of the block); 0: chosen by the operator
  uint32_t cores = 0;          // blocks; 0: the target's cores
  uint32_t batch = 1;          // vectors, 1 .. isa::kMaxTmvBatch (the compiled most with batch_runtime)
  bool batch_runtime = false;  // the i32 scalar "rows" gives the vectors of a launch
};

class Gemv final : public OperatorWith<GemvParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
};

}  // namespace npurt::ops
