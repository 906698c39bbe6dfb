// PagedDecodeAttention: decode attention of several sequences, each one query token
// against its own keys and values, read from a pool of fixed-size blocks through its
// block table (the paged KV cache that models/kv_blocks.h hands out).
//
// Sequence s (0 .. rows - 1) has len_s = lens[s] positions; position p lives in row
// tables[s][p / block_positions] * block_positions + p % block_positions of the pools.
// For every query head h of s (kv head g = h / (n_heads / n_kv_heads)) and its query at
// position len_s - 1:
//   out[s][h] = sum_t softmax(scale * q[s][h] . k[t][g])_t v[t][g]   for t in [first_s, len_s)
// where first_s = max(0, len_s - window) when window > 0, else 0.
//
// Arguments, in order:
//   "q"      in,  f32,      sequences x n_heads x head_dim
//   "k_pool" in,  kv_dtype, blocks * block_positions x n_kv_heads x head_dim
//   "v_pool" in,  kv_dtype, same layout
//   "tables" in,  i32,      sequences x max_blocks (entries outside a sequence's attended
//                           blocks are never read: the window's released ones, say)
//   "lens"   in,  i32,      sequences
//   "out"    out, f32,      sequences x n_heads x head_dim
//   "rows"   scalar i32: how many leading sequences the launch runs (clamped to
//            1 .. sequences); the others' outputs are left as they are.
// A len outside [1, max_blocks * block_positions], or a table entry it reaches outside
// [0, blocks), faults the launch (kDeviceFault) before that cache access.
//
// The blocks share the (sequence, kv head) units. A unit walks its sequence's blocks
// in position order, one K tile and one V tile per block (the block's attended rows),
// folding each into an online softmax (running max and sum, the output rescaled by
// exp(m_old - m_new)). A sequence's result depends on its query, its len and the
// contents of the rows it attends only: never on the other sequences, their number,
// its slot, the blocks its rows happen to be in, or the cores.
//
// Accuracy: as DecodeAttention (the query is multiplied by `scale` first; exp is the
// cores' f32 approximation): rel-L2 ~1e-6 against an exact softmax for f32 pools.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct PagedDecodeAttentionParams {
  uint32_t n_heads = 0;
  uint32_t n_kv_heads = 0;        // divides n_heads
  uint32_t head_dim = 0;
  uint32_t block_positions = 16;  // rows per block: the tile a unit reads at a time
  uint32_t blocks = 0;            // in each pool
  uint32_t max_blocks = 0;        // table entries per sequence
  uint32_t sequences = 1;         // the most a launch runs
  uint32_t window = 0;            // attend to the last `window` positions; 0: all of them
  float scale = 0;                // 0: 1/sqrt(head_dim)
  isa::DType kv_dtype = isa::DType::kF32;  // f32, bf16 or f16
  uint32_t cores = 0;             // blocks of the launch; 0: the target's cores
};

class PagedDecodeAttention final : public OperatorWith<PagedDecodeAttentionParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
};

}  // namespace npurt::ops
