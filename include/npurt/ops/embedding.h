// Embedding lookup of one token: out = table[token] * scale.
//
// Arguments: "table" (in, `dtype`, vocab x dim row-major; quantized rows are
// dim / block_elems consecutive blocks), scalar "token" (i32) and "out" (out, f32,
// dim). The row is fetched with one TGATHER (quantized rows are dequantized exactly as
// by the host's to_f32) and scaled in f32, so plain and quantized tables match the
// reference to f32 rounding of the one multiply.
//
// A token outside [0, vocab) is never clamped: the gather faults (negative index, or a
// row outside the table buffer) and the launch fails with kDeviceFault.
//
// Vocabulary shards (tensor-parallel decoding splits the tied embedding / LM-head table
// by rows over devices): with `shard`, the table holds rows [first_row, first_row +
// vocab) of the full vocabulary and "token" is the global id. A token inside the shard
// gives exactly the bytes the unsharded operator gives for that row; any other token
// gives a row of -0.0f instead of a fault, so the elementwise sum of every shard's
// output, in any order, is the unsharded output bit for bit. -0.0f, not +0.0f: it is
// the exact additive identity (x + -0 = x for every x), while +0 would turn the -0.0f
// elements of a row (a zero quant times a negative block scale: common in q8_0, q4_0,
// q5_0 and q6_K tables) into +0.0f. The batched form takes a shard too; it then
// looks rows up one by one instead of one gather per tile.
//
// One block does the whole row of the one-token form: a single row is one gather and one multiply, too little
// work to split. dim x 4 bytes must fit a core's local memory.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct EmbeddingParams {
  uint64_t vocab = 0;
  uint32_t dim = 0;
  isa::DType dtype = isa::DType::kF32;  // f32, bf16, f16 or a quantized block type
  float scale = 1.0f;                   // Gemma-3: sqrt(hidden) = 25.298222 for hidden 640
  // Batched (prefill): 0 takes the scalar "token"; T > 0 takes the i32 buffer "tokens"
  // (T ids) instead, "out" is T x dim, and the i32 scalar "rows" (last) says how many
  // leading tokens a launch looks up. Each row is computed as the one-token form does.
  uint32_t tokens = 0;
  // Vocabulary shard (see above): the table's row 0 is global row `first_row`, and
  // tokens outside [first_row, first_row + vocab) look up -0.0f. Without `shard`,
  // first_row must be 0.
  bool shard = false;
  uint64_t first_row = 0;
};

class Embedding final : public OperatorWith<EmbeddingParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  StatusOr<uint32_t> emit_batched(EmitContext& ctx) const;
  Status validate_shard() const;
};

}  // namespace npurt::ops
