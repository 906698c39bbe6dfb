// The online softmax step shared by the attention kernels (private to ops/).
#pragma once

#include "npurt/isa/builder.h"

namespace npurt::ops {

// Per-row statistics (rows x 1 tiles), the score tile (rows x positions) and the
// output accumulator (rows x dim) of an attention kernel.
struct OnlineSoftmaxTiles {
  isa::Tile max, tile_max, rescale, sum, tile_sum, scores, out;
};

// Folds one tile of scores into the running softmax of every row: m_new = max(m,
// rowmax(s)); the sum and the output accumulated under m are rescaled by exp(m -
// m_new), and the scores become this tile's weights exp(s - m_new), added to the sum.
// The caller then adds weights x V into `out`.
inline void emit_online_softmax_fold(isa::KernelBuilder& b, const OnlineSoftmaxTiles& t) {
  using isa::BinOp;
  b.tred(isa::RedOp::kMax, t.tile_max, t.scores);
  b.tbin(BinOp::kMax, t.tile_max, t.tile_max, t.max);  // m_new
  b.tbin(BinOp::kSub, t.rescale, t.max, t.tile_max);
  b.tun(isa::UnOp::kExp, t.rescale, t.rescale);
  b.tbin(BinOp::kMax, t.max, t.max, t.tile_max);
  b.tbin(BinOp::kSub, t.scores, t.scores, t.tile_max, isa::kBcastCol);
  b.tun(isa::UnOp::kExp, t.scores, t.scores);
  b.tred(isa::RedOp::kSum, t.tile_sum, t.scores);
  b.tbin(BinOp::kMul, t.sum, t.sum, t.rescale);
  b.tbin(BinOp::kAdd, t.sum, t.sum, t.tile_sum);
  b.tbin(BinOp::kMul, t.out, t.out, t.rescale, isa::kBcastCol);
}

}  // namespace npurt::ops
