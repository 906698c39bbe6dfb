#include "npurt/ops/rope.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr char kOp[] = "rope";

struct RotationTiles {
  Tile x1, x2, p1, p2, tail, cos, sin;
};
struct RotationRegs {
  uint8_t x, out;
  Reg off, off2, stride, scratch;
};
struct RotationShape {
  uint32_t half, rot, tail, tail_at;
};

// Loads the heads at `off` (rows of head_dim, `rows` of them), rotates their two
// halves by the angle tables (one row broadcast over all rows with kBcastRow, one row
// per head without) and stores them, the unrotated tail copied through.
void emit_rotation(isa::KernelBuilder& b, const RotationTiles& t, const RotationRegs& r, Reg rows,
                   const RotationShape& sh, uint8_t bcast) {
  b.alui(AluOp::kAdd, r.off2, r.off, int64_t{sh.half} * 4);
  b.tld(t.x1, r.x, r.off, DType::kF32, r.stride);
  b.tld(t.x2, r.x, r.off2, DType::kF32, r.stride);
  if (sh.tail) {
    b.tdef(t.tail, DType::kF32, rows, static_cast<int>(sh.tail), sh.tail_at);
    b.alui(AluOp::kAdd, r.scratch, r.off, int64_t{sh.rot} * 4);
    b.tld(t.tail, r.x, r.scratch, DType::kF32, r.stride);
    b.tst(t.tail, r.out, r.scratch, DType::kF32, r.stride);
  }
  b.tbin(BinOp::kMul, t.p1, t.x1, t.cos, bcast);
  b.tbin(BinOp::kMul, t.p2, t.x2, t.sin, bcast);
  b.tbin(BinOp::kSub, t.p1, t.p1, t.p2);  // x1 cos - x2 sin
  b.tst(t.p1, r.out, r.off, DType::kF32, r.stride);
  b.tbin(BinOp::kMul, t.p2, t.x1, t.sin, bcast);
  b.tbin(BinOp::kMul, t.x2, t.x2, t.cos, bcast);
  b.tbin(BinOp::kAdd, t.x2, t.p2, t.x2);  // x1 sin + x2 cos
  b.tst(t.x2, r.out, r.off2, DType::kF32, r.stride);
}

}  // namespace

std::string Rope::name() const {
  std::string n = std::string(kOp) + " neox " + std::to_string(p_.n_heads) + "x" + std::to_string(p_.head_dim);
  if (rotary_dim() != p_.head_dim) n += " rot " + std::to_string(rotary_dim());
  if (p_.tokens) n += " tokens " + std::to_string(p_.tokens);
  if (p_.positions) n += " at positions";
  return n;
}

Status Rope::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "n_heads", p_.n_heads, 65535, "must be <= 65535 (tile rows)"));
  if (p_.head_dim == 0) return invalid_param(kOp, "head_dim", "must be > 0");
  if (p_.head_dim % 2 != 0) return invalid_param(kOp, "head_dim", "must be even");
  if (p_.head_dim > 65534) return invalid_param(kOp, "head_dim", "must be <= 65534");
  if (p_.rotary_dim % 2 != 0) return invalid_param(kOp, "rotary_dim", "must be even");
  if (p_.rotary_dim > p_.head_dim) return invalid_param(kOp, "rotary_dim", "must be <= head_dim");
  if (p_.positions && p_.tokens == 0) return invalid_param(kOp, "positions", "needs tokens > 0");
  return ok_status();
}

std::vector<ArgSpec> Rope::signature() const {
  const uint64_t n = uint64_t{p_.n_heads} * p_.head_dim * std::max<uint32_t>(1, p_.tokens);
  std::vector<ArgSpec> s{ArgSpec::buffer("x", Access::kIn, DType::kF32, n),
                         ArgSpec::buffer("out", Access::kOut, DType::kF32, n), ArgSpec::scalar("pos", DType::kI32),
                         ArgSpec::scalar("base", DType::kF32)};
  if (p_.tokens) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  if (p_.positions) s.push_back(ArgSpec::buffer("positions", Access::kIn, DType::kI32, p_.tokens));
  return s;
}

// Local layout: exponents, cos and sin (1 x half each), then per tile of heads the
// two halves, two products (heads x half each) and the unrotated tail.
uint64_t Rope::local_bytes(uint64_t heads_per_tile) const {
  const uint64_t half = rotary_dim() / 2;
  return 4 * (3 * half + heads_per_tile * (4 * half + (p_.head_dim - rotary_dim())));
}

uint64_t Rope::heads_per_tile() const {
  if (p_.heads_per_tile) return std::min<uint64_t>(p_.heads_per_tile, p_.n_heads);
  // All heads in one tile when they fit kTileElements: a token's q or k is a few
  // thousand values, too little to repay more blocks, each of which would also
  // recompute the angle table. Larger inputs are split over the cores.
  return std::max<uint64_t>(1, std::min<uint64_t>(p_.n_heads, kTileElements / p_.head_dim));
}

StatusOr<uint32_t> Rope::emit(EmitContext& ctx) const {
  if (p_.tokens) return emit_batched(ctx);
  const Target& target = ctx.target;
  const uint64_t hpt = heads_per_tile();
  NPURT_RETURN_IF_ERROR(local_fits(kOp, p_.heads_per_tile ? "heads_per_tile" : "head_dim", local_bytes(hpt), target));
  const uint64_t chunks = ceil_div(p_.n_heads, hpt);
  const uint32_t grid = grid_for(chunks, cores_of(p_.cores, target));
  const uint32_t rot = rotary_dim(), half = rot / 2, tail = p_.head_dim - rot;
  const int64_t head_bytes = int64_t{p_.head_dim} * 4;
  const uint32_t table_bytes = half * 4, part_bytes = static_cast<uint32_t>(hpt * half * 4);
  const uint32_t x1_at = 3 * table_bytes, x2_at = x1_at + part_bytes, p1_at = x2_at + part_bytes,
                 p2_at = p1_at + part_bytes, tail_at = p2_at + part_bytes;

  // e_j = -2j / r: exact for the power-of-two r of real models.
  std::vector<float> exponents(half);
  for (uint32_t j = 0; j < half; ++j) exponents[j] = static_cast<float>(-2.0 * j / rot);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t x = ctx.arg("x");
  const uint8_t out = ctx.arg("out");
  const uint8_t pos_arg = ctx.arg("pos");
  const uint8_t base_arg = ctx.arg("base");
  const uint32_t exponents_at = b.add_constant_values(std::span<const float>(exponents));
  const Reg bid{0}, first{1}, count{2}, off{3}, left{4}, heads{5}, bytes{6}, stride{7}, scratch{8}, pos{9},
      off2{10};
  const Tile te{0}, tcos{1}, tsin{2}, tx1{3}, tx2{4}, tp1{5}, tp2{6}, ttail{7};

  // Angles, once per block: theta_j = pos * exp(e_j * log(base)).
  b.tdef(te, DType::kF32, 1, static_cast<int>(half), 0);
  b.tdef(tcos, DType::kF32, 1, static_cast<int>(half), table_bytes);
  b.tdef(tsin, DType::kF32, 1, static_cast<int>(half), 2 * table_bytes);
  b.li(scratch, exponents_at);
  b.tld(te, isa::kConstArg, scratch, DType::kF32);
  b.arg_value(scratch, base_arg);
  b.tfill(tcos, scratch);
  b.tun(UnOp::kLog, tcos, tcos);
  b.tbin(BinOp::kMul, tcos, tcos, te);
  b.tun(UnOp::kExp, tcos, tcos);
  b.arg_value(pos, pos_arg);
  b.i2f(pos, pos);
  b.tsop(BinOp::kMul, tcos, tcos, pos);
  b.tun(UnOp::kSin, tsin, tcos);
  b.tun(UnOp::kCos, tcos, tcos);

  // Heads in tiles: each half is a strided (heads x half) view of the heads.
  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(chunks), grid, first, count);
  b.li(stride, p_.head_dim);
  b.alui(AluOp::kMul, off, first, static_cast<int64_t>(hpt) * head_bytes);
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(hpt));
  b.alui(AluOp::kAdd, left, left, p_.n_heads);
  b.loop_begin(count);
  b.alui(AluOp::kMin, heads, left, static_cast<int64_t>(hpt));  // the last tile may be short
  b.tdef(tx1, DType::kF32, heads, static_cast<int>(half), x1_at);
  b.tdef(tx2, DType::kF32, heads, static_cast<int>(half), x2_at);
  b.tdef(tp1, DType::kF32, heads, static_cast<int>(half), p1_at);
  b.tdef(tp2, DType::kF32, heads, static_cast<int>(half), p2_at);
  emit_rotation(b, {tx1, tx2, tp1, tp2, ttail, tcos, tsin}, {x, out, off, off2, stride, scratch}, heads,
                {half, rot, tail, static_cast<uint32_t>(tail_at)}, isa::kBcastRow);
  emit_advance(b, off, heads, head_bytes, bytes);
  b.alu(AluOp::kSub, left, left, heads);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local_bytes(hpt)));
  return static_cast<uint32_t>(grid);
}

// Local layout of the batched form: exponents and inverse frequencies (1 x half),
// then per tile of rows (tokens x heads) the positions (rows x 1), cos, sin, the two
// halves, two products (rows x half each) and the unrotated tail.
uint64_t Rope::tokens_per_tile(const Target& target) const {
  const uint64_t half = rotary_dim() / 2;
  const uint64_t row_bytes = 4 * (1 + 6 * half + (p_.head_dim - rotary_dim()));
  const uint64_t fixed = 4 * 2 * half + 64;
  const uint64_t fit = target.local_bytes > fixed ? (target.local_bytes - fixed) / (row_bytes * p_.n_heads) : 0;
  // Enough rows per tile to amortize each instruction, at most kTileElements * 4.
  const uint64_t want = std::max<uint64_t>(1, 4 * kTileElements / (half * p_.n_heads));
  return std::max<uint64_t>(1, std::min({fit, want, uint64_t{p_.tokens}}));
}

StatusOr<uint32_t> Rope::emit_batched(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t tpt = tokens_per_tile(target);
  const uint64_t rpt = tpt * p_.n_heads;
  const uint32_t rot = rotary_dim(), half = rot / 2, tail = p_.head_dim - rot;
  const uint32_t table = half * 4, part = static_cast<uint32_t>(rpt * half * 4);
  const uint32_t inv_at = table, pos_at = 2 * table, cos_at = static_cast<uint32_t>(pos_at + align64(rpt * 4)),
                 sin_at = cos_at + part, x1_at = sin_at + part, x2_at = x1_at + part, p1_at = x2_at + part,
                 p2_at = p1_at + part, tail_at = p2_at + part;
  const uint32_t slot_at = static_cast<uint32_t>(align64(tail_at + rpt * tail * 4));  // an i32 position
  const uint64_t local = p_.positions ? slot_at + 4 : tail_at + rpt * tail * 4;
  NPURT_RETURN_IF_ERROR(local_fits(kOp, "head_dim", local, target));
  const uint32_t grid = grid_for(ceil_div(p_.tokens, tpt), cores_of(p_.cores, target));
  const int64_t head_bytes = int64_t{p_.head_dim} * 4;

  std::vector<float> exponents(half);
  for (uint32_t j = 0; j < half; ++j) exponents[j] = static_cast<float>(-2.0 * j / rot);
  std::vector<float> token_of_row(rpt);  // row r of a tile is token r / n_heads of it
  for (uint64_t r = 0; r < rpt; ++r) token_of_row[r] = static_cast<float>(r / p_.n_heads);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t x = ctx.arg("x"), out = ctx.arg("out");
  const uint32_t exponents_at = b.add_constant_values(std::span<const float>(exponents));
  const uint32_t rows_const_at = b.add_constant_values(std::span<const float>(token_of_row));
  const Reg bid{0}, first{1}, count{2}, total{3}, tiles{4}, per{5}, left{6}, rows{7}, off{8}, off2{9}, stride{10},
      scratch{11}, tok{12}, pos{13}, bytes{14}, toks{15}, view{16}, at{17}, zero{18};
  const Tile te{0}, tinv{1}, tpos{2}, tcos{3}, tsin{4}, tx1{5}, tx2{6}, tp1{7}, tp2{8}, ttail{9}, tview{10}, tslot{11};

  // Inverse frequencies, once per block, as the one-token form computes them.
  b.tdef(te, DType::kF32, 1, static_cast<int>(half), 0);
  b.tdef(tinv, DType::kF32, 1, static_cast<int>(half), inv_at);
  b.li(scratch, exponents_at);
  b.tld(te, isa::kConstArg, scratch, DType::kF32);
  b.arg_value(scratch, ctx.arg("base"));
  b.tfill(tinv, scratch);
  b.tun(UnOp::kLog, tinv, tinv);
  b.tbin(BinOp::kMul, tinv, tinv, te);
  b.tun(UnOp::kExp, tinv, tinv);

  b.block_id(bid);
  emit_row_tiles(b, ctx, true, p_.tokens, 1, tpt, grid, {bid, total, tiles, per, first, count});
  b.alui(AluOp::kMul, tok, first, static_cast<int64_t>(tpt));  // first token of the tile
  b.alu(AluOp::kSub, left, total, tok);
  b.alui(AluOp::kMul, left, left, p_.n_heads);  // rows from the tile on
  b.alui(AluOp::kMul, off, tok, int64_t{p_.n_heads} * head_bytes);
  b.li(stride, p_.head_dim);
  if (p_.positions) {
    b.li(zero, 0);
    b.tdef(tslot, DType::kI32, 1, 1, slot_at);
  } else {
    b.arg_value(pos, ctx.arg("pos"));
  }
  b.loop_begin(count);
  b.alui(AluOp::kMin, rows, left, static_cast<int64_t>(rpt));  // the last tile may be short
  b.tdef(tpos, DType::kF32, rows, 1, pos_at);
  b.tdef(tcos, DType::kF32, rows, static_cast<int>(half), cos_at);
  b.tdef(tsin, DType::kF32, rows, static_cast<int>(half), sin_at);
  b.tdef(tx1, DType::kF32, rows, static_cast<int>(half), x1_at);
  b.tdef(tx2, DType::kF32, rows, static_cast<int>(half), x2_at);
  b.tdef(tp1, DType::kF32, rows, static_cast<int>(half), p1_at);
  b.tdef(tp2, DType::kF32, rows, static_cast<int>(half), p2_at);
  if (p_.positions) {
    // Each token's heads get f32(positions[token]), as the one-token form's i2f.
    b.alui(AluOp::kDiv, toks, rows, p_.n_heads);
    b.li(view, 0);
    b.alui(AluOp::kMul, at, tok, 4);
    b.loop_begin(toks);
    b.tdef(tview, DType::kF32, static_cast<int>(p_.n_heads), 1, pos_at, view);
    b.tld(tslot, ctx.arg("positions"), at, DType::kI32);
    b.tget(scratch, tslot, zero);
    b.i2f(scratch, scratch);
    b.tfill(tview, scratch);
    b.alui(AluOp::kAdd, view, view, int64_t{p_.n_heads} * 4);
    b.alui(AluOp::kAdd, at, at, 4);
    b.loop_end();
  } else {
    // Row positions pos + token: exact in f32 below 2^24.
    b.li(scratch, rows_const_at);
    b.tld(tpos, isa::kConstArg, scratch, DType::kF32);
    b.alu(AluOp::kAdd, scratch, pos, tok);
    b.i2f(scratch, scratch);
    b.tsop(BinOp::kAdd, tpos, tpos, scratch);
  }
  b.tbcast(tcos, tinv, isa::kBcastRow);
  b.tbin(BinOp::kMul, tcos, tcos, tpos, isa::kBcastCol);
  b.tun(UnOp::kSin, tsin, tcos);
  b.tun(UnOp::kCos, tcos, tcos);
  emit_rotation(b, {tx1, tx2, tp1, tp2, ttail, tcos, tsin}, {x, out, off, off2, stride, scratch}, rows,
                {half, rot, tail, static_cast<uint32_t>(tail_at)}, isa::kBcastNone);
  emit_advance(b, off, rows, head_bytes, bytes);
  b.alu(AluOp::kSub, left, left, rows);
  b.alui(AluOp::kAdd, tok, tok, static_cast<int64_t>(tpt));
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local));
  return grid;
}

void Rope::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> x = read_f32(args[0], DType::kF32);
  const int64_t pos0 = args[2].as_i64();
  const double base = args[3].as_f32();
  const int64_t tokens = p_.tokens ? std::clamp<int64_t>(args[4].as_i64(), 0, p_.tokens) : 1;
  const uint32_t rot = rotary_dim(), half = rot / 2;
  std::vector<float> out = p_.tokens ? read_f32(args[1], DType::kF32) : x;
  std::vector<int32_t> positions;
  if (p_.positions) {
    positions.resize(p_.tokens);
    std::memcpy(positions.data(), args[5].bytes.data(), positions.size() * 4);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const float pos = static_cast<float>(p_.positions ? positions[t] : pos0 + t);
    const size_t at = static_cast<size_t>(t) * p_.n_heads * p_.head_dim;
    for (uint32_t h = 0; h < p_.n_heads; ++h) {  // dimensions past rotary_dim pass through
      for (uint32_t i = rot; i < p_.head_dim; ++i) out[at + size_t{h} * p_.head_dim + i] = x[at + size_t{h} * p_.head_dim + i];
    }
    for (uint32_t j = 0; j < half; ++j) {
      // The angle as an f32 RoPE forms it: f32 inverse frequency times f32 position.
      const float inv_freq = static_cast<float>(std::pow(base, -2.0 * j / rot));
      const float theta = pos * inv_freq;
      const double c = std::cos(static_cast<double>(theta)), s = std::sin(static_cast<double>(theta));
      for (uint32_t h = 0; h < p_.n_heads; ++h) {
        const size_t lo = at + size_t{h} * p_.head_dim + j, hi = lo + half;
        out[lo] = static_cast<float>(x[lo] * c - x[hi] * s);
        out[hi] = static_cast<float>(x[lo] * s + x[hi] * c);
      }
    }
  }
  write_f32(args[1], DType::kF32, out);
}

}  // namespace npurt::ops
