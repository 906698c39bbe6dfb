#include "npurt/ops/copy.h"

#include <algorithm>
#include <cstring>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

int64_t esize(DType t) { return static_cast<int64_t>(isa::dtype_size(t)); }

std::string dtypes(DType src, DType dst) {
  return std::string(isa::dtype_name(src)) + (src == dst ? "" : "->" + std::string(isa::dtype_name(dst)));
}

}  // namespace

// ---- Copy ----

std::string Copy::name() const { return "copy " + dtypes(p_.src_dtype, p_.dst_dtype) + " " + std::to_string(p_.n); }

Status Copy::validate() const {
  if (p_.n == 0) return invalid_param("copy", "n", "must be > 0");
  if (!is_float_io(p_.src_dtype)) return invalid_param("copy", "src_dtype", "must be f32, bf16 or f16");
  if (!is_float_io(p_.dst_dtype)) return invalid_param("copy", "dst_dtype", "must be f32, bf16 or f16");
  return ok_status();
}

std::vector<ArgSpec> Copy::signature() const {
  return {ArgSpec::buffer("src", Access::kIn, p_.src_dtype, p_.n),
          ArgSpec::buffer("dst", Access::kOut, p_.dst_dtype, p_.n)};
}

StatusOr<uint32_t> Copy::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t tile = p_.tile ? std::min<uint64_t>(p_.tile, p_.n) : std::min(kTileElements, p_.n);
  NPURT_RETURN_IF_ERROR(local_fits("copy", "tile", tile * esize(p_.dst_dtype), target));
  const uint64_t chunks = ceil_div(p_.n, tile);
  const uint32_t grid = grid_for(chunks, cores_of(p_.cores, target));

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t src = ctx.arg("src");
  const uint8_t dst = ctx.arg("dst");
  const Reg bid{0}, first{1}, count{2}, left{3}, cols{4}, src_off{5}, dst_off{6}, bytes{7};
  const Tile t{0};
  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(chunks), grid, first, count);
  b.alui(AluOp::kMul, src_off, first, static_cast<int64_t>(tile) * esize(p_.src_dtype));
  b.alui(AluOp::kMul, dst_off, first, static_cast<int64_t>(tile) * esize(p_.dst_dtype));
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(tile));
  b.alui(AluOp::kAdd, left, left, static_cast<int64_t>(p_.n));
  b.loop_begin(count);
  b.alui(AluOp::kMin, cols, left, static_cast<int64_t>(tile));  // the last tile may be short
  // The tile holds dst's type, so the load does the one conversion.
  b.tdef(t, p_.dst_dtype, 1, cols, 0);
  b.tld(t, src, src_off, p_.src_dtype);
  b.tst(t, dst, dst_off, p_.dst_dtype);
  emit_advance(b, src_off, cols, esize(p_.src_dtype), bytes);
  emit_advance(b, dst_off, cols, esize(p_.dst_dtype), bytes);
  b.alu(AluOp::kSub, left, left, cols);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(tile * esize(p_.dst_dtype)));
  return static_cast<uint32_t>(grid);
}

void Copy::compute_reference(std::span<const HostArg> args) const {
  write_f32(args[1], p_.dst_dtype, read_f32(args[0], p_.src_dtype));
}

// ---- StridedCopy ----

std::string StridedCopy::name() const {
  return "strided_copy " + dtypes(p_.src_dtype, p_.dst_dtype) + " " + std::to_string(p_.rows) + "x" +
         std::to_string(p_.cols) + " into " + std::to_string(dst_rows()) + (p_.dst_row_runtime ? " at dst_row" : "") +
         (p_.src_row_runtime ? " from src_row of " + std::to_string(src_rows()) : "") +
         (p_.dst_row_index ? " at dst_row_of" : "") + (p_.rows_runtime ? " (runtime rows)" : "");
}

Status StridedCopy::validate() const {
  constexpr char op[] = "strided_copy";
  NPURT_RETURN_IF_ERROR(check_count(op, "rows", p_.rows, UINT32_MAX, "must be < 2^32"));
  NPURT_RETURN_IF_ERROR(check_count(op, "cols", p_.cols, 65535, "must be <= 65535"));
  if (src_stride() < p_.cols) return invalid_param(op, "src_stride", "must be >= cols");
  if (dst_stride() < p_.cols) return invalid_param(op, "dst_stride", "must be >= cols");
  if (src_stride() > (uint64_t{1} << 40) || dst_stride() > (uint64_t{1} << 40)) {
    return invalid_param(op, src_stride() > (uint64_t{1} << 40) ? "src_stride" : "dst_stride", "must be <= 2^40");
  }
  if (dst_rows() < p_.rows) return invalid_param(op, "dst_rows", "must be >= rows");
  if (src_rows() < p_.rows) return invalid_param(op, "src_rows", "must be >= rows");
  if (src_rows() > UINT32_MAX) return invalid_param(op, "src_rows", "must be < 2^32");
  if (dst_rows() > UINT32_MAX) return invalid_param(op, "dst_rows", "must be < 2^32");
  if (!is_float_io(p_.src_dtype)) return invalid_param(op, "src_dtype", "must be f32, bf16 or f16");
  if (!is_float_io(p_.dst_dtype)) return invalid_param(op, "dst_dtype", "must be f32, bf16 or f16");
  if (p_.dst_row_index && (p_.dst_row_runtime || p_.src_row_runtime)) {
    return invalid_param(op, "dst_row_index", "excludes dst_row_runtime and src_row_runtime");
  }
  return ok_status();
}

std::vector<ArgSpec> StridedCopy::signature() const {
  std::vector<ArgSpec> s{
      ArgSpec::buffer("src", Access::kIn, p_.src_dtype, (src_rows() - 1) * src_stride() + p_.cols),
      ArgSpec::buffer("dst", Access::kInOut, p_.dst_dtype, (dst_rows() - 1) * dst_stride() + p_.cols)};
  if (p_.dst_row_runtime) s.push_back(ArgSpec::scalar("dst_row", DType::kI32));
  if (p_.src_row_runtime) s.push_back(ArgSpec::scalar("src_row", DType::kI32));
  if (p_.rows_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  if (p_.dst_row_index) s.push_back(ArgSpec::buffer("dst_row_of", Access::kIn, DType::kI32, p_.rows));
  return s;
}

// dst_row_index: row by row, each to the dst row its index names.
StatusOr<uint32_t> StridedCopy::emit_indexed(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const int64_t row_bytes = static_cast<int64_t>(p_.cols) * esize(p_.dst_dtype);
  const uint64_t slot_at = align64(static_cast<uint64_t>(row_bytes));
  NPURT_RETURN_IF_ERROR(local_fits("strided_copy", "cols", slot_at + 4, target));
  const uint32_t grid = grid_for(p_.rows, cores_of(p_.cores, target));
  const int64_t src_row_bytes = static_cast<int64_t>(src_stride()) * esize(p_.src_dtype);
  const int64_t dst_row_bytes = static_cast<int64_t>(dst_stride()) * esize(p_.dst_dtype);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t src = ctx.arg("src"), dst = ctx.arg("dst"), index = ctx.arg("dst_row_of");
  const Reg bid{0}, first{1}, count{2}, total{3}, tiles{4}, per{5}, src_off{6}, dst_off{7}, at{8}, zero{9},
      gate{10}, scratch{11};
  const Tile t{0}, slot{1};
  b.block_id(bid);
  emit_row_tiles(b, ctx, p_.rows_runtime, p_.rows, 1, 1, grid, {bid, total, tiles, per, first, count});
  b.alui(AluOp::kMul, src_off, first, src_row_bytes);
  b.alui(AluOp::kMul, at, first, 4);
  b.li(zero, 0);
  b.tdef(t, p_.dst_dtype, 1, static_cast<int>(p_.cols), 0);
  b.tdef(slot, DType::kI32, 1, 1, static_cast<uint32_t>(slot_at));
  b.loop_begin(count);
  b.tld(slot, index, at, DType::kI32);
  b.tget(dst_off, slot, zero);
  // Faults (a division by zero) unless 0 <= index < dst_rows.
  emit_range_gate(b, gate, dst_off, 0, static_cast<int64_t>(dst_rows()), scratch);
  b.li(scratch, 1);
  b.alu(AluOp::kDiv, gate, scratch, gate);
  b.alui(AluOp::kMul, dst_off, dst_off, dst_row_bytes);
  b.tld(t, src, src_off, p_.src_dtype);
  b.tst(t, dst, dst_off, p_.dst_dtype);
  b.alui(AluOp::kAdd, src_off, src_off, src_row_bytes);
  b.alui(AluOp::kAdd, at, at, 4);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(slot_at + 4));
  return grid;
}

StatusOr<uint32_t> StridedCopy::emit(EmitContext& ctx) const {
  if (p_.dst_row_index) return emit_indexed(ctx);
  const Target& target = ctx.target;
  constexpr char op[] = "strided_copy";
  const uint64_t rpt = p_.rows_per_tile
                           ? std::min<uint64_t>(p_.rows_per_tile, p_.rows)
                           : std::clamp<uint64_t>(kTileElements / p_.cols, 1,
                                                  ceil_div(p_.rows, cores_of(p_.cores, target)));
  const int64_t tile_bytes = static_cast<int64_t>(rpt * p_.cols) * esize(p_.dst_dtype);
  NPURT_RETURN_IF_ERROR(local_fits(op, p_.rows_per_tile ? "rows_per_tile" : "cols", tile_bytes, target));
  const uint32_t grid = grid_for(ceil_div(p_.rows, rpt), cores_of(p_.cores, target));
  const int64_t src_row_bytes = static_cast<int64_t>(src_stride()) * esize(p_.src_dtype);
  const int64_t dst_row_bytes = static_cast<int64_t>(dst_stride()) * esize(p_.dst_dtype);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t src = ctx.arg("src");
  const uint8_t dst = ctx.arg("dst");
  const uint8_t dst_row = p_.dst_row_runtime ? ctx.arg("dst_row") : 0;
  const Reg bid{0}, first{1}, count{2}, left{3}, rows{4}, src_off{5}, dst_off{6}, bytes{7}, src_pitch{8},
      dst_pitch{9}, row0{10}, total{11}, tiles{12}, per{13};
  const Tile t{0};
  b.block_id(bid);
  emit_row_tiles(b, ctx, p_.rows_runtime, p_.rows, 1, rpt, grid, {bid, total, tiles, per, first, count});
  b.alui(AluOp::kMul, row0, first, static_cast<int64_t>(rpt));
  if (p_.src_row_runtime) {
    // As for dst_row: an offset outside src makes the load fault.
    b.arg_value(bytes, ctx.arg("src_row"));
    b.alu(AluOp::kAdd, src_off, row0, bytes);
    b.alui(AluOp::kMul, src_off, src_off, src_row_bytes);
  } else {
    b.alui(AluOp::kMul, src_off, row0, src_row_bytes);
  }
  if (p_.dst_row_runtime) {
    // A negative or too large dst_row yields an offset outside dst: the store faults.
    b.arg_value(bytes, dst_row);
    b.alu(AluOp::kAdd, row0, row0, bytes);
  }
  b.alui(AluOp::kMul, dst_off, row0, dst_row_bytes);
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(rpt));
  b.alu(AluOp::kAdd, left, left, total);
  b.li(src_pitch, static_cast<int64_t>(src_stride()));
  b.li(dst_pitch, static_cast<int64_t>(dst_stride()));
  b.loop_begin(count);
  b.alui(AluOp::kMin, rows, left, static_cast<int64_t>(rpt));  // the last tile may be short
  b.tdef(t, p_.dst_dtype, rows, static_cast<int>(p_.cols), 0);
  b.tld(t, src, src_off, p_.src_dtype, src_pitch);
  b.tst(t, dst, dst_off, p_.dst_dtype, dst_pitch);
  emit_advance(b, src_off, rows, src_row_bytes, bytes);
  emit_advance(b, dst_off, rows, dst_row_bytes, bytes);
  b.alu(AluOp::kSub, left, left, rows);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(tile_bytes));
  return static_cast<uint32_t>(grid);
}

void StridedCopy::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> src = read_f32(args[0], p_.src_dtype);
  std::vector<float> dst = read_f32(args[1], p_.dst_dtype);
  size_t next = 2;
  const int64_t first = p_.dst_row_runtime ? args[next++].as_i64() : 0;
  const int64_t src_first = p_.src_row_runtime ? args[next++].as_i64() : 0;
  const int64_t rows = p_.rows_runtime ? args[next++].as_i64() : static_cast<int64_t>(p_.rows);
  if (p_.dst_row_index) {
    std::vector<int32_t> to(p_.rows);
    std::memcpy(to.data(), args[next].bytes.data(), to.size() * 4);
    const int64_t n = std::clamp<int64_t>(rows, 0, static_cast<int64_t>(p_.rows));
    for (int64_t r = 0; r < n; ++r) {
      if (to[r] < 0 || static_cast<uint64_t>(to[r]) >= dst_rows()) return;  // the device faults
    }
    for (int64_t r = 0; r < n; ++r) {
      for (uint32_t c = 0; c < p_.cols; ++c) dst[to[r] * dst_stride() + c] = src[r * src_stride() + c];
    }
    write_f32(args[1], p_.dst_dtype, dst);
    return;
  }
  // The device faults on out-of-range rows; the reference then writes nothing.
  if (first < 0 || src_first < 0 || rows < 0 || static_cast<uint64_t>(rows) > p_.rows) return;
  if (static_cast<uint64_t>(first + rows) > dst_rows() || static_cast<uint64_t>(src_first + rows) > src_rows()) return;
  for (int64_t r = 0; r < rows; ++r) {
    for (uint32_t c = 0; c < p_.cols; ++c) {
      dst[(first + r) * dst_stride() + c] = src[(src_first + r) * src_stride() + c];
    }
  }
  write_f32(args[1], p_.dst_dtype, dst);
}

// ---- Transpose ----

std::string Transpose::name() const {
  return "transpose " + std::string(isa::dtype_name(p_.dtype)) + " " + std::to_string(p_.rows) + "x" +
         std::to_string(p_.cols);
}

Status Transpose::validate() const {
  constexpr char op[] = "transpose";
  if (p_.rows == 0) return invalid_param(op, "rows", "must be > 0");
  if (p_.cols == 0) return invalid_param(op, "cols", "must be > 0");
  if (p_.rows > UINT32_MAX || p_.cols > UINT32_MAX) {
    return invalid_param(op, p_.rows > UINT32_MAX ? "rows" : "cols", "must be < 2^32");
  }
  if (!is_float_io(p_.dtype)) return invalid_param(op, "dtype", "must be f32, bf16 or f16");
  if (p_.tile_rows > 4096) return invalid_param(op, "tile_rows", "must be <= 4096");
  if (p_.tile_cols > 256) return invalid_param(op, "tile_cols", "must be <= 256");
  return ok_status();
}

std::vector<ArgSpec> Transpose::signature() const {
  return {ArgSpec::buffer("src", Access::kIn, p_.dtype, p_.rows * p_.cols),
          ArgSpec::buffer("dst", Access::kOut, p_.dtype, p_.rows * p_.cols)};
}

// The identity's size is the multiply's inner dimension: each dst element costs
// tile_cols multiply-adds, so it stays small; tall tiles amortize the dispatch.
uint64_t Transpose::tile_cols() const { return std::min<uint64_t>(p_.tile_cols ? p_.tile_cols : 64, p_.cols); }
uint64_t Transpose::tile_rows() const { return std::min<uint64_t>(p_.tile_rows ? p_.tile_rows : 256, p_.rows); }

StatusOr<uint32_t> Transpose::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  constexpr char op[] = "transpose";
  const uint64_t tr = tile_rows(), tc = tile_cols();
  // Local layout: the identity (tc x tc), the src tile (tr x tc), the f32 product (tc x tr).
  const uint64_t es = isa::dtype_size(p_.dtype);
  const uint64_t src_at = tc * tc * es, dst_at = src_at + tr * tc * es, local = dst_at + 4 * tc * tr;
  NPURT_RETURN_IF_ERROR(local_fits(op, "tile_rows", local, target));
  const uint64_t row_tiles = ceil_div(p_.rows, tr), items = row_tiles * ceil_div(p_.cols, tc);
  const uint32_t grid = grid_for(items, cores_of(p_.cores, target));

  std::vector<float> identity(tc * tc, 0.f);
  for (uint64_t i = 0; i < tc; ++i) identity[i * tc + i] = 1.f;

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t src = ctx.arg("src");
  const uint8_t dst = ctx.arg("dst");
  const uint32_t identity_at = b.add_constant_values(std::span<const float>(identity));
  const Reg bid{0}, item{1}, count{2}, row0{3}, col0{4}, nrows{5}, ncols{6}, off{7}, identity_off{9},
      tc_reg{10}, src_pitch{11}, dst_pitch{12};
  const Tile eye{0}, x{1}, xt{2};
  const int64_t rows = static_cast<int64_t>(p_.rows), cols = static_cast<int64_t>(p_.cols);
  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(items), grid, item, count);
  b.li(identity_off, identity_at);
  b.li(tc_reg, static_cast<int64_t>(tc));
  b.li(src_pitch, cols);
  b.li(dst_pitch, rows);
  b.loop_begin(count);
  // Item -> (column tile, row tile), row tiles fastest.
  b.alui(AluOp::kRem, row0, item, static_cast<int64_t>(row_tiles));
  b.alui(AluOp::kMul, row0, row0, static_cast<int64_t>(tr));
  b.alui(AluOp::kDiv, col0, item, static_cast<int64_t>(row_tiles));
  b.alui(AluOp::kMul, col0, col0, static_cast<int64_t>(tc));
  // Edge tiles are short: nrows = min(rows - row0, tr), ncols = min(cols - col0, tc).
  b.alui(AluOp::kMul, nrows, row0, -1);
  b.alui(AluOp::kAdd, nrows, nrows, rows);
  b.alui(AluOp::kMin, nrows, nrows, static_cast<int64_t>(tr));
  b.alui(AluOp::kMul, ncols, col0, -1);
  b.alui(AluOp::kAdd, ncols, ncols, cols);
  b.alui(AluOp::kMin, ncols, ncols, static_cast<int64_t>(tc));
  // The top-left ncols x ncols corner of the stored identity is the identity.
  b.tdef(eye, p_.dtype, ncols, ncols, 0);
  b.tld(eye, isa::kConstArg, identity_off, DType::kF32, tc_reg);
  b.tdef(x, p_.dtype, nrows, ncols, static_cast<uint32_t>(src_at));
  b.alui(AluOp::kMul, off, row0, cols);
  b.alu(AluOp::kAdd, off, off, col0);
  b.alui(AluOp::kMul, off, off, static_cast<int64_t>(es));
  b.tld(x, src, off, p_.dtype, src_pitch);
  b.tdef(xt, DType::kF32, ncols, nrows, static_cast<uint32_t>(dst_at));
  b.tmma(xt, eye, x, isa::kTransB);  // I * x^T
  b.alui(AluOp::kMul, off, col0, rows);
  b.alu(AluOp::kAdd, off, off, row0);
  b.alui(AluOp::kMul, off, off, static_cast<int64_t>(es));
  b.tst(xt, dst, off, p_.dtype, dst_pitch);
  b.alui(AluOp::kAdd, item, item, 1);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local));
  return static_cast<uint32_t>(grid);
}

void Transpose::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> src = read_f32(args[0], p_.dtype);
  std::vector<float> dst(src.size());
  for (uint64_t r = 0; r < p_.rows; ++r) {
    for (uint64_t c = 0; c < p_.cols; ++c) dst[c * p_.rows + r] = src[r * p_.cols + c];
  }
  write_f32(args[1], p_.dtype, dst);
}

}  // namespace npurt::ops
