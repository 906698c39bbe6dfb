// PrefillAttention: a chunk of T consecutive query tokens against a KV cache that
// already holds their keys and values: causal inside the chunk, grouped-query heads,
// optional sliding window; scores and softmax in f32.
//
// Query token i (0 <= i < rows) is at position p = pos + i; for each of its heads h
// (kv head g = h / (n_heads / n_kv_heads)):
//   s_t    = scale * dot(q[i][h], k[t][g])    for t in [first, p], first = max(0, p + 1 - window) (0 without)
//   out[i][h] = sum_t softmax(s)_t * v[t][g]
// which is what DecodeAttention computes for that token with len = p + 1.
//
// Arguments, in order:
//   "q"       in,  f32,      tokens x n_heads x head_dim
//   "k_cache" in,  kv_dtype, max_len x n_kv_heads x head_dim ([position][kv head][dim])
//   "v_cache" in,  kv_dtype, same layout
//   "out"     out, f32,      tokens x n_heads x head_dim (rows past `rows` are left as they are)
//   "pos"     scalar i32: the first query's position
//   "rows"    scalar i32: query tokens in this launch, 0..tokens
// A pos < 0 or pos + rows > max_len faults the launch before any cache access.
//
// Work units are (query tile, kv head) pairs: tile_q tokens times the group's query
// heads are one tile of rows, so each K/V tile loaded serves all of them. Key tiles
// are tile_q positions, aligned to the query tile: the one on the diagonal gets a
// causal mask, the one on the window's edge a window mask, the lowest one may be cut
// at position 0; the masks are image constants added to the scores. tile_q divides
// the window, so no other tile needs a mask. The unmasked key tiles between them are
// taken up to four at a time (one tile of 4 x tile_q positions) where local memory
// allows, the rest alone. Softmax is online across key tiles, the diagonal first
// (every row has an unmasked score there), then going down in position.
//
// Accuracy: as DecodeAttention (rel-L2 ~1e-6 against exact); tiles group positions
// differently from the decode kernel, so results agree to f32 rounding, not bit for bit.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct PrefillAttentionParams {
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;  // divides n_heads
  uint32_t head_dim = 0;
  uint32_t max_len = 0;  // cache capacity in positions
  uint32_t tokens = 0;   // query tokens per launch at most
  uint32_t window = 0;   // attend to the last `window` positions; 0: all of them
  float scale = 0;       // 0: 1/sqrt(head_dim)
  isa::DType kv_dtype = isa::DType::kF32;  // f32, bf16 or f16
  uint32_t tile_q = 0;   // query tokens per tile, dividing window; 0: chosen by the operator
  uint32_t cores = 0;    // blocks; 0: the target's cores
};

class PrefillAttention final : public OperatorWith<PrefillAttentionParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint32_t tile_q() const;
};

}  // namespace npurt::ops
