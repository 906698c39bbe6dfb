// Code-emission helpers shared by the operator kernels (private to ops/).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "npurt/isa/builder.h"
#include "npurt/ops/operator.h"

namespace npurt::ops {

// Default tile size of the elementwise-style operators: enough elements to amortize
// each instruction's dispatch.
inline constexpr uint64_t kTileElements = 16384;

// Splits `chunks` work items into contiguous ranges, one per block of a `grid`-block
// launch: block b handles [first, first + count) with per = ceil(chunks / grid),
// first = b * per and count = clamp(chunks - first, 0, per). Emits code that leaves
// `first` and `count` in registers (`bid` must hold the block id).
inline void emit_block_range(isa::KernelBuilder& b, isa::Reg bid, int64_t chunks, int64_t grid, isa::Reg first,
                             isa::Reg count) {
  using isa::AluOp;
  const int64_t per = (chunks + grid - 1) / grid;
  b.alui(AluOp::kMul, first, bid, per);
  b.li(count, chunks);
  b.alu(AluOp::kSub, count, count, first);
  b.alui(AluOp::kMin, count, count, per);
  b.alui(AluOp::kMax, count, count, 0);
}

// Number of blocks for `chunks` work items on `cores` cores: one block per core, no
// more blocks than items.
inline uint32_t grid_for(uint64_t chunks, uint32_t cores) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(chunks, cores)));
}

inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// kOk when `bytes` of tiles fit the target's local memory; otherwise the error every
// operator gives, naming the parameter that sized them.
inline Status local_fits(std::string_view op, std::string_view param, uint64_t bytes, const Target& target) {
  if (bytes <= target.local_bytes) return Status();
  return invalid_param(op, param, "needs " + std::to_string(bytes) + " bytes of local memory, the target has " +
                                      std::to_string(target.local_bytes));
}

}  // namespace npurt::ops
