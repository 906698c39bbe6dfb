#include "npurt/ops/gemm.h"

#include <algorithm>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

bool is_io_type(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// Tile sizes, grid and local-memory layout of one kernel.
struct GemmPlan {
  uint64_t tm = 0, tn = 0, tk = 0;
  uint64_t tiles_m = 0, tiles_n = 0;
  uint32_t grid = 1;
  uint64_t a_local = 0, b_local = 0, c_local = 0, local_bytes = 0;
};

void lay_out(GemmPlan& plan, uint64_t esize) {
  plan.a_local = 0;
  plan.b_local = align64(plan.tm * plan.tk * esize);
  plan.c_local = align64(plan.b_local + plan.tk * plan.tn * esize);
  plan.local_bytes = plan.c_local + plan.tm * plan.tn * 4;
}

// Defaults: 128 x 128 C tiles over k chunks of 256 (bf16) or 128 (f32) elements, so
// the three tiles take 192 KiB and each TMMA does millions of multiply-adds; halved
// (k first) until they fit local memory. When C has fewer tiles than there are
// cores, columns are split further so every core gets work.
GemmPlan plan_gemm(const GemmParams& p, const Target& target) {
  const uint64_t esize = isa::dtype_size(p.dtype);
  const uint32_t cores = cores_of(p.cores, target);
  GemmPlan plan;
  plan.tm = std::min<uint64_t>(p.tile_m ? p.tile_m : 128, p.m);
  plan.tn = std::min<uint64_t>(p.tile_n ? p.tile_n : 128, p.n);
  plan.tk = std::min<uint64_t>(p.tile_k ? p.tile_k : (p.dtype == DType::kBF16 ? 256 : 128), p.k);
  lay_out(plan, esize);
  // Halves a tile dimension the caller left to the operator; false when it cannot.
  const auto shrink = [](uint64_t& dim, uint32_t given, uint64_t floor) {
    if (given || dim <= floor) return false;
    dim /= 2;
    return true;
  };
  while (plan.local_bytes > target.local_bytes) {
    const bool shrunk = shrink(plan.tk, p.tile_k, 32) ||
                        (plan.tm >= plan.tn ? shrink(plan.tm, p.tile_m, 16) || shrink(plan.tn, p.tile_n, 16)
                                            : shrink(plan.tn, p.tile_n, 16) || shrink(plan.tm, p.tile_m, 16));
    if (!shrunk) break;  // explicit or minimal tiles: emit() reports that they do not fit
    lay_out(plan, esize);
  }
  plan.tiles_m = ceil_div(p.m, plan.tm);
  if (!p.tile_n && plan.tiles_m * ceil_div(p.n, plan.tn) < cores) {
    const uint64_t col_tiles = std::min(ceil_div(cores, plan.tiles_m), ceil_div(p.n, 16));
    plan.tn = std::min(plan.tn, ceil_div(ceil_div(p.n, col_tiles), 16) * 16);
    lay_out(plan, esize);
  }
  plan.tiles_n = ceil_div(p.n, plan.tn);
  const uint64_t tiles = plan.tiles_m * plan.tiles_n;
  plan.grid = grid_for(ceil_div(tiles, ceil_div(tiles, cores)), cores);  // no block left without tiles
  return plan;
}

// The parameter to blame when explicit tiles do not fit local memory.
const char* oversized_tile_param(const GemmParams& p) {
  if (p.tile_k) return "tile_k";
  if (p.tile_n) return "tile_n";
  return "tile_m";
}

}  // namespace

std::string Gemm::name() const {
  return "gemm " + std::string(isa::dtype_name(p_.dtype)) + " " + std::to_string(p_.m) + "x" +
         std::to_string(p_.n) + "x" + std::to_string(p_.k) + (p_.b_layout == GemmBLayout::kColMajor ? " b^T" : "") +
         " -> " + std::string(isa::dtype_name(p_.out_dtype));
}

Status Gemm::validate() const {
  if (p_.m == 0) return invalid_param("gemm", "m", "must be > 0");
  if (p_.n == 0) return invalid_param("gemm", "n", "must be > 0");
  if (p_.k == 0) return invalid_param("gemm", "k", "must be > 0");
  if (!is_io_type(p_.dtype)) return invalid_param("gemm", "dtype", "must be f32 or bf16");
  if (!is_io_type(p_.out_dtype)) return invalid_param("gemm", "out_dtype", "must be f32 or bf16");
  if (p_.b_layout != GemmBLayout::kRowMajor && p_.b_layout != GemmBLayout::kColMajor) {
    return invalid_param("gemm", "b_layout", "must be row-major or col-major");
  }
  if (p_.tile_m > kMaxTileDim) return invalid_param(name(), "tile_m", "must be <= 65535");
  if (p_.tile_n > kMaxTileDim) return invalid_param(name(), "tile_n", "must be <= 65535");
  if (p_.tile_k > kMaxTileDim) return invalid_param(name(), "tile_k", "must be <= 65535");
  return ok_status();
}

std::vector<ArgSpec> Gemm::signature() const {
  return {ArgSpec::buffer("a", Access::kIn, p_.dtype, p_.m * p_.k),
          ArgSpec::buffer("b", Access::kIn, p_.dtype, p_.k * p_.n),
          ArgSpec::buffer("c", Access::kOut, p_.out_dtype, p_.m * p_.n)};
}

StatusOr<uint32_t> Gemm::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const GemmPlan plan = plan_gemm(p_, target);
  if (plan.local_bytes > target.local_bytes) {
    return invalid_param(name(), oversized_tile_param(p_),
                         "makes tiles of " + std::to_string(plan.local_bytes) + " bytes, more than the " +
                             std::to_string(target.local_bytes) + " bytes of local memory");
  }
  const bool b_rows = p_.b_layout == GemmBLayout::kRowMajor;
  const int64_t esize = static_cast<int64_t>(isa::dtype_size(p_.dtype));
  const int64_t osize = static_cast<int64_t>(isa::dtype_size(p_.out_dtype));
  const int64_t m = static_cast<int64_t>(p_.m), n = static_cast<int64_t>(p_.n), k = static_cast<int64_t>(p_.k);
  const int64_t tm = static_cast<int64_t>(plan.tm), tn = static_cast<int64_t>(plan.tn);
  const uint64_t tk = plan.tk, full_chunks = p_.k / tk, tail = p_.k % tk;
  const uint32_t a_local = static_cast<uint32_t>(plan.a_local), b_local = static_cast<uint32_t>(plan.b_local),
                 c_local = static_cast<uint32_t>(plan.c_local);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t a = ctx.arg("a");
  const uint8_t bb = ctx.arg("b");
  const uint8_t c = ctx.arg("c");
  const Reg bid{0}, first{1}, count{2}, tile{3}, row0{4}, col0{5}, rows{6}, cols{7}, a_off{8}, b_off{9}, c_off{10},
      a_stride{11}, b_stride{12}, c_stride{13}, chunks{14};
  const Tile ta{0}, tb{1}, tc{2};

  // Operand tiles for a k chunk of `depth` columns of A (rows of B).
  const auto define_operands = [&](uint64_t depth) {
    const int d = static_cast<int>(depth);
    b.tdef(ta, p_.dtype, rows, d, a_local);
    if (b_rows) {
      b.tdef(tb, p_.dtype, d, cols, b_local);
    } else {
      b.tdef(tb, p_.dtype, cols, d, b_local);
    }
  };
  const auto emit_chunk = [&](bool accumulate) {
    b.tld(ta, a, a_off, p_.dtype, a_stride);
    b.tld(tb, bb, b_off, p_.dtype, b_stride);
    const uint8_t flags = (b_rows ? 0 : isa::kTransB) | (accumulate ? isa::kAccumulate : 0);
    b.tmma(tc, ta, tb, flags);
  };
  const auto next_chunk = [&] {
    b.alui(AluOp::kAdd, a_off, a_off, static_cast<int64_t>(tk) * esize);
    b.alui(AluOp::kAdd, b_off, b_off, static_cast<int64_t>(tk) * (b_rows ? n : 1) * esize);
  };

  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(plan.tiles_m * plan.tiles_n), plan.grid, first, count);
  b.mov(tile, first);
  b.li(a_stride, k);
  b.li(b_stride, b_rows ? n : k);
  b.li(c_stride, n);
  b.loop_begin(count);
  // C tile (row0, col0): its first row and column; edge tiles are short.
  b.alui(AluOp::kDiv, row0, tile, static_cast<int64_t>(plan.tiles_n));
  b.alui(AluOp::kMul, row0, row0, tm);
  b.alui(AluOp::kRem, col0, tile, static_cast<int64_t>(plan.tiles_n));
  b.alui(AluOp::kMul, col0, col0, tn);
  b.li(rows, m);
  b.alu(AluOp::kSub, rows, rows, row0);
  b.alui(AluOp::kMin, rows, rows, tm);
  b.li(cols, n);
  b.alu(AluOp::kSub, cols, cols, col0);
  b.alui(AluOp::kMin, cols, cols, tn);
  b.tdef(tc, DType::kF32, rows, cols, c_local);
  define_operands(tk);
  b.alui(AluOp::kMul, a_off, row0, k * esize);
  b.alui(AluOp::kMul, b_off, col0, (b_rows ? 1 : k) * esize);
  emit_chunk(false);
  if (full_chunks > 1) {
    b.li(chunks, static_cast<int64_t>(full_chunks - 1));
    b.loop_begin(chunks);
    next_chunk();
    emit_chunk(true);
    b.loop_end();
  }
  if (tail) {
    next_chunk();
    define_operands(tail);
    emit_chunk(true);
  }
  b.alui(AluOp::kMul, c_off, row0, n);
  b.alu(AluOp::kAdd, c_off, c_off, col0);
  b.alui(AluOp::kMul, c_off, c_off, osize);
  b.tst(tc, c, c_off, p_.out_dtype, c_stride);
  b.alui(AluOp::kAdd, tile, tile, 1);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(plan.local_bytes));
  return static_cast<uint32_t>(plan.grid);
}

void Gemm::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> a = read_f32(args[0], p_.dtype);
  const std::vector<float> b = read_f32(args[1], p_.dtype);
  const bool b_rows = p_.b_layout == GemmBLayout::kRowMajor;
  std::vector<float> c(p_.m * p_.n);
  for (uint64_t i = 0; i < p_.m; ++i) {
    for (uint64_t j = 0; j < p_.n; ++j) {
      double sum = 0;
      for (uint64_t p = 0; p < p_.k; ++p) {
        const float b_pj = b_rows ? b[p * p_.n + j] : b[j * p_.k + p];
        sum += static_cast<double>(a[i * p_.k + p]) * b_pj;
      }
      c[i * p_.n + j] = static_cast<float>(sum);
    }
  }
  write_f32(args[2], p_.out_dtype, c);
}

}  // namespace npurt::ops
