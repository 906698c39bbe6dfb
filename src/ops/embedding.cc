#include "npurt/ops/embedding.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr const char* kOp = "embedding";

uint64_t row_bytes(DType dtype, uint32_t dim) { return isa::dtype_bytes(dtype, dim); }

// What a lookup of one token works with: `index` a 1 x 1 i32 tile, `row` a 1 x dim f32
// tile; `scale` holds the scale's f32 bits unless it is 1, `pitch` the table's row bytes.
struct LookupRegs {
  uint8_t table;
  Reg tok, pitch, scale, gate, scratch, fill;
  Tile index, row;
};

// row = table[tok] * scale for the table-local row in `tok`. With a shard, `tok` holds
// the global i32 token instead: row is -0.0f (the identity of the sum over shards)
// unless the token is in the shard, and only then does the lookup run (a 0/1-count
// loop) and overwrite it. Clobbers tok, gate, scratch and fill.
void emit_row_lookup(isa::KernelBuilder& b, const EmbeddingParams& p, const LookupRegs& l) {
  if (p.shard) {
    b.li(l.fill, f32_bits(-0.0f));
    b.tfill(l.row, l.fill);
    b.alui(AluOp::kShl, l.tok, l.tok, 32);
    b.alui(AluOp::kShr, l.tok, l.tok, 32);  // the i32 token, sign-extended
    b.alui(AluOp::kSub, l.tok, l.tok, static_cast<int64_t>(p.first_row));
    emit_range_gate(b, l.gate, l.tok, 0, static_cast<int64_t>(p.vocab), l.scratch);
    b.loop_begin(l.gate);
  }
  b.tfill(l.index, l.tok);  // i32 fill takes the register's low 32 bits: the i32 token
  b.tgather(l.row, l.table, l.index, l.pitch, p.dtype);
  if (p.scale != 1.0f) b.tsop(isa::BinOp::kMul, l.row, l.row, l.scale);
  if (p.shard) b.loop_end();
}

// Registers of emit_shard_rows: `rows` holds the tile's row count, `pitch` and `scale`
// as for LookupRegs; the others are its own.
struct ShardRowRegs {
  Reg rows, pitch, scale, i, slot, row_at, tok, gate, scratch, fill;
};

// A shard's tile of `rows` tokens (ids at local 0, rows from `index_bytes`): row by row,
// as the one-token form does, since each token may or may not be in the shard. Each
// id's slot is reused as its lookup's index once read.
void emit_shard_rows(isa::KernelBuilder& b, const EmbeddingParams& p, uint8_t table, uint64_t index_bytes,
                     const ShardRowRegs& r) {
  const Tile index{0}, one_index{2}, one_row{3};
  b.li(r.i, 0);
  b.li(r.slot, 0);
  b.li(r.row_at, static_cast<int64_t>(index_bytes));
  b.loop_begin(r.rows);
  b.tget(r.tok, index, r.i);
  b.tdef(one_index, DType::kI32, 1, 1, 0, r.slot);
  b.tdef(one_row, DType::kF32, 1, static_cast<int>(p.dim), 0, r.row_at);
  emit_row_lookup(b, p, {table, r.tok, r.pitch, r.scale, r.gate, r.scratch, r.fill, one_index, one_row});
  b.alui(AluOp::kAdd, r.i, r.i, 1);
  b.alui(AluOp::kAdd, r.slot, r.slot, 4);
  b.alui(AluOp::kAdd, r.row_at, r.row_at, int64_t{p.dim} * 4);
  b.loop_end();
}

}  // namespace

std::string Embedding::name() const {
  return std::string(kOp) + " " + std::string(isa::dtype_name(p_.dtype)) + " " + std::to_string(p_.vocab) + "x" +
         std::to_string(p_.dim) + (p_.tokens ? " tokens " + std::to_string(p_.tokens) : "") +
         (p_.shard ? " shard rows " + std::to_string(p_.first_row) + "+" + std::to_string(p_.vocab) : "");
}

Status Embedding::validate() const {
  if (p_.vocab == 0) return invalid_param(kOp, "vocab", "must be > 0");
  // Tokens are i32 and gather indices are i32 too.
  if (p_.vocab > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_param(kOp, "vocab", "must be <= 2^31 - 1 (tokens are i32)");
  }
  NPURT_RETURN_IF_ERROR(check_count(kOp, "dim", p_.dim, 65535, "must be <= 65535 (one tile row)"));
  if (!is_weight_type(p_.dtype)) {
    return invalid_param(kOp, "dtype", "must be f32, bf16, f16 or a quantized block type");
  }
  if (isa::dtype_is_quantized(p_.dtype) && p_.dim % isa::dtype_block_elems(p_.dtype) != 0) {
    return invalid_param(kOp, "dim",
                         "must be a multiple of the " + std::string(isa::dtype_name(p_.dtype)) + " block size " +
                             std::to_string(isa::dtype_block_elems(p_.dtype)));
  }
  if (!std::isfinite(p_.scale)) return invalid_param(kOp, "scale", "must be finite");
  return validate_shard();
}

Status Embedding::validate_shard() const {
  if (!p_.shard) {
    if (p_.first_row != 0) return invalid_param(kOp, "first_row", "must be 0 without shard");
    return ok_status();
  }
  // Global ids are i32: the shard's last row must be one.
  if (p_.first_row > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) + 1 - p_.vocab) {
    return invalid_param(kOp, "first_row", "must be <= 2^31 - vocab (global tokens are i32)");
  }
  return ok_status();
}

std::vector<ArgSpec> Embedding::signature() const {
  if (p_.tokens) {
    return {ArgSpec::buffer("table", Access::kIn, p_.dtype, p_.vocab * p_.dim),
            ArgSpec::buffer("tokens", Access::kIn, DType::kI32, p_.tokens),
            ArgSpec::buffer("out", Access::kOut, DType::kF32, uint64_t{p_.tokens} * p_.dim),
            ArgSpec::scalar(kRowsScalar, DType::kI32)};
  }
  return {ArgSpec::buffer("table", Access::kIn, p_.dtype, p_.vocab * p_.dim),
          ArgSpec::scalar("token", DType::kI32),
          ArgSpec::buffer("out", Access::kOut, DType::kF32, p_.dim)};
}

StatusOr<uint32_t> Embedding::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  // The i32 index tile sits in the first 16 bytes; the row follows.
  constexpr uint32_t kRowOffset = 16;
  if (kRowOffset + uint64_t{p_.dim} * 4 > target.local_bytes) {
    return invalid_param(kOp, "dim", "row of " + std::to_string(p_.dim) + " f32 does not fit local memory");
  }
  if (p_.tokens) return emit_batched(ctx);
  isa::KernelBuilder& b = ctx.builder;
  const uint8_t table = ctx.arg("table");
  const uint8_t token = ctx.arg("token");
  const uint8_t out = ctx.arg("out");
  const Reg tok{0}, pitch{1}, scale{2}, zero{3}, gate{4}, scratch{5}, fill{6};
  const Tile index{0}, row{1};
  b.arg_value(tok, token);
  b.li(pitch, static_cast<int64_t>(row_bytes(p_.dtype, p_.dim)));
  b.li(zero, 0);
  if (p_.scale != 1.0f) b.li(scale, f32_bits(p_.scale));
  b.tdef(index, DType::kI32, 1, 1, 0);
  b.tdef(row, DType::kF32, 1, static_cast<int>(p_.dim), kRowOffset);
  emit_row_lookup(b, p_, {table, tok, pitch, scale, gate, scratch, fill, index, row});
  b.tst(row, out, zero, DType::kF32);
  return static_cast<uint32_t>(1);
}

// Tiles of rows: the ids of a tile are loaded as an i32 column, gathered, scaled and
// stored; blocks take contiguous tiles of the first `rows` tokens.
StatusOr<uint32_t> Embedding::emit_batched(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t rpt = std::clamp<uint64_t>(kTileElements / p_.dim, 1, p_.tokens);
  const uint64_t index_bytes = align64(rpt * 4);
  NPURT_RETURN_IF_ERROR(local_fits(kOp, "dim", index_bytes + rpt * p_.dim * 4, target));
  const uint32_t grid = grid_for(ceil_div(p_.tokens, rpt), target.cores);
  const int64_t out_row_bytes = int64_t{p_.dim} * 4;
  isa::KernelBuilder& b = ctx.builder;
  const uint8_t table = ctx.arg("table"), tokens = ctx.arg("tokens"), out = ctx.arg("out");
  const Reg bid{0}, first{1}, count{2}, total{3}, tiles{4}, per{5}, left{6}, rows{7}, id_off{8}, out_off{9},
      pitch{10}, scale{11}, bytes{12};
  const Tile index{0}, row{1};
  b.block_id(bid);
  emit_row_tiles(b, ctx, true, p_.tokens, 1, rpt, grid, {bid, total, tiles, per, first, count});
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(rpt));
  b.alu(AluOp::kAdd, left, left, total);
  b.alui(AluOp::kMul, id_off, first, static_cast<int64_t>(rpt) * 4);
  b.alui(AluOp::kMul, out_off, first, static_cast<int64_t>(rpt) * out_row_bytes);
  b.li(pitch, static_cast<int64_t>(row_bytes(p_.dtype, p_.dim)));
  b.li(scale, std::bit_cast<uint32_t>(p_.scale));
  b.loop_begin(count);
  b.alui(AluOp::kMin, rows, left, static_cast<int64_t>(rpt));
  b.tdef(index, DType::kI32, rows, 1, 0);
  b.tdef(row, DType::kF32, rows, static_cast<int>(p_.dim), static_cast<uint32_t>(index_bytes));
  b.tld(index, tokens, id_off, DType::kI32);
  if (p_.shard) {
    emit_shard_rows(b, p_, table, index_bytes,
                    {rows, pitch, scale, Reg{13}, Reg{14}, Reg{15}, Reg{16}, Reg{17}, Reg{18}, Reg{19}});
  } else {
    b.tgather(row, table, index, pitch, p_.dtype);
    if (p_.scale != 1.0f) b.tsop(isa::BinOp::kMul, row, row, scale);
  }
  b.tst(row, out, out_off, DType::kF32);
  emit_advance(b, id_off, rows, 4, bytes);
  emit_advance(b, out_off, rows, out_row_bytes, bytes);
  b.alu(AluOp::kSub, left, left, rows);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(index_bytes + rpt * p_.dim * 4));
  return grid;
}

void Embedding::compute_reference(std::span<const HostArg> args) const {
  if (p_.tokens) {
    const int64_t rows = std::clamp<int64_t>(args[3].as_i64(), 0, p_.tokens);
    std::vector<float> out = read_f32(args[2], DType::kF32);
    const auto* ids = reinterpret_cast<const int32_t*>(args[1].bytes.data());
    const uint64_t bytes = row_bytes(p_.dtype, p_.dim);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t token = int64_t{ids[r]} - static_cast<int64_t>(p_.first_row);  // the table-local row
      if (token < 0 || static_cast<uint64_t>(token) >= p_.vocab) {
        if (p_.shard) {  // another shard's token
          std::fill_n(out.begin() + r * p_.dim, p_.dim, -0.0f);
          continue;
        }
        std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());  // the kernel faults
        break;
      }
      const std::vector<float> row = read_f32(HostArg::buffer(args[0].bytes.subspan(token * bytes, bytes)), p_.dtype);
      for (uint32_t i = 0; i < p_.dim; ++i) out[r * p_.dim + i] = row[i] * p_.scale;
    }
    write_f32(args[2], DType::kF32, out);
    return;
  }
  // The table-local row; a shard's outside tokens give -0.0f, others fault (no result).
  const int64_t token = int64_t{static_cast<int32_t>(args[1].as_i64())} - static_cast<int64_t>(p_.first_row);
  std::vector<float> out(p_.dim, p_.shard ? -0.0f : std::numeric_limits<float>::quiet_NaN());
  if (token >= 0 && static_cast<uint64_t>(token) < p_.vocab) {
    const uint64_t bytes = row_bytes(p_.dtype, p_.dim);
    const std::vector<float> row = read_f32(HostArg::buffer(args[0].bytes.subspan(token * bytes, bytes)), p_.dtype);
    for (uint32_t i = 0; i < p_.dim; ++i) out[i] = row[i] * p_.scale;
  }
  write_f32(args[2], DType::kF32, out);
}

}  // namespace npurt::ops
