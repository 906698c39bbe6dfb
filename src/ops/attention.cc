#include "npurt/ops/attention.h"

#include <algorithm>
#include <limits>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"
#include "ops/attention_common.h"

namespace npurt::ops {

namespace {

constexpr const char* kOp = "decode_attention";

// One block's work unit is a sub-group of `heads` query heads of one kv group; its
// tiles hold `positions` (tile_t) positions.
using Layout = AttentionUnitLayout;

// The largest divisor d of `group` with kv_heads * d <= cores: how many sub-groups each
// kv group's query heads are split into so that the units fill the cores.
uint32_t subgroups_for(uint32_t group, uint32_t kv_heads, uint32_t cores) {
  uint32_t best = 1;
  for (uint32_t d = 1; d <= group; ++d) {
    if (group % d == 0 && uint64_t{kv_heads} * d <= cores) best = d;
  }
  return best;
}

// Faults the block (integer division by zero) unless 1 <= len <= max_len, so an
// out-of-range len never reaches a cache access. Clobbers `t0` and `t1`.
void emit_len_guard(isa::KernelBuilder& b, Reg len, int64_t max_len, Reg t0, Reg t1) {
  b.alui(AluOp::kMax, t0, len, 0);
  b.alui(AluOp::kMin, t0, t0, 1);  // 1 iff len >= 1
  b.li(t1, max_len + 1);
  b.alu(AluOp::kSub, t1, t1, len);
  b.alui(AluOp::kMax, t1, t1, 0);
  b.alui(AluOp::kMin, t1, t1, 1);  // 1 iff len <= max_len
  b.alu(AluOp::kMul, t0, t0, t1);
  b.li(t1, 1);
  b.alu(AluOp::kDiv, t0, t1, t0);
}

// Bytes between consecutive positions of a cache.
int64_t position_bytes(const DecodeAttentionParams& p) {
  return int64_t{p.n_kv_heads} * p.head_dim * static_cast<int64_t>(isa::dtype_size(p.kv_dtype));
}

// Scalar registers and tile registers of the kernel.
constexpr Reg kBlock{0}, kUnit{1}, kUnitCount{2}, kLen{3}, kTmp{4}, kFirstPos{5}, kTiles{6}, kQOff{7}, kKvOff{8},
    kLeft{9}, kRows{10}, kStride{11}, kScale{12}, kNegInf{13}, kZero{14}, kPositions{15}, kFirstPosBytes{16};
// Of several queries: the block's first unit and the query loop.
constexpr Reg kUnitFirst{17}, kQuery{18}, kQueries{19}, kLenFirst{20}, kQueryOff{21};
constexpr Tile kQ{0}, kO{1}, kMax{2}, kTileMax{3}, kRescale{4}, kSum{5}, kTileSum{6}, kScores{7}, kKv{8};

struct Plan {
  Layout lay;
  uint32_t subgroups = 1;  // query sub-groups per kv group
  int64_t units = 0;       // work units: kv heads x sub-groups
  uint32_t grid = 1;
};

StatusOr<Plan> plan_for(const DecodeAttentionParams& p, const Target& target) {
  const uint32_t cores = cores_of(p.cores, target);
  const uint32_t group = p.n_heads / p.n_kv_heads;
  Plan plan;
  plan.subgroups = subgroups_for(group, p.n_kv_heads, cores);
  plan.units = int64_t{p.n_kv_heads} * plan.subgroups;
  plan.grid = grid_for(plan.units, cores);
  Layout& lay = plan.lay;
  lay = {group / plan.subgroups, p.head_dim, 0, static_cast<uint32_t>(isa::dtype_size(p.kv_dtype))};
  if (lay.fixed_bytes() + lay.per_position_bytes() > target.local_bytes) {
    return invalid_param(kOp, "head_dim", "is too large for local memory");
  }
  if (p.tile_t == 0) {
    // As many positions per tile as fit: fewer, larger instructions.
    const uint64_t fit = (target.local_bytes - lay.fixed_bytes()) / lay.per_position_bytes();
    lay.positions = static_cast<uint32_t>(std::min<uint64_t>(fit, p.max_len));
    return plan;
  }
  lay.positions = p.tile_t;
  if (lay.kv_end() > target.local_bytes) {
    return invalid_param(kOp, "tile_t",
                         "needs " + std::to_string(lay.kv_end()) + " bytes of local memory, cores have " +
                             std::to_string(target.local_bytes));
  }
  return plan;
}

// Reads len, faults unless 1 <= len <= max_len, and leaves the attended positions
// [kFirstPos, len) in registers: kPositions of them in kTiles tiles of `tile_t`,
// starting kFirstPosBytes into a cache.
void emit_len(isa::KernelBuilder& b, uint8_t len_arg, Reg to) {
  b.arg_value(to, len_arg);
  b.alui(AluOp::kShl, to, to, 32);  // the scalar's low 32 bits, sign-extended: the i32 value
  b.alui(AluOp::kShr, to, to, 32);
}

// Faults unless 1 <= len <= max_len, then first = the first attended position of
// len (max(0, len - window), or 0). Clobbers `tmp`.
void emit_guarded_first(isa::KernelBuilder& b, const DecodeAttentionParams& p, Reg len, Reg first, Reg tmp) {
  emit_len_guard(b, len, p.max_len, tmp, first);
  if (p.window) {
    b.alui(AluOp::kSub, first, len, p.window);
    b.alui(AluOp::kMax, first, first, 0);
  } else {
    b.li(first, 0);
  }
}

// As emit_position_range for the len already in kLen.
void emit_range_of_len(isa::KernelBuilder& b, const DecodeAttentionParams& p, int64_t tile_t) {
  emit_guarded_first(b, p, kLen, kFirstPos, kTmp);
  b.alu(AluOp::kSub, kPositions, kLen, kFirstPos);
  b.alui(AluOp::kAdd, kTiles, kPositions, tile_t - 1);
  b.alui(AluOp::kDiv, kTiles, kTiles, tile_t);
  b.alui(AluOp::kMul, kFirstPosBytes, kFirstPos, position_bytes(p));
}

void emit_position_range(isa::KernelBuilder& b, const DecodeAttentionParams& p, uint8_t len_arg, int64_t tile_t) {
  emit_len(b, len_arg, kLen);
  emit_range_of_len(b, p, tile_t);
}

// Queries, output accumulator and per-head statistics: fixed shapes for the kernel.
void emit_static_tiles(isa::KernelBuilder& b, const Layout& lay) {
  const auto def = [&](Tile t, uint32_t rows, uint32_t cols, uint64_t off) {
    b.tdef(t, DType::kF32, static_cast<int>(rows), static_cast<int>(cols), static_cast<uint32_t>(off));
  };
  def(kQ, lay.heads, lay.dim, lay.q());
  def(kO, lay.heads, lay.dim, lay.o());
  const Tile stats[Layout::kNumStats] = {kMax, kTileMax, kRescale, kSum, kTileSum};
  for (int i = 0; i < Layout::kNumStats; ++i) def(stats[i], lay.heads, 1, lay.stat(i));
}

// One tile of positions (kRows = min(kLeft, tile_t) of them at kKvOff) folded into the
// running softmax: m_new = max(m, rowmax(s)); what was accumulated under m is rescaled
// by exp(m - m_new), then this tile's exp(s - m_new) weights are added.
void emit_tile(isa::KernelBuilder& b, const DecodeAttentionParams& p, const Layout& lay, uint8_t k_cache,
               uint8_t v_cache) {
  const int64_t tile_t = lay.positions;
  b.alui(AluOp::kMin, kRows, kLeft, tile_t);  // the last tile may be short
  b.tdef(kKv, p.kv_dtype, kRows, static_cast<int>(lay.dim), static_cast<uint32_t>(lay.kv()));
  b.tdef(kScores, DType::kF32, static_cast<int>(lay.heads), kRows, static_cast<uint32_t>(lay.scores()));
  b.tld(kKv, k_cache, kKvOff, p.kv_dtype, kStride);
  b.tmma(kScores, kQ, kKv, isa::kTransB);  // every head of the unit against the tile
  emit_online_softmax_fold(b, {kMax, kTileMax, kRescale, kSum, kTileSum, kScores, kO});
  b.tld(kKv, v_cache, kKvOff, p.kv_dtype, kStride);  // V replaces K: the scores are computed
  b.tmma(kO, kScores, kKv, isa::kAccumulate);
  b.alui(AluOp::kAdd, kKvOff, kKvOff, tile_t * position_bytes(p));
  b.alui(AluOp::kSub, kLeft, kLeft, tile_t);
}

// ---- split_positions: (chunk, kv head) units, then a combine after a grid barrier ----

constexpr uint32_t kDefaultChunk = 128;  // positions per chunk when tile_t is 0
constexpr uint32_t kCombineGroup = 32;   // chunks folded per combine step

uint32_t chunk_of(const DecodeAttentionParams& p) { return p.tile_t ? p.tile_t : std::min(kDefaultChunk, p.max_len); }
uint64_t chunks_of(const DecodeAttentionParams& p) { return ceil_div(uint64_t{p.max_len}, chunk_of(p)); }
// f32 elements of one head's record in "partials": m[chunks], l[chunks], o[chunks][dim].
uint64_t record_elems(const DecodeAttentionParams& p) { return chunks_of(p) * (uint64_t{p.head_dim} + 2); }

// Local memory of the two phases; both start at 0 (the combine reuses the chunk space).
struct SplitLayout {
  Layout chunk;  // one chunk unit: queries, output, statistics, scores, K-or-V
  uint32_t group = kCombineGroup, dim = 0;

  uint64_t m() const { return 0; }  // 1 x group each: chunk maxima, then weights
  uint64_t l() const { return m() + uint64_t{group} * 4; }
  uint64_t stat(int i) const { return l() + uint64_t{group} * 4 + 4 * i; }  // 1 x 1 each
  uint64_t o() const { return align64(stat(kStats)); }                       // group x dim
  uint64_t out() const { return o() + uint64_t{group} * dim * 4; }           // 1 x dim
  uint64_t combine_end() const { return out() + uint64_t{dim} * 4; }

  static constexpr int kStats = 5;  // running max, group max, rescale factor, running sum, group sum
};

StatusOr<SplitLayout> split_layout_for(const DecodeAttentionParams& p, const Target& target) {
  const uint32_t group = p.n_heads / p.n_kv_heads;
  SplitLayout sl;
  sl.chunk = {group, p.head_dim, chunk_of(p), static_cast<uint32_t>(isa::dtype_size(p.kv_dtype))};
  sl.dim = p.head_dim;
  if (sl.chunk.kv_end() > target.local_bytes) {
    return invalid_param(kOp, "tile_t", "with split_positions a chunk of " + std::to_string(sl.chunk.positions) +
                                            " positions needs " + std::to_string(sl.chunk.kv_end()) +
                                            " bytes of local memory, cores have " + std::to_string(target.local_bytes));
  }
  if (sl.combine_end() > target.local_bytes) {
    return invalid_param(kOp, "head_dim", "is too large for split_positions' combine in local memory");
  }
  if (cores_of(p.cores, target) > target.cores) {
    return invalid_param(kOp, "cores", "must be <= the target's cores with split_positions (a grid barrier)");
  }
  return sl;
}

// Registers of the split kernel.
constexpr Reg sBlock{0}, sLen0{1}, sQueries{2}, sQuery{3}, sLen{4}, sFirst{5}, sJf{6}, sN{7}, sUnits{8}, sU{9},
    sCount{10}, sG{11}, sJ{12}, sStart{13}, sEnd{14}, sRows{15}, sKvOff{16}, sQOff{17}, sPOff{18}, sKvStride{19},
    sRecStride{20}, sScale{21}, sTmp{22}, sTmp2{23}, sNegInf{24}, sZero{25}, sLeft{26}, sLOff{27}, sOOff{28},
    sOutOff{29}, sGroups{30};
constexpr Tile sQ{0}, sO{1}, sM{2}, sL{3}, sS{4}, sKv{5};                                  // chunk phase
constexpr Tile cM{6}, cL{7}, cMax{8}, cGMax{9}, cRescale{10}, cSum{11}, cGSum{12}, cO{13}, cOut{14};  // combine

// sLen = len of query sQuery; faults unless 1 <= it <= max_len; then sFirst (first
// attended position), sJf (its chunk) and sN (chunks from sJf to the one of len - 1).
void emit_query_chunks(isa::KernelBuilder& b, const DecodeAttentionParams& p) {
  const int64_t chunk = chunk_of(p);
  b.alu(AluOp::kAdd, sLen, sLen0, sQuery);
  emit_guarded_first(b, p, sLen, sFirst, sTmp);
  b.alui(AluOp::kDiv, sJf, sFirst, chunk);
  b.alui(AluOp::kSub, sN, sLen, 1);
  b.alui(AluOp::kDiv, sN, sN, chunk);
  b.alu(AluOp::kSub, sN, sN, sJf);
  b.alui(AluOp::kAdd, sN, sN, 1);
}

// sCount = how many of `units` (a register) this block takes, round robin from
// sU = (block + grid - rotate) % grid: the rotation spreads the queries' first units.
void emit_round_robin(isa::KernelBuilder& b, Reg units, Reg rotate, int64_t grid) {
  b.alu(AluOp::kRem, sTmp, rotate, sTmp2);  // sTmp2 holds grid
  b.alu(AluOp::kSub, sU, sTmp2, sTmp);
  b.alu(AluOp::kAdd, sU, sU, sBlock);
  b.alu(AluOp::kRem, sU, sU, sTmp2);
  b.alu(AluOp::kSub, sCount, units, sU);
  b.alui(AluOp::kAdd, sCount, sCount, grid - 1);
  b.alui(AluOp::kMax, sCount, sCount, 0);
  b.alui(AluOp::kDiv, sCount, sCount, grid);
}

// One (chunk, kv head) unit sU of query sQuery: the chunk's scores, their max m and
// sum l, and o = exp(s - m) V, stored into the heads' records of "partials".
void emit_chunk_unit(isa::KernelBuilder& b, const DecodeAttentionParams& p, const SplitLayout& sl, uint8_t q,
                     uint8_t k_cache, uint8_t v_cache, uint8_t partials, float scale) {
  const Layout& lay = sl.chunk;
  const int64_t chunk = lay.positions, kv = p.n_kv_heads, chunks = static_cast<int64_t>(chunks_of(p));
  const int64_t rec = static_cast<int64_t>(record_elems(p));
  b.alui(AluOp::kRem, sG, sU, kv);
  b.alui(AluOp::kDiv, sJ, sU, kv);
  b.alu(AluOp::kAdd, sJ, sJ, sJf);
  b.alui(AluOp::kMul, sStart, sJ, chunk);
  b.alui(AluOp::kAdd, sEnd, sStart, chunk);
  b.alu(AluOp::kMax, sStart, sStart, sFirst);
  b.alu(AluOp::kMin, sEnd, sEnd, sLen);
  b.alu(AluOp::kSub, sRows, sEnd, sStart);
  b.alui(AluOp::kMul, sKvOff, sStart, position_bytes(p));
  b.alui(AluOp::kMul, sTmp, sG, int64_t{p.head_dim} * lay.kv_esize);
  b.alu(AluOp::kAdd, sKvOff, sKvOff, sTmp);
  // First head of the unit: query sQuery's head sG * heads.
  b.alui(AluOp::kMul, sTmp, sQuery, p.n_heads);
  b.alui(AluOp::kMul, sTmp2, sG, lay.heads);
  b.alu(AluOp::kAdd, sTmp, sTmp, sTmp2);
  b.alui(AluOp::kMul, sQOff, sTmp, int64_t{p.head_dim} * 4);
  b.alui(AluOp::kMul, sPOff, sTmp, rec);  // the head's record, in elements
  b.tld(sQ, q, sQOff, DType::kF32);
  if (scale != 1.0f) b.tsop(BinOp::kMul, sQ, sQ, sScale);
  b.tdef(sKv, p.kv_dtype, sRows, static_cast<int>(lay.dim), static_cast<uint32_t>(lay.kv()));
  b.tdef(sS, DType::kF32, static_cast<int>(lay.heads), sRows, static_cast<uint32_t>(lay.scores()));
  b.tld(sKv, k_cache, sKvOff, p.kv_dtype, sKvStride);
  b.tmma(sS, sQ, sKv, isa::kTransB);
  b.tred(RedOp::kMax, sM, sS);
  b.tbin(BinOp::kSub, sS, sS, sM, isa::kBcastCol);
  b.tun(UnOp::kExp, sS, sS);
  b.tred(RedOp::kSum, sL, sS);
  b.tld(sKv, v_cache, sKvOff, p.kv_dtype, sKvStride);
  b.tmma(sO, sS, sKv);
  // m at [j], l at [chunks + j], o at [2 chunks + j dim] of each head's record.
  b.alu(AluOp::kAdd, sTmp, sPOff, sJ);
  b.alui(AluOp::kMul, sTmp, sTmp, 4);
  b.tst(sM, partials, sTmp, DType::kF32, sRecStride);
  b.alui(AluOp::kAdd, sTmp, sTmp, chunks * 4);
  b.tst(sL, partials, sTmp, DType::kF32, sRecStride);
  b.alui(AluOp::kMul, sTmp, sJ, p.head_dim);
  b.alu(AluOp::kAdd, sTmp, sTmp, sPOff);
  b.alui(AluOp::kAdd, sTmp, sTmp, 2 * chunks);
  b.alui(AluOp::kMul, sTmp, sTmp, 4);
  b.tst(sO, partials, sTmp, DType::kF32, sRecStride);
}

// One (query, head) unit sU: folds the sN chunk partials from sJf on, `group` at a
// time (running max, rescale, weights exp(m_j - M)), and stores out = o / l.
void emit_combine_unit(isa::KernelBuilder& b, const DecodeAttentionParams& p, const SplitLayout& sl, uint8_t partials,
                       uint8_t out) {
  const int64_t chunks = static_cast<int64_t>(chunks_of(p)), rec = static_cast<int64_t>(record_elems(p));
  const int64_t dim = p.head_dim, group = sl.group;
  b.alui(AluOp::kDiv, sQuery, sU, p.n_heads);
  emit_query_chunks(b, p);
  b.alui(AluOp::kMul, sOutOff, sU, dim * 4);  // units are (query, head) in order, as "out" is
  b.alui(AluOp::kMul, sPOff, sU, rec);
  b.alu(AluOp::kAdd, sPOff, sPOff, sJf);
  b.alui(AluOp::kMul, sPOff, sPOff, 4);       // m of chunk sJf
  b.alui(AluOp::kAdd, sLOff, sPOff, chunks * 4);
  b.alui(AluOp::kMul, sOOff, sJf, dim);
  b.alui(AluOp::kMul, sTmp, sU, rec);
  b.alu(AluOp::kAdd, sOOff, sOOff, sTmp);
  b.alui(AluOp::kAdd, sOOff, sOOff, 2 * chunks);
  b.alui(AluOp::kMul, sOOff, sOOff, 4);       // o of chunk sJf
  b.tfill(cOut, sZero);
  b.tfill(cSum, sZero);
  b.tfill(cMax, sNegInf);
  b.mov(sLeft, sN);
  emit_ceil_div(b, sGroups, sN, group);
  b.loop_begin(sGroups);
  b.alui(AluOp::kMin, sRows, sLeft, group);
  b.tdef(cM, DType::kF32, 1, sRows, static_cast<uint32_t>(sl.m()));
  b.tdef(cL, DType::kF32, 1, sRows, static_cast<uint32_t>(sl.l()));
  b.tdef(cO, DType::kF32, sRows, static_cast<int>(dim), static_cast<uint32_t>(sl.o()));
  b.tld(cM, partials, sPOff, DType::kF32);
  b.tld(cL, partials, sLOff, DType::kF32);
  b.tld(cO, partials, sOOff, DType::kF32);
  b.tred(RedOp::kMax, cGMax, cM);
  b.tbin(BinOp::kMax, cGMax, cGMax, cMax);  // the new running max
  b.tbin(BinOp::kSub, cRescale, cMax, cGMax);
  b.tun(UnOp::kExp, cRescale, cRescale);
  b.tbin(BinOp::kMax, cMax, cMax, cGMax);
  b.tbin(BinOp::kSub, cM, cM, cGMax, isa::kBcastCol);
  b.tun(UnOp::kExp, cM, cM);  // each chunk's weight
  b.tbin(BinOp::kMul, cL, cL, cM);
  b.tred(RedOp::kSum, cGSum, cL);
  b.tbin(BinOp::kMul, cSum, cSum, cRescale);
  b.tbin(BinOp::kAdd, cSum, cSum, cGSum);
  b.tbin(BinOp::kMul, cOut, cOut, cRescale, isa::kBcastCol);
  b.tmma(cOut, cM, cO, isa::kAccumulate);
  b.alui(AluOp::kAdd, sPOff, sPOff, group * 4);
  b.alui(AluOp::kAdd, sLOff, sLOff, group * 4);
  b.alui(AluOp::kAdd, sOOff, sOOff, group * dim * 4);
  b.alui(AluOp::kSub, sLeft, sLeft, group);
  b.loop_end();
  b.tbin(BinOp::kDiv, cOut, cOut, cSum, isa::kBcastCol);
  b.tst(cOut, out, sOutOff, DType::kF32);
}

// The split kernel: every block takes its share of each query's (chunk, kv head)
// units, waits for all blocks, then takes its share of the (query, head) combines.
StatusOr<uint32_t> emit_split(EmitContext& ctx, const DecodeAttentionParams& p) {
  NPURT_ASSIGN_OR_RETURN(const SplitLayout sl, split_layout_for(p, ctx.target));
  const int64_t grid = cores_of(p.cores, ctx.target);
  const float scale = attention_scale(p);
  isa::KernelBuilder& b = ctx.builder;
  const uint8_t q = ctx.arg("q"), k_cache = ctx.arg("k_cache"), v_cache = ctx.arg("v_cache"), out = ctx.arg("out");
  const uint8_t partials = ctx.arg("partials");
  const Layout& lay = sl.chunk;

  b.block_id(sBlock);
  emit_len(b, ctx.arg("len"), sLen0);
  if (p.queries_runtime) {
    b.arg_value(sQueries, ctx.arg(kRowsScalar));
    b.alui(AluOp::kMax, sQueries, sQueries, 1);
    b.alui(AluOp::kMin, sQueries, sQueries, std::max<uint32_t>(p.queries, 1));
  } else {
    b.li(sQueries, std::max<uint32_t>(p.queries, 1));
  }
  b.li(sKvStride, int64_t{p.n_kv_heads} * p.head_dim);
  b.li(sRecStride, static_cast<int64_t>(record_elems(p)));
  b.li(sScale, f32_bits(scale));
  b.li(sNegInf, f32_bits(-std::numeric_limits<float>::infinity()));
  b.li(sZero, 0);
  const auto def = [&](Tile t, uint32_t rows, uint32_t cols, uint64_t off) {
    b.tdef(t, DType::kF32, static_cast<int>(rows), static_cast<int>(cols), static_cast<uint32_t>(off));
  };
  def(sQ, lay.heads, lay.dim, lay.q());
  def(sO, lay.heads, lay.dim, lay.o());
  def(sM, lay.heads, 1, lay.stat(0));
  def(sL, lay.heads, 1, lay.stat(1));
  def(cMax, 1, 1, sl.stat(0));
  def(cGMax, 1, 1, sl.stat(1));
  def(cRescale, 1, 1, sl.stat(2));
  def(cSum, 1, 1, sl.stat(3));
  def(cGSum, 1, 1, sl.stat(4));
  def(cOut, 1, sl.dim, sl.out());

  b.li(sQuery, 0);
  b.loop_begin(sQueries);
  emit_query_chunks(b, p);
  b.alui(AluOp::kMul, sUnits, sN, p.n_kv_heads);
  b.li(sTmp2, grid);
  emit_round_robin(b, sUnits, sQuery, grid);
  b.loop_begin(sCount);
  emit_chunk_unit(b, p, sl, q, k_cache, v_cache, partials, scale);
  b.alui(AluOp::kAdd, sU, sU, grid);
  b.loop_end();
  b.alui(AluOp::kAdd, sQuery, sQuery, 1);
  b.loop_end();

  b.barrier();  // every chunk's partial is in GM

  b.alui(AluOp::kMul, sUnits, sQueries, p.n_heads);
  b.li(sTmp2, grid);
  b.li(sQuery, 0);
  emit_round_robin(b, sUnits, sQuery, grid);
  b.loop_begin(sCount);
  emit_combine_unit(b, p, sl, partials, out);
  b.alui(AluOp::kAdd, sU, sU, grid);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(std::max(lay.kv_end(), sl.combine_end())));
  return static_cast<uint32_t>(grid);
}

}  // namespace

std::string DecodeAttention::name() const {
  const bool several = p_.queries > 1 || p_.queries_runtime;
  std::string extra = several ? " queries" + std::to_string(p_.queries) + (p_.queries_runtime ? " (runtime rows)" : "") : "";
  if (p_.split_positions) extra += " split" + std::to_string(chunk_positions());
  return attention_name(kOp, p_, extra);
}

uint32_t DecodeAttention::chunk_positions() const { return chunk_of(p_); }

uint64_t DecodeAttention::partials_elems() const {
  return uint64_t{std::max<uint32_t>(p_.queries, 1)} * p_.n_heads * record_elems(p_);
}

Status DecodeAttention::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "n_heads", p_.n_heads, 65535, "must be <= 65535 (tile rows)"));
  NPURT_RETURN_IF_ERROR(check_kv_heads(kOp, p_));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "head_dim", p_.head_dim, 65535, "must be <= 65535 (one tile row)"));
  NPURT_RETURN_IF_ERROR(check_max_len(kOp, p_, "len is i32"));
  NPURT_RETURN_IF_ERROR(check_scale_and_kv_dtype(kOp, p_));
  if (p_.tile_t > p_.max_len) return invalid_param(kOp, "tile_t", "must be <= max_len");
  if (p_.queries < 1 || p_.queries > 65535) return invalid_param(kOp, "queries", "must be 1 .. 65535");
  return ok_status();
}

std::vector<ArgSpec> DecodeAttention::signature() const {
  std::vector<ArgSpec> s = attention_buffers(p_, uint64_t{std::max<uint32_t>(p_.queries, 1)} * p_.n_heads * p_.head_dim);
  s.push_back(ArgSpec::scalar("len", DType::kI32));
  if (p_.queries_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  if (p_.split_positions) s.push_back(ArgSpec::buffer("partials", Access::kInOut, DType::kF32, partials_elems()));
  return s;
}

StatusOr<uint32_t> DecodeAttention::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  if (p_.split_positions) return emit_split(ctx, p_);
  NPURT_ASSIGN_OR_RETURN(const Plan plan, plan_for(p_, target));
  const Layout& lay = plan.lay;
  const int64_t unit_q_bytes = int64_t{lay.heads} * p_.head_dim * 4;
  const float scale = attention_scale(p_);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t q = ctx.arg("q");
  const uint8_t k_cache = ctx.arg("k_cache");
  const uint8_t v_cache = ctx.arg("v_cache");
  const uint8_t out = ctx.arg("out");
  const uint8_t len = ctx.arg("len");

  b.block_id(kBlock);
  emit_block_range(b, kBlock, plan.units, plan.grid, kUnit, kUnitCount);
  b.li(kStride, int64_t{p_.n_kv_heads} * p_.head_dim);
  b.li(kScale, f32_bits(scale));
  b.li(kNegInf, f32_bits(-std::numeric_limits<float>::infinity()));
  b.li(kZero, 0);
  emit_static_tiles(b, lay);
  const bool several = p_.queries > 1 || p_.queries_runtime;
  // Several queries: query i (at position len - 1 + i) runs the one-query code with
  // len + i, so its result is bitwise that of a one-query launch at its position.
  if (several) {
    emit_len(b, len, kLenFirst);
    if (p_.queries_runtime) {
      b.arg_value(kQueries, ctx.arg(kRowsScalar));
      b.alui(AluOp::kMax, kQueries, kQueries, 1);
      b.alui(AluOp::kMin, kQueries, kQueries, p_.queries);
    } else {
      b.li(kQueries, p_.queries);
    }
    b.mov(kUnitFirst, kUnit);
    b.li(kQuery, 0);
    b.li(kQueryOff, 0);
    b.loop_begin(kQueries);
    b.alu(AluOp::kAdd, kLen, kLenFirst, kQuery);
    emit_range_of_len(b, p_, lay.positions);
    b.mov(kUnit, kUnitFirst);
    b.alui(AluOp::kMul, kQOff, kUnit, unit_q_bytes);
    b.alu(AluOp::kAdd, kQOff, kQOff, kQueryOff);
  } else {
    emit_position_range(b, p_, len, lay.positions);
    b.alui(AluOp::kMul, kQOff, kUnit, unit_q_bytes);  // units are consecutive runs of query heads
  }
  b.loop_begin(kUnitCount);
  b.alui(AluOp::kDiv, kKvOff, kUnit, plan.subgroups);  // the unit's kv head
  b.alui(AluOp::kMul, kKvOff, kKvOff, int64_t{p_.head_dim} * lay.kv_esize);
  b.alu(AluOp::kAdd, kKvOff, kKvOff, kFirstPosBytes);
  b.mov(kLeft, kPositions);
  b.tld(kQ, q, kQOff, DType::kF32);
  if (scale != 1.0f) b.tsop(BinOp::kMul, kQ, kQ, kScale);
  b.tfill(kO, kZero);
  b.tfill(kSum, kZero);
  b.tfill(kMax, kNegInf);
  b.loop_begin(kTiles);
  emit_tile(b, p_, lay, k_cache, v_cache);
  b.loop_end();
  b.tbin(BinOp::kDiv, kO, kO, kSum, isa::kBcastCol);
  b.tst(kO, out, kQOff, DType::kF32);
  b.alui(AluOp::kAdd, kQOff, kQOff, unit_q_bytes);
  b.alui(AluOp::kAdd, kUnit, kUnit, 1);
  b.loop_end();
  if (several) {
    b.alui(AluOp::kAdd, kQuery, kQuery, 1);
    b.alui(AluOp::kAdd, kQueryOff, kQueryOff, int64_t{p_.n_heads} * p_.head_dim * 4);
    b.loop_end();
  }
  b.reserve_local(static_cast<uint32_t>(lay.kv_end()));
  return static_cast<uint32_t>(plan.grid);
}

void DecodeAttention::compute_reference(std::span<const HostArg> args) const {
  const uint64_t H = p_.n_heads, D = p_.head_dim, KV = p_.n_kv_heads;
  const int64_t len0 = static_cast<int32_t>(args[4].as_i64());
  const uint64_t queries =
      p_.queries_runtime ? std::clamp<int64_t>(args[5].as_i64(), 1, p_.queries) : std::max<uint32_t>(p_.queries, 1);
  std::vector<float> out = read_f32(args[3], DType::kF32);
  const std::vector<float> q = read_f32(args[0], DType::kF32);
  const std::vector<float> k = read_f32(args[1], p_.kv_dtype);
  const std::vector<float> v = read_f32(args[2], p_.kv_dtype);
  const double scale = attention_scale(p_);
  for (uint64_t i = 0; i < queries; ++i) {
    const int64_t len = len0 + static_cast<int64_t>(i);
    float* o = &out[i * H * D];
    if (len < 1 || len > static_cast<int64_t>(p_.max_len)) {  // the kernel faults: no result
      std::fill(o, o + H * D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const int64_t first = p_.window ? std::max<int64_t>(0, len - p_.window) : 0;
    for (uint64_t h = 0; h < H; ++h) attend_reference(p_, &q[(i * H + h) * D], k, v, h / (H / KV), first, len, scale, &o[h * D]);
  }
  write_f32(args[3], DType::kF32, out);
}

}  // namespace npurt::ops
