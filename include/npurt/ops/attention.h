// DecodeAttention: one query token against a KV cache, with grouped-query heads and an
// optional sliding window; scores and softmax in f32.
//
// For every query head h (kv head g = h / (n_heads / n_kv_heads)) and the query at
// position len - 1:
//   s_t   = scale * dot(q[h], k[t][g])        for t in [first, len)
//   out[h] = sum_t softmax(s)_t * v[t][g]
// where first = max(0, len - window) when window > 0, else 0.
//
// Arguments, in order:
//   "q"       in,  f32,      n_heads x head_dim
//   "k_cache" in,  kv_dtype, max_len x n_kv_heads x head_dim ([position][kv head][dim])
//   "v_cache" in,  kv_dtype, same layout
//   "out"     out, f32,      n_heads x head_dim
//   "len"     scalar i32: valid cached positions (the query is position len - 1)
//
// len is read at run time, so one kernel serves every decode step. A len outside
// [1, max_len] faults the launch (kDeviceFault) before any cache access; cache
// positions outside the attended range are never read.
//
// The kernel tiles the positions (tile_t per tile) with an online softmax (running
// max and sum, the output rescaled by exp(m_old - m_new)), so local memory bounds the
// tile, not max_len. The query heads of a kv group share each K/V tile: S = Q K^T and
// O += P V are one matmul each. Blocks split the work by kv head and, when there are
// fewer kv heads than cores, by sub-groups of a group's query heads (each block then
// reads the group's K/V itself).
//
// split_positions (what a long cache wants): the positions are cut into chunks of
// chunk_positions() (tile_t, or 128 when that is 0) at multiples of it, and the
// blocks share the (chunk, kv head) units, so every cached byte is read once per
// launch whatever the number of cores. Each unit writes its chunk's softmax partial
// (row max m, sum l and unnormalized output o of every query head of the group) to
// the extra f32 argument "partials" (the last one); after a grid barrier the blocks
// share the (query, head) units and fold the chunks in position order, 32 at a time:
// out = sum_j exp(m_j - M) o_j / sum_j exp(m_j - M) l_j. The bits depend on len,
// window and the chunk only, never on the cores or on how many queries a launch
// has. The kernel runs on all `cores` blocks (in a fused sequence, on every core of
// the launch).
//
// Several consecutive queries (queries > 1, or queries_runtime): "q" and "out" hold
// `queries` tokens' heads (queries x n_heads x head_dim), query i at position
// len - 1 + i attending to [first_i, len + i) (causal among them: the caller appends
// their keys and values first); with queries_runtime the i32 scalar "rows" (last)
// gives how many (clamped to 1 .. queries). Each query runs exactly the one-query
// code, so its result is bitwise that of a one-query launch with len + i: the decode
// step and the verification of drafted tokens agree to the bit.
//
// Accuracy: the query is multiplied by `scale` before the dot products and exp uses
// the cores' f32 approximation, so results differ from an exact softmax by f32
// rounding (rel-L2 ~1e-6); f16/bf16 caches are used as stored, without rounding q.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct DecodeAttentionParams {
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;  // divides n_heads
  uint32_t head_dim = 0;
  uint32_t max_len = 0;  // cache capacity in positions
  uint32_t window = 0;   // attend to the last `window` positions; 0: all of them
  float scale = 0;       // 0: 1/sqrt(head_dim). Gemma-3 pre-scales q and uses 1
  isa::DType kv_dtype = isa::DType::kF32;  // f32, bf16 or f16
  uint32_t tile_t = 0;   // positions per tile; 0: the most that fit local memory
  uint32_t cores = 0;    // blocks; 0: the target's cores
  uint32_t queries = 1;  // consecutive query tokens (the compiled most with queries_runtime)
  bool queries_runtime = false;  // the i32 scalar "rows" gives the queries of a launch
  bool split_positions = false;  // blocks share position chunks; adds the "partials" argument
};

class DecodeAttention final : public OperatorWith<DecodeAttentionParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 public:
  // With split_positions: the positions of a chunk, and the f32 elements of
  // "partials" (queries x n_heads x chunks x (head_dim + 2)).
  uint32_t chunk_positions() const;
  uint64_t partials_elems() const;
};

}  // namespace npurt::ops
