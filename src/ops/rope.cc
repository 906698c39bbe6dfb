#include "npurt/ops/rope.h"

#include <cmath>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

using isa::AluOp;
using isa::BinOp;
using isa::DType;
using isa::Reg;
using isa::Tile;
using isa::UnOp;

namespace {

constexpr char kOp[] = "rope";

}  // namespace

std::string Rope::name() const {
  std::string n = std::string(kOp) + " neox " + std::to_string(p_.n_heads) + "x" + std::to_string(p_.head_dim);
  if (rotary_dim() != p_.head_dim) n += " rot " + std::to_string(rotary_dim());
  return n;
}

Status Rope::validate() const {
  if (p_.n_heads == 0) return invalid_param(kOp, "n_heads", "must be > 0");
  if (p_.n_heads > 65535) return invalid_param(kOp, "n_heads", "must be <= 65535 (tile rows)");
  if (p_.head_dim == 0) return invalid_param(kOp, "head_dim", "must be > 0");
  if (p_.head_dim % 2 != 0) return invalid_param(kOp, "head_dim", "must be even");
  if (p_.head_dim > 65534) return invalid_param(kOp, "head_dim", "must be <= 65534");
  if (p_.rotary_dim % 2 != 0) return invalid_param(kOp, "rotary_dim", "must be even");
  if (p_.rotary_dim > p_.head_dim) return invalid_param(kOp, "rotary_dim", "must be <= head_dim");
  return Status();
}

std::vector<OpArg> Rope::signature() const {
  const uint64_t n = uint64_t{p_.n_heads} * p_.head_dim;
  return {OpArg::buffer("x", isa::Access::kIn, DType::kF32, n), OpArg::buffer("out", isa::Access::kOut, DType::kF32, n),
          OpArg::scalar("pos", DType::kI32), OpArg::scalar("base", DType::kF32)};
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
  const Target& target = ctx.target;
  const uint64_t hpt = heads_per_tile();
  NPURT_RETURN_IF_ERROR(local_fits(kOp, p_.heads_per_tile ? "heads_per_tile" : "head_dim", local_bytes(hpt), target));
  const uint64_t chunks = ceil_div(p_.n_heads, hpt);
  const uint32_t grid = grid_for(chunks, p_.cores ? p_.cores : target.cores);
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
  b.alui(AluOp::kAdd, off2, off, int64_t{half} * 4);
  b.tld(tx1, x, off, DType::kF32, stride);
  b.tld(tx2, x, off2, DType::kF32, stride);
  if (tail) {
    b.tdef(ttail, DType::kF32, heads, static_cast<int>(tail), tail_at);
    b.alui(AluOp::kAdd, scratch, off, int64_t{rot} * 4);
    b.tld(ttail, x, scratch, DType::kF32, stride);
    b.tst(ttail, out, scratch, DType::kF32, stride);
  }
  b.tbin(BinOp::kMul, tp1, tx1, tcos, isa::kBcastRow);
  b.tbin(BinOp::kMul, tp2, tx2, tsin, isa::kBcastRow);
  b.tbin(BinOp::kSub, tp1, tp1, tp2);  // x1 cos - x2 sin
  b.tst(tp1, out, off, DType::kF32, stride);
  b.tbin(BinOp::kMul, tp2, tx1, tsin, isa::kBcastRow);
  b.tbin(BinOp::kMul, tx2, tx2, tcos, isa::kBcastRow);
  b.tbin(BinOp::kAdd, tx2, tp2, tx2);  // x1 sin + x2 cos
  b.tst(tx2, out, off2, DType::kF32, stride);
  b.alui(AluOp::kMul, bytes, heads, head_bytes);
  b.alu(AluOp::kAdd, off, off, bytes);
  b.alu(AluOp::kSub, left, left, heads);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local_bytes(hpt)));
  return static_cast<uint32_t>(grid);
}

void Rope::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> x = read_f32(args[0], DType::kF32);
  const float pos = static_cast<float>(args[2].as_i64());
  const double base = args[3].as_f32();
  const uint32_t rot = rotary_dim(), half = rot / 2;
  std::vector<float> out = x;  // dimensions past rotary_dim pass through
  for (uint32_t j = 0; j < half; ++j) {
    // The angle as an f32 RoPE forms it: f32 inverse frequency times f32 position.
    const float inv_freq = static_cast<float>(std::pow(base, -2.0 * j / rot));
    const float theta = pos * inv_freq;
    const double c = std::cos(static_cast<double>(theta)), s = std::sin(static_cast<double>(theta));
    for (uint32_t h = 0; h < p_.n_heads; ++h) {
      const size_t lo = size_t{h} * p_.head_dim + j, hi = lo + half;
      out[lo] = static_cast<float>(x[lo] * c - x[hi] * s);
      out[hi] = static_cast<float>(x[lo] * s + x[hi] * c);
    }
  }
  write_f32(args[1], DType::kF32, out);
}

}  // namespace npurt::ops
