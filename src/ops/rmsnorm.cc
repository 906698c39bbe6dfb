#include "npurt/ops/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr char kOp[] = "rmsnorm";

}  // namespace

std::string RmsNorm::name() const {
  return std::string(kOp) + (p_.weighted ? "" : " unweighted") + " " + std::string(isa::dtype_name(p_.dtype)) + " " +
         std::to_string(p_.rows) + "x" + std::to_string(p_.dim) + (p_.rows_runtime ? " (runtime rows)" : "");
}

Status RmsNorm::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "rows", p_.rows, UINT32_MAX, "must be < 2^32"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "dim", p_.dim, 65535, "must be <= 65535"));
  if (!std::isfinite(p_.eps) || p_.eps < 0) return invalid_param(kOp, "eps", "must be finite and >= 0");
  if (!is_float_io(p_.dtype)) return invalid_param(kOp, "dtype", "must be f32, bf16 or f16");
  return ok_status();
}

std::vector<ArgSpec> RmsNorm::signature() const {
  const uint64_t n = p_.rows * p_.dim;
  std::vector<ArgSpec> s{ArgSpec::buffer("x", Access::kIn, p_.dtype, n)};
  if (p_.weighted) s.push_back(ArgSpec::buffer("w", Access::kIn, DType::kF32, p_.dim));
  s.push_back(ArgSpec::buffer("out", Access::kOut, p_.dtype, n));
  if (p_.rows_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

// Local layout: the x tile (rows x dim), the per-row scale (rows x 1), the weight.
uint64_t RmsNorm::local_bytes(uint64_t rows_per_tile) const {
  return 4 * (rows_per_tile * p_.dim + rows_per_tile + (p_.weighted ? p_.dim : 0));
}

uint64_t RmsNorm::rows_per_tile(const Target& target) const {
  if (p_.rows_per_tile) return std::min<uint64_t>(p_.rows_per_tile, p_.rows);
  // Spread the rows over the cores, but keep each tile within kTileElements.
  const uint64_t per_core = ceil_div(p_.rows, cores_of(p_.cores, target));
  return std::max<uint64_t>(1, std::min<uint64_t>(per_core, kTileElements / p_.dim));
}

StatusOr<uint32_t> RmsNorm::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t rpt = rows_per_tile(target);
  NPURT_RETURN_IF_ERROR(local_fits(kOp, p_.rows_per_tile ? "rows_per_tile" : "dim", local_bytes(rpt), target));
  const uint32_t grid = grid_for(ceil_div(p_.rows, rpt), cores_of(p_.cores, target));
  const int64_t row_bytes = static_cast<int64_t>(p_.dim * isa::dtype_size(p_.dtype));
  const uint32_t scale_at = static_cast<uint32_t>(4 * rpt * p_.dim);
  const uint32_t weight_at = static_cast<uint32_t>(scale_at + 4 * rpt);
  const int dim = static_cast<int>(p_.dim);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t x = ctx.arg("x");
  const uint8_t w = p_.weighted ? ctx.arg("w") : 0;
  const uint8_t out = ctx.arg("out");
  const Reg bid{0}, first{1}, count{2}, off{3}, left{4}, rows{5}, bytes{6}, dim_f{7}, eps{8}, zero{9}, total{10},
      tiles{11}, per{12};
  const Tile tx{0}, tscale{1}, tw{2};
  b.block_id(bid);
  emit_row_tiles(b, ctx, p_.rows_runtime, p_.rows, 1, rpt, grid, {bid, total, tiles, per, first, count});
  if (p_.weighted) {
    b.li(zero, 0);
    b.tdef(tw, DType::kF32, 1, dim, weight_at);
    b.tld(tw, w, zero, DType::kF32);
  }
  b.li(dim_f, f32_bits(static_cast<float>(p_.dim)));
  b.li(eps, f32_bits(p_.eps));
  b.alui(AluOp::kMul, off, first, static_cast<int64_t>(rpt) * row_bytes);
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(rpt));
  b.alu(AluOp::kAdd, left, left, total);
  b.loop_begin(count);
  b.alui(AluOp::kMin, rows, left, static_cast<int64_t>(rpt));  // the last tile may be short
  b.tdef(tx, DType::kF32, rows, dim, 0);
  b.tdef(tscale, DType::kF32, rows, 1, scale_at);
  b.tld(tx, x, off, p_.dtype);
  b.tred(isa::RedOp::kSumSq, tscale, tx);
  b.tsop(BinOp::kDiv, tscale, tscale, dim_f);
  b.tsop(BinOp::kAdd, tscale, tscale, eps);
  b.tun(isa::UnOp::kRsqrt, tscale, tscale);
  b.tbin(BinOp::kMul, tx, tx, tscale, isa::kBcastCol);
  if (p_.weighted) b.tbin(BinOp::kMul, tx, tx, tw, isa::kBcastRow);
  b.tst(tx, out, off, p_.dtype);
  emit_advance(b, off, rows, row_bytes, bytes);
  b.alu(AluOp::kSub, left, left, rows);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local_bytes(rpt)));
  return static_cast<uint32_t>(grid);
}

void RmsNorm::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> x = read_f32(args[0], p_.dtype);
  const std::vector<float> w = p_.weighted ? read_f32(args[1], DType::kF32) : std::vector<float>(p_.dim, 1.f);
  std::vector<float> out = read_f32(args[args.size() - (p_.rows_runtime ? 2 : 1)], p_.dtype);
  const uint64_t rows = p_.rows_runtime ? std::clamp<int64_t>(args.back().as_i64(), 0, p_.rows) : p_.rows;
  for (uint64_t r = 0; r < rows; ++r) {
    const float* row = &x[r * p_.dim];
    double sumsq = 0;
    for (uint32_t i = 0; i < p_.dim; ++i) sumsq += static_cast<double>(row[i]) * row[i];
    const double scale = 1.0 / std::sqrt(sumsq / p_.dim + p_.eps);
    for (uint32_t i = 0; i < p_.dim; ++i) out[r * p_.dim + i] = static_cast<float>(row[i] * scale * w[i]);
  }
  write_f32(args[args.size() - (p_.rows_runtime ? 2 : 1)], p_.dtype, out);
}

}  // namespace npurt::ops
