#include "npurt/ops/paged_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "npurt/isa/builder.h"
#include "ops/attention_common.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr const char* kOp = "paged_decode_attention";

// Local memory of one unit (the query heads of one kv group of one sequence): the
// shared attention unit layout over one block's rows (block_positions), then the i32
// slot that table entries and lengths are read through.
struct Layout : AttentionUnitLayout {
  uint64_t slot() const { return align64(kv_end()); }
  uint64_t end() const { return slot() + 4; }
};

Layout layout_of(const PagedDecodeAttentionParams& p) {
  const auto kv_esize = static_cast<uint32_t>(isa::dtype_size(p.kv_dtype));
  return {{p.n_heads / p.n_kv_heads, p.head_dim, p.block_positions, kv_esize}};
}

int64_t position_bytes(const PagedDecodeAttentionParams& p) {
  return int64_t{p.n_kv_heads} * p.head_dim * static_cast<int64_t>(isa::dtype_size(p.kv_dtype));
}

constexpr Reg kBlock{0}, kU{1}, kCount{2}, kUnits{3}, kSeq{4}, kG{5}, kLen{6}, kFirst{7}, kJ{8}, kTiles{9},
    kStart{10}, kEnd{11}, kRows{12}, kBlk{13}, kKvOff{14}, kQOff{15}, kStride{16}, kScale{17}, kNegInf{18},
    kZero{19}, kTmp{20}, kTmp2{21}, kGate{22}, kSeqs{23}, kGOff{24};
constexpr Tile kQ{0}, kO{1}, kMax{2}, kTileMax{3}, kRescale{4}, kSum{5}, kTileSum{6}, kScores{7}, kKv{8}, kSlot{9};

// Faults the block (integer division by zero) unless lo <= value < hi.
void emit_fault_outside(isa::KernelBuilder& b, Reg value, int64_t lo, int64_t hi) {
  emit_range_gate(b, kGate, value, lo, hi, kTmp2);
  b.li(kTmp2, 1);
  b.alu(AluOp::kDiv, kGate, kTmp2, kGate);
}

// dst = the i32 at byte `offset` (a register) of argument `arg`, through the slot tile.
void emit_read_i32(isa::KernelBuilder& b, Reg dst, uint8_t arg, Reg offset) {
  b.tld(kSlot, arg, offset, DType::kI32);
  b.tget(dst, kSlot, kZero);
}

// One block of the unit's sequence (table entry kJ): its attended rows [kStart, kEnd)
// folded into the running softmax, as DecodeAttention folds a tile.
void emit_block(isa::KernelBuilder& b, const PagedDecodeAttentionParams& p, const Layout& lay, uint8_t k_pool,
                uint8_t v_pool, uint8_t tables) {
  const int64_t bp = p.block_positions, pos_bytes = position_bytes(p);
  b.alui(AluOp::kMul, kStart, kJ, bp);
  b.alui(AluOp::kAdd, kEnd, kStart, bp);
  b.alu(AluOp::kMax, kStart, kStart, kFirst);
  b.alu(AluOp::kMin, kEnd, kEnd, kLen);
  b.alu(AluOp::kSub, kRows, kEnd, kStart);
  // The block: tables[seq][j], which must name one of the pool's blocks.
  b.alui(AluOp::kMul, kTmp, kSeq, p.max_blocks);
  b.alu(AluOp::kAdd, kTmp, kTmp, kJ);
  b.alui(AluOp::kMul, kTmp, kTmp, 4);
  emit_read_i32(b, kBlk, tables, kTmp);
  emit_fault_outside(b, kBlk, 0, p.blocks);
  // Row blk * bp + start % bp of the pool, kv head g.
  b.alui(AluOp::kMul, kKvOff, kBlk, bp);
  b.alui(AluOp::kRem, kTmp, kStart, bp);
  b.alu(AluOp::kAdd, kKvOff, kKvOff, kTmp);
  b.alui(AluOp::kMul, kKvOff, kKvOff, pos_bytes);
  b.alu(AluOp::kAdd, kKvOff, kKvOff, kGOff);
  b.tdef(kKv, p.kv_dtype, kRows, static_cast<int>(lay.dim), static_cast<uint32_t>(lay.kv()));
  b.tdef(kScores, DType::kF32, static_cast<int>(lay.heads), kRows, static_cast<uint32_t>(lay.scores()));
  b.tld(kKv, k_pool, kKvOff, p.kv_dtype, kStride);
  b.tmma(kScores, kQ, kKv, isa::kTransB);
  emit_online_softmax_fold(b, {kMax, kTileMax, kRescale, kSum, kTileSum, kScores, kO});
  b.tld(kKv, v_pool, kKvOff, p.kv_dtype, kStride);  // V replaces K: the scores are computed
  b.tmma(kO, kScores, kKv, isa::kAccumulate);
  b.alui(AluOp::kAdd, kJ, kJ, 1);
}

// One (sequence, kv head) unit kU: its len, its attended blocks, and the output of its
// group's query heads.
void emit_unit(isa::KernelBuilder& b, const PagedDecodeAttentionParams& p, const Layout& lay, const EmitContext& ctx,
               float scale) {
  const int64_t bp = p.block_positions, kv = p.n_kv_heads;
  b.alui(AluOp::kDiv, kSeq, kU, kv);
  b.alui(AluOp::kRem, kG, kU, kv);
  b.alui(AluOp::kMul, kGOff, kG, int64_t{p.head_dim} * lay.kv_esize);
  b.alui(AluOp::kMul, kTmp, kSeq, 4);
  emit_read_i32(b, kLen, ctx.arg("lens"), kTmp);
  emit_fault_outside(b, kLen, 1, int64_t{p.max_blocks} * bp + 1);
  if (p.window) {
    b.alui(AluOp::kSub, kFirst, kLen, p.window);
    b.alui(AluOp::kMax, kFirst, kFirst, 0);
  } else {
    b.li(kFirst, 0);
  }
  // Blocks first / bp .. (len - 1) / bp.
  b.alui(AluOp::kDiv, kJ, kFirst, bp);
  b.alui(AluOp::kSub, kTiles, kLen, 1);
  b.alui(AluOp::kDiv, kTiles, kTiles, bp);
  b.alu(AluOp::kSub, kTiles, kTiles, kJ);
  b.alui(AluOp::kAdd, kTiles, kTiles, 1);
  // Query heads g * heads .. of sequence seq.
  b.alui(AluOp::kMul, kQOff, kSeq, p.n_heads);
  b.alui(AluOp::kMul, kTmp, kG, lay.heads);
  b.alu(AluOp::kAdd, kQOff, kQOff, kTmp);
  b.alui(AluOp::kMul, kQOff, kQOff, int64_t{p.head_dim} * 4);
  b.tld(kQ, ctx.arg("q"), kQOff, DType::kF32);
  if (scale != 1.0f) b.tsop(BinOp::kMul, kQ, kQ, kScale);
  b.tfill(kO, kZero);
  b.tfill(kSum, kZero);
  b.tfill(kMax, kNegInf);
  b.loop_begin(kTiles);
  emit_block(b, p, lay, ctx.arg("k_pool"), ctx.arg("v_pool"), ctx.arg("tables"));
  b.loop_end();
  b.tbin(BinOp::kDiv, kO, kO, kSum, isa::kBcastCol);
  b.tst(kO, ctx.arg("out"), kQOff, DType::kF32);
}

}  // namespace

std::string PagedDecodeAttention::name() const {
  std::string n = std::string(kOp) + " " + std::string(isa::dtype_name(p_.kv_dtype)) + " h" +
                  std::to_string(p_.n_heads) + "/kv" + std::to_string(p_.n_kv_heads) + " d" +
                  std::to_string(p_.head_dim) + " blocks" + std::to_string(p_.blocks) + "x" +
                  std::to_string(p_.block_positions) + " table" + std::to_string(p_.max_blocks) + " seqs" +
                  std::to_string(p_.sequences);
  if (p_.window) n += " window" + std::to_string(p_.window);
  return n;
}

Status PagedDecodeAttention::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "n_heads", p_.n_heads, 65535, "must be <= 65535 (tile rows)"));
  NPURT_RETURN_IF_ERROR(check_kv_heads(kOp, p_));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "head_dim", p_.head_dim, 65535, "must be <= 65535 (one tile row)"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "block_positions", p_.block_positions, 65535, "must be <= 65535 (tile rows)"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "sequences", p_.sequences, 65535, "must be <= 65535"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "blocks", p_.blocks, std::numeric_limits<int32_t>::max(), "must be <= 2^31 - 1"));
  NPURT_RETURN_IF_ERROR(
      check_count(kOp, "max_blocks", p_.max_blocks, std::numeric_limits<int32_t>::max(), "must be <= 2^31 - 1"));
  constexpr uint64_t kI32 = std::numeric_limits<int32_t>::max();
  if (uint64_t{p_.blocks} * p_.block_positions > kI32) {
    return invalid_param(kOp, "blocks", "x block_positions must be <= 2^31 - 1 (pool rows are i32)");
  }
  if (uint64_t{p_.max_blocks} * p_.block_positions > kI32) {
    return invalid_param(kOp, "max_blocks", "x block_positions must be <= 2^31 - 1 (lens are i32)");
  }
  return check_scale_and_kv_dtype(kOp, p_);
}

std::vector<ArgSpec> PagedDecodeAttention::signature() const {
  const uint64_t q_elems = uint64_t{p_.sequences} * p_.n_heads * p_.head_dim;
  const uint64_t pool_elems = uint64_t{p_.blocks} * p_.block_positions * p_.n_kv_heads * p_.head_dim;
  return {ArgSpec::buffer("q", Access::kIn, DType::kF32, q_elems),
          ArgSpec::buffer("k_pool", Access::kIn, p_.kv_dtype, pool_elems),
          ArgSpec::buffer("v_pool", Access::kIn, p_.kv_dtype, pool_elems),
          ArgSpec::buffer("tables", Access::kIn, DType::kI32, uint64_t{p_.sequences} * p_.max_blocks),
          ArgSpec::buffer("lens", Access::kIn, DType::kI32, p_.sequences),
          ArgSpec::buffer("out", Access::kOut, DType::kF32, q_elems),
          ArgSpec::scalar(kRowsScalar, DType::kI32)};
}

StatusOr<uint32_t> PagedDecodeAttention::emit(EmitContext& ctx) const {
  const Layout lay = layout_of(p_);
  if (lay.end() > ctx.target.local_bytes) {
    return invalid_param(kOp, "block_positions", "needs " + std::to_string(lay.end()) +
                                                     " bytes of local memory for one block's tiles, cores have " +
                                                     std::to_string(ctx.target.local_bytes));
  }
  const uint32_t grid = cores_of(p_.cores, ctx.target);
  const float scale = attention_scale(p_);
  isa::KernelBuilder& b = ctx.builder;

  b.block_id(kBlock);
  b.arg_value(kSeqs, ctx.arg(kRowsScalar));
  b.alui(AluOp::kShl, kSeqs, kSeqs, 32);  // the scalar's i32 value
  b.alui(AluOp::kShr, kSeqs, kSeqs, 32);
  b.alui(AluOp::kMax, kSeqs, kSeqs, 1);
  b.alui(AluOp::kMin, kSeqs, kSeqs, p_.sequences);
  b.alui(AluOp::kMul, kUnits, kSeqs, p_.n_kv_heads);
  // Units block, block + grid, ...: count = ceil((units - block) / grid).
  b.alu(AluOp::kSub, kCount, kUnits, kBlock);
  b.alui(AluOp::kAdd, kCount, kCount, grid - 1);
  b.alui(AluOp::kMax, kCount, kCount, 0);
  b.alui(AluOp::kDiv, kCount, kCount, grid);
  b.mov(kU, kBlock);
  b.li(kStride, int64_t{p_.n_kv_heads} * p_.head_dim);
  b.li(kScale, f32_bits(scale));
  b.li(kNegInf, f32_bits(-std::numeric_limits<float>::infinity()));
  b.li(kZero, 0);
  const auto def = [&](Tile t, DType d, uint32_t rows, uint32_t cols, uint64_t off) {
    b.tdef(t, d, static_cast<int>(rows), static_cast<int>(cols), static_cast<uint32_t>(off));
  };
  def(kQ, DType::kF32, lay.heads, lay.dim, lay.q());
  def(kO, DType::kF32, lay.heads, lay.dim, lay.o());
  const Tile stats[Layout::kNumStats] = {kMax, kTileMax, kRescale, kSum, kTileSum};
  for (int i = 0; i < Layout::kNumStats; ++i) def(stats[i], DType::kF32, lay.heads, 1, lay.stat(i));
  def(kSlot, DType::kI32, 1, 1, lay.slot());
  b.loop_begin(kCount);
  emit_unit(b, p_, lay, ctx, scale);
  b.alui(AluOp::kAdd, kU, kU, grid);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(lay.end()));
  return grid;
}

void PagedDecodeAttention::compute_reference(std::span<const HostArg> args) const {
  const uint64_t H = p_.n_heads, D = p_.head_dim, KV = p_.n_kv_heads, bp = p_.block_positions;
  const int64_t rows = std::clamp<int64_t>(static_cast<int32_t>(args[6].as_i64()), 1, p_.sequences);
  const std::vector<float> q = read_f32(args[0], DType::kF32);
  const std::vector<float> k_pool = read_f32(args[1], p_.kv_dtype);
  const std::vector<float> v_pool = read_f32(args[2], p_.kv_dtype);
  std::vector<int32_t> tables(args[3].bytes.size() / 4), lens(args[4].bytes.size() / 4);
  std::memcpy(tables.data(), args[3].bytes.data(), tables.size() * 4);
  std::memcpy(lens.data(), args[4].bytes.data(), lens.size() * 4);
  std::vector<float> out = read_f32(args[5], DType::kF32);
  const double scale = attention_scale(p_);
  const uint64_t row = KV * D;
  for (int64_t s = 0; s < rows; ++s) {
    float* o = &out[s * H * D];
    const int64_t len = lens[s];
    const int64_t first = p_.window ? std::max<int64_t>(0, len - p_.window) : 0;
    bool ok = len >= 1 && len <= int64_t{p_.max_blocks} * static_cast<int64_t>(bp);
    // The sequence's positions gathered into a contiguous cache (rows before `first`
    // stay zero and are not attended).
    std::vector<float> k(ok ? len * row : 0), v(ok ? len * row : 0);
    for (int64_t t = first; ok && t < len; ++t) {
      const int64_t blk = tables[s * p_.max_blocks + t / bp];
      if (blk < 0 || blk >= int64_t{p_.blocks}) {
        ok = false;
        break;
      }
      const uint64_t src = (blk * bp + t % bp) * row;
      std::copy_n(&k_pool[src], row, &k[t * row]);
      std::copy_n(&v_pool[src], row, &v[t * row]);
    }
    if (!ok) {  // the kernel faults: no result
      std::fill(o, o + H * D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    for (uint64_t h = 0; h < H; ++h) attend_reference(p_, &q[(s * H + h) * D], k, v, h / (H / KV), first, len, scale, &o[h * D]);
  }
  write_f32(args[5], DType::kF32, out);
}

}  // namespace npurt::ops
