#include "npurt/ops/weight_gemm.h"

#include <algorithm>

#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr char kOp[] = "weight_gemm";

struct Plan {
  uint64_t tm = 0, tk = 0, tt = 0;
  uint64_t w_at = 0, x_at = 0, y_at = 0, local_bytes = 0;
};

void lay_out(Plan& plan, uint64_t rows) {
  plan.w_at = 0;
  plan.x_at = align64(plan.tk * plan.tm * 4);
  plan.y_at = align64(plan.x_at + plan.tt * plan.tk * 4);
  plan.local_bytes = plan.y_at + rows * plan.tm * 4;
}

// The largest multiple of `block` that divides k and is at most `limit` (block itself
// when none is).
uint64_t chunk_of(uint64_t k, uint64_t block, uint64_t limit) {
  for (uint64_t c = std::min(limit, k) / block * block; c >= block; c -= block) {
    if (k % c == 0) return c;
  }
  return block;
}

// Defaults: 64 output features x 256-value k chunks x 64 rows per multiply, halved
// (features first, then rows) until the accumulators for every row fit local memory.
Plan plan_gemm(const WeightGemmParams& p, const Target& target) {
  const uint64_t block = isa::dtype_is_quantized(p.weight) ? isa::dtype_block_elems(p.weight) : 1;
  Plan plan;
  plan.tm = std::min<uint64_t>(p.tile_m ? p.tile_m : 64, p.m);
  plan.tk = p.tile_k ? p.tile_k : chunk_of(p.k, block, 256);
  plan.tt = std::min<uint64_t>(p.tile_t ? p.tile_t : 64, p.rows);
  lay_out(plan, p.rows);
  while (plan.local_bytes > target.local_bytes) {
    if (!p.tile_m && plan.tm > 16) {
      plan.tm = std::max<uint64_t>(16, plan.tm / 2);
    } else if (!p.tile_t && plan.tt > 8) {
      plan.tt /= 2;
    } else {
      break;  // emit() reports that the tiles do not fit
    }
    lay_out(plan, p.rows);
  }
  return plan;
}

}  // namespace

std::string WeightGemm::name() const {
  return std::string(kOp) + " " + std::string(isa::dtype_name(p_.weight)) + " " + std::to_string(p_.m) + "x" +
         std::to_string(p_.k) + " rows " + std::to_string(p_.rows) + (p_.rows_runtime ? " (runtime rows)" : "");
}

Status WeightGemm::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "m", p_.m, UINT32_MAX, "must be < 2^32"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "k", p_.k, 65535, "must be <= 65535"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "rows", p_.rows, 65535, "must be <= 65535"));
  if (!is_weight_type(p_.weight)) return invalid_param(kOp, "weight", "must be f32, bf16, f16 or a quantized block type");
  const uint64_t block = isa::dtype_is_quantized(p_.weight) ? isa::dtype_block_elems(p_.weight) : 1;
  if (p_.k % block != 0) {
    return invalid_param(name(), "k", "must be a multiple of the block size " + std::to_string(block));
  }
  if (p_.tile_m % 16 != 0) return invalid_param(name(), "tile_m", "must be a multiple of 16");
  if (p_.tile_k && (p_.tile_k % block != 0 || p_.k % p_.tile_k != 0)) {
    return invalid_param(name(), "tile_k", "must divide k and be a multiple of the block size " + std::to_string(block));
  }
  if (p_.tile_t > 65535) return invalid_param(name(), "tile_t", "must be <= 65535");
  return ok_status();
}

std::vector<ArgSpec> WeightGemm::signature() const {
  std::vector<ArgSpec> s{ArgSpec::buffer("w", Access::kIn, p_.weight, p_.m * p_.k),
                         ArgSpec::buffer("x", Access::kIn, DType::kF32, p_.rows * p_.k),
                         ArgSpec::buffer("y", Access::kOut, DType::kF32, p_.rows * p_.m)};
  if (p_.rows_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

StatusOr<uint32_t> WeightGemm::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const Plan plan = plan_gemm(p_, target);
  NPURT_RETURN_IF_ERROR(local_fits(name(), p_.tile_m ? "tile_m" : "rows", plan.local_bytes, target));
  const bool quantized = isa::dtype_is_quantized(p_.weight);
  const int64_t m = static_cast<int64_t>(p_.m), k = static_cast<int64_t>(p_.k);
  const int64_t tm = static_cast<int64_t>(plan.tm), tk = static_cast<int64_t>(plan.tk),
                tt = static_cast<int64_t>(plan.tt);
  const int64_t w_row_bytes = static_cast<int64_t>(isa::dtype_bytes(p_.weight, p_.k));
  const int64_t w_chunk_bytes = static_cast<int64_t>(isa::dtype_bytes(p_.weight, plan.tk));
  const uint64_t tiles_m = ceil_div(p_.m, plan.tm);
  const uint32_t grid = grid_for(tiles_m, cores_of(p_.cores, target));
  const uint32_t w_at = static_cast<uint32_t>(plan.w_at), x_at = static_cast<uint32_t>(plan.x_at),
                 y_at = static_cast<uint32_t>(plan.y_at);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t w = ctx.arg("w"), x = ctx.arg("x"), y = ctx.arg("y");
  const Reg bid{0}, first{1}, count{2}, total{3}, row_tiles{4}, m0{5}, cols{6}, w_off{7}, x_off{8}, y_off{9},
      y_local{10}, left{11}, trows{12}, chunks{13}, w_pitch{14}, x_pitch{15}, y_pitch{16}, k_off{17}, tiles{18};
  const Tile tw{0}, tx{1}, ty{2};

  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(tiles_m), grid, first, count);
  if (p_.rows_runtime) {
    b.arg_value(total, ctx.arg(kRowsScalar));
  } else {
    b.li(total, static_cast<int64_t>(p_.rows));
  }
  emit_ceil_div(b, row_tiles, total, tt);
  b.alui(AluOp::kMul, m0, first, tm);
  b.li(w_pitch, quantized ? w_row_bytes : k);
  b.li(x_pitch, k);
  b.li(y_pitch, m);

  // One k chunk at byte k_off of each W row: decode it, then multiply every row tile.
  const auto emit_chunk = [&](bool accumulate) {
    b.alui(AluOp::kMul, w_off, m0, w_row_bytes);
    b.alu(AluOp::kAdd, w_off, w_off, k_off);
    if (quantized) {
      b.tdef(tw, DType::kF32, static_cast<int>(tk), cols, w_at);
      b.tldq(tw, w, w_off, w_pitch, p_.weight, /*transposed=*/true);
    } else {
      b.tdef(tw, DType::kF32, cols, static_cast<int>(tk), w_at);
      b.tld(tw, w, w_off, p_.weight, w_pitch);
    }
    b.mov(left, total);
    b.li(y_local, 0);
    b.mov(tiles, row_tiles);
    b.loop_begin(tiles);
    b.alui(AluOp::kMin, trows, left, tt);
    b.tdef(tx, DType::kF32, trows, static_cast<int>(tk), x_at);
    b.tld(tx, x, x_off, DType::kF32, x_pitch);
    b.tdef(ty, DType::kF32, trows, cols, y_at, y_local);
    b.tmma(ty, tx, tw, static_cast<uint8_t>((quantized ? 0 : isa::kTransB) | (accumulate ? isa::kAccumulate : 0)));
    b.alui(AluOp::kAdd, x_off, x_off, tt * k * 4);
    b.alui(AluOp::kAdd, y_local, y_local, tt * tm * 4);
    b.alui(AluOp::kSub, left, left, tt);
    b.loop_end();
  };

  b.loop_begin(count);
  b.li(cols, m);
  b.alu(AluOp::kSub, cols, cols, m0);
  b.alui(AluOp::kMin, cols, cols, tm);  // the last m tile may be short
  b.li(k_off, 0);
  b.li(x_off, 0);
  emit_chunk(false);
  if (p_.k > plan.tk) {
    b.li(chunks, static_cast<int64_t>(p_.k / plan.tk - 1));
    b.li(y_off, 0);  // the chunk's first value in a row (y_off is free until the stores)
    b.loop_begin(chunks);
    b.alui(AluOp::kAdd, k_off, k_off, w_chunk_bytes);
    b.alui(AluOp::kAdd, y_off, y_off, tk);
    b.alui(AluOp::kMul, x_off, y_off, 4);
    emit_chunk(true);
    b.loop_end();
  }
  // Store the accumulators of every row tile.
  b.mov(left, total);
  b.li(y_local, 0);
  b.alui(AluOp::kMul, y_off, m0, 4);
  b.mov(tiles, row_tiles);
  b.loop_begin(tiles);
  b.alui(AluOp::kMin, trows, left, tt);
  b.tdef(ty, DType::kF32, trows, cols, y_at, y_local);
  b.tst(ty, y, y_off, DType::kF32, y_pitch);
  b.alui(AluOp::kAdd, y_off, y_off, tt * m * 4);
  b.alui(AluOp::kAdd, y_local, y_local, tt * tm * 4);
  b.alui(AluOp::kSub, left, left, tt);
  b.loop_end();
  b.alui(AluOp::kAdd, m0, m0, tm);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(plan.local_bytes));
  return grid;
}

void WeightGemm::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> w = read_f32(args[0], p_.weight);
  const std::vector<float> x = read_f32(args[1], DType::kF32);
  std::vector<float> y = read_f32(args[2], DType::kF32);
  const uint64_t rows = p_.rows_runtime ? std::clamp<int64_t>(args[3].as_i64(), 0, p_.rows) : p_.rows;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t i = 0; i < p_.m; ++i) {
      double sum = 0;
      for (uint64_t j = 0; j < p_.k; ++j) sum += static_cast<double>(x[r * p_.k + j]) * w[i * p_.k + j];
      y[r * p_.m + i] = static_cast<float>(sum);
    }
  }
  write_f32(args[2], DType::kF32, y);
}

}  // namespace npurt::ops
