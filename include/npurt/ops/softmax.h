// Softmax over each row of a rows x cols f32 matrix, with optional causal and
// sliding-window masks (attention scores).
//
// Row i sees column j when
//   causal:  j <= i + offset
//   window:  j >  i + offset - window   (only together with causal)
// where offset defaults to cols - rows: the rows are the newest rows queries of a
// sequence whose first cols - rows positions are already cached, so the last row
// sees every column. Masked entries are exactly 0; a row that sees nothing is all 0.
// Gemma's local layers use causal with window 512.
//
// Arguments: "x" (in, rows x cols f32), "out" (out, rows x cols f32). out may be bound
// to the same buffer as x: each tile is loaded completely before it is stored.
// Computed as exp(x - max) / sum in f32 (the reference sums in double).
#pragma once

#include <cstdint>
#include <optional>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct SoftmaxParams {
  uint64_t rows = 1;
  uint32_t cols = 0;
  bool causal = false;
  uint32_t window = 0;                            // 0: no sliding window
  std::optional<int64_t> offset = std::nullopt;  // causal offset; default cols - rows
  uint32_t rows_per_tile = 0;                     // 0: chosen by the operator
  uint32_t cores = 0;                             // blocks; 0: the target's cores
};

class Softmax final : public OperatorWith<SoftmaxParams, InPlace::kSafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  int64_t offset() const;
  uint64_t rows_per_tile(const Target& target) const;
  uint64_t local_bytes(uint64_t rows_per_tile) const { return 4 * rows_per_tile * (p_.cols + 2); }
};

}  // namespace npurt::ops
