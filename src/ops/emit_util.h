// Helpers shared by the operators: parameter checks and code emission (private to ops/).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "npurt/base/math.h"
#include "npurt/isa/builder.h"
#include "npurt/ops/operator.h"

namespace npurt::ops {

// The ISA names every operator's signature and code use.
using isa::Access;
using isa::AluOp;
using isa::ArgSpec;
using isa::BinOp;
using isa::DType;
using isa::RedOp;
using isa::Reg;
using isa::Tile;
using isa::UnOp;

// Default tile size of the elementwise-style operators: enough elements to amortize
// each instruction's dispatch.
inline constexpr uint64_t kTileElements = 16384;

// TDEF immediate dimensions are 16-bit.
inline constexpr uint64_t kMaxTileDim = 65535;

// The plain float types operators take for activations and caches.
inline bool is_float_io(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// What weight tables may hold: a plain float type or a quantized block type.
inline bool is_weight_type(DType t) { return is_float_io(t) || isa::dtype_is_quantized(t); }

// An f32 constant as the register bits LI loads (TSOP and TFILL read the low 32 bits).
inline int64_t f32_bits(float v) { return std::bit_cast<uint32_t>(v); }

// Local-memory layouts start their tiles at multiples of 64 bytes.
inline uint64_t align64(uint64_t v) { return round_up(v, 64); }

// The count emit_block_range gives every block when `chunks` split evenly over
// `grid` blocks (a code generator can then leave out a loop that runs once), else
// nullopt.
inline std::optional<int64_t> even_block_count(int64_t chunks, int64_t grid) {
  if (chunks % grid != 0) return std::nullopt;
  return chunks / grid;
}

// Splits `chunks` work items into contiguous ranges, one per block of a `grid`-block
// launch: block b handles chunks / grid items, one more if b < chunks % grid, from
// first = b * (chunks / grid) + min(b, chunks % grid). The largest share is
// ceil(chunks / grid), and no block sits idle while another holds two (10 items over 8
// blocks: 2, 2, 1, 1, 1, 1, 1, 1 rather than 2, 2, 2, 2, 2, 0, 0, 0), which matters
// where one host thread runs several blocks in turn. Emits code that leaves `first`
// and `count` in registers (`bid` must hold the block id).
inline void emit_block_range(isa::KernelBuilder& b, isa::Reg bid, int64_t chunks, int64_t grid, isa::Reg first,
                             isa::Reg count) {
  if (const std::optional<int64_t> per = even_block_count(chunks, grid)) {
    b.alui(AluOp::kMul, first, bid, *per);  // no per-block correction to compute
    b.li(count, *per);
    return;
  }
  const int64_t base = chunks / grid, rem = chunks % grid;
  b.alui(AluOp::kMin, count, bid, rem);  // the longer ranges before this block
  b.alui(AluOp::kMul, first, bid, base);
  b.alu(AluOp::kAdd, first, first, count);
  b.li(count, rem);  // count = base + (bid < rem)
  b.alu(AluOp::kSub, count, count, bid);
  b.alui(AluOp::kMax, count, count, 0);
  b.alui(AluOp::kMin, count, count, 1);
  b.alui(AluOp::kAdd, count, count, base);
}

// emit_block_range for a number of work items known only at run time: `chunks` holds
// it; `per` is left holding ceil(chunks / grid). A negative count gives every block
// count 0.
inline void emit_block_range_at_run_time(isa::KernelBuilder& b, isa::Reg bid, isa::Reg chunks, int64_t grid,
                                         isa::Reg first, isa::Reg count, isa::Reg per) {
  b.alui(AluOp::kMax, per, chunks, 0);
  b.alui(AluOp::kAdd, per, per, grid - 1);
  b.alui(AluOp::kDiv, per, per, grid);
  b.alu(AluOp::kMul, first, bid, per);
  b.alu(AluOp::kSub, count, chunks, first);
  b.alu(AluOp::kMin, count, count, per);
  b.alui(AluOp::kMax, count, count, 0);
}

// The items bid, bid + grid, bid + 2 grid, ... of `chunks` (a register, known at run
// time): count = ceil((chunks - bid) / grid), 0 when that is negative. For items whose
// cost grows with their index (causal attention's query tiles), striding gives every
// block nearly the same work where contiguous ranges give the last block the most.
inline void emit_strided_count_at_run_time(isa::KernelBuilder& b, isa::Reg bid, isa::Reg chunks, int64_t grid,
                                           isa::Reg count) {
  b.alu(isa::AluOp::kSub, count, chunks, bid);
  b.alui(isa::AluOp::kMax, count, count, 0);
  b.alui(isa::AluOp::kAdd, count, count, grid - 1);
  b.alui(isa::AluOp::kDiv, count, count, grid);
}

// off += count * stride: an offset moved by a register count of rows, tiles or
// elements (clobbers `scratch`).
inline void emit_advance(isa::KernelBuilder& b, isa::Reg off, isa::Reg count, int64_t stride, isa::Reg scratch) {
  b.alui(isa::AluOp::kMul, scratch, count, stride);
  b.alu(isa::AluOp::kAdd, off, off, scratch);
}

// dst = ceil(src / d) for a non-negative src register.
inline void emit_ceil_div(isa::KernelBuilder& b, isa::Reg dst, isa::Reg src, int64_t d) {
  b.alui(isa::AluOp::kAdd, dst, src, d - 1);
  b.alui(isa::AluOp::kDiv, dst, dst, d);
}

// gate = 1 when lo <= value < hi, else 0 (value, lo and hi well inside int64): the
// count of a loop run as an "if", the ISA having no branches. Clobbers `scratch`.
inline void emit_range_gate(isa::KernelBuilder& b, isa::Reg gate, isa::Reg value, int64_t lo, int64_t hi,
                            isa::Reg scratch) {
  b.alui(isa::AluOp::kAdd, gate, value, 1 - lo);  // > 0 iff value >= lo
  b.alui(isa::AluOp::kMul, scratch, value, -1);
  b.alui(isa::AluOp::kAdd, scratch, scratch, hi);  // > 0 iff value < hi
  b.alu(isa::AluOp::kMin, gate, gate, scratch);
  b.alui(isa::AluOp::kMin, gate, gate, 1);
  b.alui(isa::AluOp::kMax, gate, gate, 0);
}

// The scalar argument that says how many leading rows of an operator's buffers a
// launch processes (operators compiled with `rows_runtime`): i32, 0..rows. Batched
// prefill runs one kernel for any chunk length this way.
inline constexpr char kRowsScalar[] = "rows";

// Registers of emit_row_tiles.
struct RowTileRegs {
  isa::Reg bid, total, tiles, per, first, count;
};

// The prologue of a row-wise operator: `total` = the rows a launch processes (the
// compiled `rows`, or with `runtime` the i32 scalar kRowsScalar, times `scale`
// elements per row), and this block's tiles of `per_tile` of them: [first, first +
// count). `bid` must hold the block id.
inline void emit_row_tiles(isa::KernelBuilder& b, const EmitContext& ctx, bool runtime, uint64_t rows, uint64_t scale,
                           uint64_t per_tile, uint32_t grid, const RowTileRegs& r) {
  const int64_t tile = static_cast<int64_t>(per_tile);
  if (!runtime) {
    b.li(r.total, static_cast<int64_t>(rows * scale));
    emit_block_range(b, r.bid, static_cast<int64_t>(ceil_div(rows * scale, per_tile)), grid, r.first, r.count);
    return;
  }
  b.arg_value(r.total, ctx.arg(kRowsScalar));
  if (scale != 1) b.alui(isa::AluOp::kMul, r.total, r.total, static_cast<int64_t>(scale));
  emit_ceil_div(b, r.tiles, r.total, tile);
  emit_block_range_at_run_time(b, r.bid, r.tiles, grid, r.first, r.count, r.per);
}

// The blocks an operator splits its work over: its `cores` parameter, or the
// target's cores when that is 0.
inline uint32_t cores_of(uint32_t cores, const Target& target) { return cores ? cores : target.cores; }

// Number of blocks for `chunks` work items on `cores` cores: one block per core, no
// more blocks than items.
inline uint32_t grid_for(uint64_t chunks, uint32_t cores) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(chunks, cores)));
}


// kOk when 1 <= value <= max; otherwise the error naming `param`: "must be > 0", or
// `over_max`.
inline Status check_count(std::string_view op, std::string_view param, uint64_t value, uint64_t max,
                          std::string_view over_max) {
  if (value == 0) return invalid_param(op, param, "must be > 0");
  if (value > max) return invalid_param(op, param, over_max);
  return ok_status();
}

// kOk when `bytes` of tiles fit the target's local memory; otherwise the error every
// operator gives, naming the parameter that sized them.
inline Status local_fits(std::string_view op, std::string_view param, uint64_t bytes, const Target& target) {
  if (bytes <= target.local_bytes) return ok_status();
  return invalid_param(op, param, "needs " + std::to_string(bytes) + " bytes of local memory, the target has " +
                                      std::to_string(target.local_bytes));
}

}  // namespace npurt::ops
