#include "npurt/ops/prefill_attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"
#include "ops/attention_common.h"

namespace npurt::ops {

namespace {

constexpr const char* kOp = "prefill_attention";
constexpr uint32_t kMaxTileQ = 16;

// Key tiles below the diagonal that need no mask are taken this many at a time (as
// one tile of that many times tile_q positions) where local memory allows: each tile
// folds into the running softmax once, rescaling the whole output tile, and the
// value product's output is read and written once per tile, so wider tiles cost less
// per key (a 512-token chunk of Gemma's attention: 3.4 -> 2.9-3.0 ms, docs/models.md).
constexpr uint64_t kMaxTilesAtOnce = 4;

// Local memory of one work unit: rows = tile_q x group query rows; key tiles of up to
// `keys` positions (tile_q times the tiles taken at once).
struct Layout {
  uint64_t rows = 0, tq = 0, dim = 0, kv_esize = 4, keys = 0;
  uint64_t q() const { return 0; }
  uint64_t o() const { return align64(rows * dim * 4); }
  uint64_t stat(int i) const { return o() + align64(rows * dim * 4) + align64(rows * 4) * i; }
  uint64_t scores() const { return stat(kNumStats); }
  uint64_t mask() const { return scores() + align64(rows * keys * 4); }
  uint64_t kv() const { return mask() + align64(rows * tq * 4); }
  uint64_t end() const { return kv() + keys * dim * kv_esize; }
  static constexpr int kNumStats = 5;  // running max, tile max, rescale, running sum, tile sum
};

// Scalar and tile registers of the kernel.
constexpr Reg kBlock{0}, kUnit{1}, kUnitCount{2}, kPos{3}, kRows{4}, kTmp{5}, kTmp2{6}, kI0{7}, kTokens{8},
    kQRows{9}, kP0{10}, kQOff{11}, kKvOff{12}, kCols{13}, kMaskOff{14}, kFull{15}, kLastCount{16}, kMHi{17},
    kClip{18}, kQStride{19}, kKvStride{20}, kScale{21}, kNegInf{22}, kZero{23}, kMaskStride{24}, kGroupOff{25},
    kUnits{26}, kWide{27}, kTiles{28}, kNarrow{29};
constexpr Tile kQWide{0}, kQ{1}, kO{2}, kOWide{3}, kMax{4}, kTileMax{5}, kRescale{6}, kSum{7}, kTileSum{8},
    kScores{9}, kMask{10}, kKv{11};

// Faults the block (integer division by zero) unless `value` >= 0. Clobbers kTmp2.
void emit_fault_if_negative(isa::KernelBuilder& b, Reg value) {
  b.alui(AluOp::kAdd, kTmp2, value, 1);
  b.alui(AluOp::kMax, kTmp2, kTmp2, 0);
  b.alui(AluOp::kMin, kTmp2, kTmp2, 1);  // 1 iff value >= 0
  b.li(kTmp, 1);
  b.alu(AluOp::kDiv, kTmp, kTmp, kTmp2);
}

}  // namespace

// The largest divisor of the window (any size without one) up to kMaxTileQ tokens.
uint32_t PrefillAttention::tile_q() const {
  if (p_.tile_q) return p_.tile_q;
  const uint32_t limit = std::min(kMaxTileQ, p_.tokens);
  if (!p_.window) return limit;
  for (uint32_t d = limit; d > 1; --d) {
    if (p_.window % d == 0) return d;
  }
  return 1;
}

std::string PrefillAttention::name() const {
  return attention_name(kOp, p_, " tokens" + std::to_string(p_.tokens));
}

Status PrefillAttention::validate() const {
  if (p_.n_heads == 0) return invalid_param(kOp, "n_heads", "must be > 0");
  NPURT_RETURN_IF_ERROR(check_kv_heads(kOp, p_));
  if (p_.head_dim == 0) return invalid_param(kOp, "head_dim", "must be > 0");
  if (uint64_t{p_.head_dim} * (p_.n_heads / p_.n_kv_heads) > 65535) {
    return invalid_param(kOp, "head_dim", "times the query heads per kv head must be <= 65535 (one tile row)");
  }
  NPURT_RETURN_IF_ERROR(check_max_len(kOp, p_, "positions are i32"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "tokens", p_.tokens, p_.max_len, "must be <= max_len"));
  NPURT_RETURN_IF_ERROR(check_scale_and_kv_dtype(kOp, p_));
  if (p_.tile_q) {
    if (p_.tile_q > p_.tokens) return invalid_param(kOp, "tile_q", "must be <= tokens");
    if (p_.window && p_.window % p_.tile_q != 0) return invalid_param(kOp, "tile_q", "must divide window");
  }
  return ok_status();
}

std::vector<ArgSpec> PrefillAttention::signature() const {
  std::vector<ArgSpec> s = attention_buffers(p_, uint64_t{p_.tokens} * p_.n_heads * p_.head_dim);
  s.push_back(ArgSpec::scalar("pos", DType::kI32));
  s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

StatusOr<uint32_t> PrefillAttention::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint32_t group = p_.n_heads / p_.n_kv_heads;
  const uint64_t tq = tile_q();
  Layout lay{tq * group, tq, p_.head_dim, isa::dtype_size(p_.kv_dtype), tq};
  for (uint64_t at_once = kMaxTilesAtOnce; at_once > 1; at_once /= 2) {
    Layout wide = lay;
    wide.keys = tq * at_once;
    if (wide.end() <= target.local_bytes) {
      lay = wide;
      break;
    }
  }
  const int64_t at_once = static_cast<int64_t>(lay.keys / tq);
  NPURT_RETURN_IF_ERROR(local_fits(kOp, p_.tile_q ? "tile_q" : "head_dim", lay.end(), target));
  const uint64_t max_units = ceil_div(p_.tokens, tq) * p_.n_kv_heads;
  const uint32_t grid = grid_for(max_units, cores_of(p_.cores, target));
  const int64_t pos_bytes = int64_t{p_.n_kv_heads} * p_.head_dim * static_cast<int64_t>(lay.kv_esize);
  const int64_t token_q_bytes = int64_t{p_.n_heads} * p_.head_dim * 4;
  const int64_t itq = static_cast<int64_t>(tq);
  const float scale = attention_scale(p_);

  // Additive masks, rows x tq each, row r being query token r / group of the tile:
  // causal (diagonal tile: key c is after token a when c > a), window edge (key c is
  // out of the window of token a when c <= a) and none.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> masks(3 * lay.rows * tq, 0.0f);
  for (uint64_t r = 0; r < lay.rows; ++r) {
    const uint64_t a = r / group;
    for (uint64_t c = 0; c < tq; ++c) {
      masks[r * tq + c] = c > a ? -inf : 0.0f;
      masks[(lay.rows + r) * tq + c] = c <= a ? -inf : 0.0f;
    }
  }

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t q = ctx.arg("q"), k_cache = ctx.arg("k_cache"), v_cache = ctx.arg("v_cache"), out = ctx.arg("out");
  const uint32_t causal_at = b.add_constant_values(std::span<const float>(masks));
  const int64_t window_at = causal_at + static_cast<int64_t>(lay.rows * tq * 4);
  const int64_t none_at = window_at + static_cast<int64_t>(lay.rows * tq * 4);

  // Launch-wide values and the guard: 0 <= pos and pos + rows <= max_len.
  b.arg_value(kPos, ctx.arg("pos"));
  b.alui(AluOp::kShl, kPos, kPos, 32);  // the scalars' low 32 bits, sign-extended
  b.alui(AluOp::kShr, kPos, kPos, 32);
  b.arg_value(kRows, ctx.arg(kRowsScalar));
  b.alui(AluOp::kShl, kRows, kRows, 32);
  b.alui(AluOp::kShr, kRows, kRows, 32);
  emit_fault_if_negative(b, kPos);
  b.li(kTmp, p_.max_len);
  b.alu(AluOp::kSub, kTmp, kTmp, kPos);
  b.alu(AluOp::kSub, kTmp, kTmp, kRows);
  emit_fault_if_negative(b, kTmp);
  b.li(kQStride, int64_t{p_.n_heads} * p_.head_dim);
  b.li(kKvStride, int64_t{p_.n_kv_heads} * p_.head_dim);
  b.li(kMaskStride, itq);
  b.li(kScale, f32_bits(scale));
  b.li(kNegInf, f32_bits(-inf));
  b.li(kZero, 0);

  b.block_id(kBlock);
  emit_ceil_div(b, kTiles, kRows, itq);
  b.alui(AluOp::kMul, kUnits, kTiles, p_.n_kv_heads);
  // A query tile's keys grow with its index (causal): block b takes units b, b + grid, ...
  emit_strided_count_at_run_time(b, kBlock, kUnits, grid, kUnitCount);
  b.mov(kUnit, kBlock);

  const auto def_rows = [&](Tile t, Reg rows, int cols, uint64_t at) {
    b.tdef(t, DType::kF32, rows, cols, static_cast<uint32_t>(at));
  };
  // One key tile of kCols positions at kKvOff: scores of every row, plus the mask at
  // kMaskOff when `masked`, folded into the running softmax.
  const auto emit_key_tile = [&](bool masked) {
    b.tdef(kKv, p_.kv_dtype, kCols, static_cast<int>(p_.head_dim), static_cast<uint32_t>(lay.kv()));
    b.tdef(kScores, DType::kF32, kQRows, kCols, static_cast<uint32_t>(lay.scores()));
    b.tld(kKv, k_cache, kKvOff, p_.kv_dtype, kKvStride);
    b.tmma(kScores, kQ, kKv, isa::kTransB);
    if (masked) {
      b.tdef(kMask, DType::kF32, kQRows, kCols, static_cast<uint32_t>(lay.mask()));
      b.tld(kMask, isa::kConstArg, kMaskOff, DType::kF32, kMaskStride);
      b.tbin(BinOp::kAdd, kScores, kScores, kMask);
    }
    emit_online_softmax_fold(b, {kMax, kTileMax, kRescale, kSum, kTileSum, kScores, kO});
    b.tld(kKv, v_cache, kKvOff, p_.kv_dtype, kKvStride);
    b.tmma(kO, kScores, kKv, isa::kAccumulate);
  };
  // kKvOff = position `pos_reg` of the unit's kv head.
  const auto kv_at = [&](Reg pos_reg) {
    b.alui(AluOp::kMul, kKvOff, pos_reg, pos_bytes);
    b.alu(AluOp::kAdd, kKvOff, kKvOff, kGroupOff);
  };

  b.loop_begin(kUnitCount);
  // Unit u: query tile u / n_kv of tokens [i0, i0 + tokens), kv head u % n_kv.
  b.alui(AluOp::kDiv, kI0, kUnit, p_.n_kv_heads);
  b.alui(AluOp::kMul, kI0, kI0, itq);
  b.alui(AluOp::kRem, kGroupOff, kUnit, p_.n_kv_heads);
  b.alui(AluOp::kMul, kQOff, kGroupOff, int64_t{group} * p_.head_dim * 4);
  b.alui(AluOp::kMul, kGroupOff, kGroupOff, int64_t{p_.head_dim} * static_cast<int64_t>(lay.kv_esize));
  b.alu(AluOp::kSub, kTokens, kRows, kI0);
  b.alui(AluOp::kMin, kTokens, kTokens, itq);
  b.alui(AluOp::kMul, kQRows, kTokens, group);
  b.alu(AluOp::kAdd, kP0, kPos, kI0);
  emit_advance(b, kQOff, kI0, token_q_bytes, kTmp);
  // The unit's queries: tokens x (group heads of dim) in GM, the same bytes as
  // (tokens * group) x dim rows locally.
  b.tdef(kQWide, DType::kF32, kTokens, static_cast<int>(group * p_.head_dim), static_cast<uint32_t>(lay.q()));
  def_rows(kQ, kQRows, static_cast<int>(p_.head_dim), lay.q());
  def_rows(kO, kQRows, static_cast<int>(p_.head_dim), lay.o());
  b.tdef(kOWide, DType::kF32, kTokens, static_cast<int>(group * p_.head_dim), static_cast<uint32_t>(lay.o()));
  const Tile stats[Layout::kNumStats] = {kMax, kTileMax, kRescale, kSum, kTileSum};
  for (int i = 0; i < Layout::kNumStats; ++i) def_rows(stats[i], kQRows, 1, lay.stat(i));
  b.tld(kQWide, q, kQOff, DType::kF32, kQStride);
  if (scale != 1.0f) b.tsop(BinOp::kMul, kQ, kQ, kScale);
  b.tfill(kO, kZero);
  b.tfill(kSum, kZero);
  b.tfill(kMax, kNegInf);

  // The diagonal tile [P0, P0 + tokens), causal mask.
  kv_at(kP0);
  b.mov(kCols, kTokens);
  b.li(kMaskOff, causal_at);
  emit_key_tile(true);

  // m_hi = ceil(P0 / tq) key tiles below the diagonal reach position 0; the window
  // keeps at most window / tq of them.
  emit_ceil_div(b, kMHi, kP0, itq);
  if (p_.window) b.alui(AluOp::kMin, kMHi, kMHi, static_cast<int64_t>(p_.window / tq));
  // Tiles 1 .. m_hi - 1: whole, in the window, unmasked; at_once of them at a time
  // (one tile of at_once * tq positions), going down from the diagonal, then the
  // remaining ones alone.
  b.alui(AluOp::kSub, kFull, kMHi, 1);
  b.alui(AluOp::kMax, kFull, kFull, 0);
  b.alui(AluOp::kSub, kTmp, kP0, at_once * itq);
  kv_at(kTmp);
  if (at_once > 1) {
    b.alui(AluOp::kDiv, kWide, kFull, at_once);
    b.alui(AluOp::kRem, kNarrow, kFull, at_once);
    b.li(kCols, at_once * itq);
    b.loop_begin(kWide);
    emit_key_tile(false);
    b.alui(AluOp::kSub, kKvOff, kKvOff, at_once * itq * pos_bytes);
    b.loop_end();
    // From the start of the next wide tile to the start of the next narrow one.
    b.alui(AluOp::kAdd, kKvOff, kKvOff, (at_once - 1) * itq * pos_bytes);
  } else {
    b.mov(kNarrow, kFull);
  }
  b.li(kCols, itq);
  b.loop_begin(kNarrow);
  emit_key_tile(false);
  b.alui(AluOp::kSub, kKvOff, kKvOff, itq * pos_bytes);
  b.loop_end();

  // Tile m_hi (if any): starts at P0 - m_hi * tq, cut at position 0 (clip columns),
  // with the window mask when it is the window's edge tile, else the zero mask.
  b.alui(AluOp::kMin, kLastCount, kMHi, 1);
  b.loop_begin(kLastCount);
  b.alui(AluOp::kMul, kTmp, kMHi, -itq);
  b.alu(AluOp::kAdd, kTmp, kTmp, kP0);  // start, maybe negative
  b.li(kClip, 0);
  b.alu(AluOp::kSub, kClip, kClip, kTmp);
  b.alui(AluOp::kMax, kClip, kClip, 0);
  b.alui(AluOp::kMax, kTmp, kTmp, 0);
  kv_at(kTmp);
  b.li(kCols, itq);
  b.alu(AluOp::kSub, kCols, kCols, kClip);
  if (p_.window) {
    // edge = 1 iff m_hi == window / tq (m_hi never exceeds it).
    b.li(kTmp, static_cast<int64_t>(p_.window / tq));
    b.alu(AluOp::kSub, kTmp, kTmp, kMHi);
    b.alui(AluOp::kMin, kTmp, kTmp, 1);
    b.alui(AluOp::kMul, kTmp, kTmp, none_at - window_at);  // 0 at the edge, else the distance to none
    b.alui(AluOp::kAdd, kMaskOff, kTmp, window_at);
  } else {
    b.li(kMaskOff, none_at);
  }
  emit_advance(b, kMaskOff, kClip, 4, kTmp);
  emit_key_tile(true);
  b.loop_end();

  b.tbin(BinOp::kDiv, kO, kO, kSum, isa::kBcastCol);
  b.tst(kOWide, out, kQOff, DType::kF32, kQStride);
  b.alui(AluOp::kAdd, kUnit, kUnit, grid);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(lay.end()));
  return grid;
}

void PrefillAttention::compute_reference(std::span<const HostArg> args) const {
  const uint64_t H = p_.n_heads, D = p_.head_dim, KV = p_.n_kv_heads;
  const int64_t pos = static_cast<int32_t>(args[4].as_i64());
  const int64_t rows = static_cast<int32_t>(args[5].as_i64());
  std::vector<float> out = read_f32(args[3], DType::kF32);
  if (pos < 0 || rows < 0 || rows > static_cast<int64_t>(p_.tokens) || pos + rows > static_cast<int64_t>(p_.max_len)) {
    std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());  // the kernel faults
    write_f32(args[3], DType::kF32, out);
    return;
  }
  const std::vector<float> q = read_f32(args[0], DType::kF32);
  const std::vector<float> k = read_f32(args[1], p_.kv_dtype);
  const std::vector<float> v = read_f32(args[2], p_.kv_dtype);
  const double scale = attention_scale(p_);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t len = pos + i + 1;
    const int64_t first = p_.window ? std::max<int64_t>(0, len - p_.window) : 0;
    for (uint64_t h = 0; h < H; ++h) {
      const uint64_t at = (i * H + h) * D;
      attend_reference(p_, &q[at], k, v, h / (H / KV), first, len, scale, &out[at]);
    }
  }
  write_f32(args[3], DType::kF32, out);
}

}  // namespace npurt::ops
