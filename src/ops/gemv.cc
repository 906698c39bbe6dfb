#include "npurt/ops/gemv.h"

#include <algorithm>

#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/elementwise.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

const char* epilogue_name(GemvEpilogue e) {
  switch (e) {
    case GemvEpilogue::kNone: return "";
    case GemvEpilogue::kGeluTanh: return " gelu_tanh";
    case GemvEpilogue::kSilu: return " silu";
  }
  return " ?";
}

// Tile sizes, grid and local-memory layout of one kernel. Weights never enter local
// memory (TMV streams them from GM); local memory holds x (or a k chunk of it) and
// one accumulator column.
struct GemvPlan {
  uint64_t rows_per_tile = 0;
  uint64_t k_tile = 0;
  uint64_t row_tiles = 0;
  uint32_t grid = 1;
  bool x_resident = false;  // all of x is loaded once per block
  uint32_t x_local = 0, acc_local = 0, local_bytes = 0;
};

bool batched(const GemvParams& p) { return p.batch > 1 || p.batch_runtime; }

// Row tiles of up to 4096 rows: one TMV then covers megabytes of weights, so the
// per-instruction dispatch cost vanishes, and the accumulator stays 16 KiB. Rows are
// split evenly over the blocks; k is split only where x cannot be one tile.
GemvPlan plan_gemv(const GemvParams& p, const Target& target) {
  const uint64_t block = isa::dtype_block_elems(p.weight);
  const uint32_t cores = cores_of(p.cores, target);
  GemvPlan plan;
  if (p.k_tile) {
    plan.k_tile = std::min<uint64_t>(p.k_tile, p.k);
  } else {
    const uint64_t cols = std::min<uint64_t>({p.k, kMaxTileDim, target.local_bytes / 2 / 4});
    plan.k_tile = std::max(block, cols / block * block);
  }
  // The k chunks are the one-vector kernel's whatever the batch: a batch then sums each
  // vector's products exactly as a GEMV of that vector does.
  const uint64_t vectors = std::max<uint32_t>(p.batch, 1);
  const uint64_t x_bytes = align64(vectors * plan.k_tile * 4);
  const uint64_t rows_per_block = ceil_div(p.m, cores);
  if (p.rows_per_tile) {
    plan.rows_per_tile = p.rows_per_tile;
  } else {
    uint64_t max_rows = std::min<uint64_t>(4096, kMaxTileDim);
    // A batch's accumulator holds every vector's results for the tile.
    if (batched(p) && x_bytes < target.local_bytes) {
      max_rows = std::clamp<uint64_t>((target.local_bytes - x_bytes) / (vectors * 4), 1, max_rows);
    }
    plan.rows_per_tile = ceil_div(rows_per_block, ceil_div(rows_per_block, max_rows));
  }
  plan.row_tiles = ceil_div(p.m, plan.rows_per_tile);
  const uint64_t per_block = ceil_div(plan.row_tiles, cores);
  plan.grid = grid_for(ceil_div(plan.row_tiles, per_block), cores);  // no block left without rows
  plan.x_resident = plan.k_tile == p.k;
  const uint64_t acc_local = x_bytes;
  const uint64_t total = acc_local + vectors * plan.rows_per_tile * 4;
  plan.x_local = 0;
  plan.acc_local = static_cast<uint32_t>(std::min<uint64_t>(acc_local, UINT32_MAX));
  plan.local_bytes = static_cast<uint32_t>(std::min<uint64_t>(total, UINT32_MAX));
  return plan;
}

float apply_epilogue(GemvEpilogue e, float v) {
  switch (e) {
    case GemvEpilogue::kNone: return v;
    case GemvEpilogue::kGeluTanh: return gelu_tanh_ref(v);
    case GemvEpilogue::kSilu: return silu_ref(v);
  }
  return v;
}

}  // namespace

std::string Gemv::name() const {
  return "gemv " + std::string(isa::dtype_name(p_.weight)) + " " + std::to_string(p_.m) + "x" +
         std::to_string(p_.k) + epilogue_name(p_.epilogue) +
         (batched(p_) ? " batch " + std::to_string(p_.batch) + (p_.batch_runtime ? " (runtime rows)" : "") : "");
}

Status Gemv::validate() const {
  if (p_.m == 0) return invalid_param("gemv", "m", "must be > 0");
  if (p_.k == 0) return invalid_param("gemv", "k", "must be > 0");
  // Bounds that keep the plan's and the signature's arithmetic inside 64 bits.
  constexpr uint64_t kMaxSide = uint64_t{1} << 32, kMaxWeights = uint64_t{1} << 48;
  if (p_.m > kMaxSide) return invalid_param("gemv", "m", "must be <= 2^32");
  if (p_.k > kMaxSide) return invalid_param("gemv", "k", "must be <= 2^32");
  if (p_.m * p_.k > kMaxWeights) return invalid_param("gemv", "m", "x k must be <= 2^48 weights");
  if (!is_weight_type(p_.weight)) {
    return invalid_param("gemv", "weight", "must be f32, bf16, f16, q8_0, q4_0, q5_0, q4_K, q5_K or q6_K");
  }
  if (static_cast<uint8_t>(p_.epilogue) > static_cast<uint8_t>(GemvEpilogue::kSilu)) {
    return invalid_param(name(), "epilogue", "is not a known epilogue");
  }
  const uint64_t block = isa::dtype_block_elems(p_.weight);
  if (p_.k % block != 0) {
    return invalid_param(name(), "k", "must be a multiple of the " + std::string(isa::dtype_name(p_.weight)) +
                                          " block size " + std::to_string(block));
  }
  if (p_.k_tile % block != 0) {
    return invalid_param(name(), "k_tile", "must be a multiple of the block size " + std::to_string(block));
  }
  if (p_.k_tile > kMaxTileDim) return invalid_param(name(), "k_tile", "must be <= 65535");
  if (p_.batch < 1 || p_.batch > isa::kMaxTmvBatch) {
    return invalid_param(name(), "batch", "must be 1 .. " + std::to_string(isa::kMaxTmvBatch) + " vectors");
  }
  return ok_status();
}

std::vector<ArgSpec> Gemv::signature() const {
  std::vector<ArgSpec> s{ArgSpec::buffer("w", Access::kIn, p_.weight, p_.m * p_.k),
                         ArgSpec::buffer("x", Access::kIn, DType::kF32, uint64_t{p_.batch} * p_.k),
                         ArgSpec::buffer("y", Access::kOut, DType::kF32, uint64_t{p_.batch} * p_.m)};
  if (p_.batch_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

StatusOr<uint32_t> Gemv::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const GemvPlan plan = plan_gemv(p_, target);
  if (plan.local_bytes > target.local_bytes) {
    return invalid_param(name(), p_.rows_per_tile ? "rows_per_tile" : "k_tile",
                         "makes tiles of " + std::to_string(plan.local_bytes) + " bytes, more than the " +
                             std::to_string(target.local_bytes) + " bytes of local memory");
  }
  if (plan.rows_per_tile > kMaxTileDim) return invalid_param(name(), "rows_per_tile", "must be <= 65535");
  const int64_t row_bytes = static_cast<int64_t>(isa::dtype_bytes(p_.weight, p_.k));
  const uint64_t kt = plan.k_tile;
  const uint64_t full_chunks = p_.k / kt, tail = p_.k % kt;

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t w = ctx.arg("w");
  const uint8_t x = ctx.arg("x");
  const uint8_t y = ctx.arg("y");
  const Reg bid{0}, first{1}, count{2}, left{3}, rows{4}, w_row{5}, y_off{6}, w_off{7}, x_off{8}, w_stride{9},
      chunks{10}, zero{11}, vectors{12}, x_pitch{13}, y_pitch{14};
  const Tile tx{1}, tacc{2};
  // A batch holds its vectors as the rows of x (vectors x k) and of the accumulator
  // (vectors x rows); one vector keeps the GEMV's 1 x k and rows x 1 shapes.
  const bool batch = batched(p_);
  const auto def_x = [&](uint64_t cols, Reg at) {
    if (batch) {
      b.tdef(tx, DType::kF32, vectors, static_cast<int>(cols), plan.x_local);
      b.tld(tx, x, at, DType::kF32, x_pitch);
    } else {
      b.tdef(tx, DType::kF32, 1, static_cast<int>(cols), plan.x_local);
      b.tld(tx, x, at, DType::kF32);
    }
  };

  // One k chunk of the current row tile: x's chunk (resident: already in local
  // memory) times the matching columns of the weight rows, straight from GM.
  const auto emit_chunk = [&](uint64_t cols, bool first_chunk) {
    if (!plan.x_resident) def_x(cols, first_chunk ? zero : x_off);
    b.tmv(tacc, w, first_chunk ? w_row : w_off, w_stride, tx, p_.weight, /*accumulate=*/!first_chunk);
  };
  const auto next_chunk = [&] {
    b.alui(AluOp::kAdd, w_off, w_off, static_cast<int64_t>(isa::dtype_bytes(p_.weight, kt)));
    b.alui(AluOp::kAdd, x_off, x_off, static_cast<int64_t>(kt * 4));
  };

  b.block_id(bid);
  emit_block_range(b, bid, static_cast<int64_t>(plan.row_tiles), plan.grid, first, count);
  const int64_t rpt = static_cast<int64_t>(plan.rows_per_tile);
  b.alui(AluOp::kMul, left, first, -rpt);
  b.alui(AluOp::kAdd, left, left, static_cast<int64_t>(p_.m));  // rows from the block's first row on
  b.alui(AluOp::kMul, w_row, first, rpt * row_bytes);
  b.alui(AluOp::kMul, y_off, first, rpt * 4);
  b.li(w_stride, row_bytes);
  b.li(zero, 0);
  if (batch) {
    if (p_.batch_runtime) {
      b.arg_value(vectors, ctx.arg(kRowsScalar));
      b.alui(AluOp::kMax, vectors, vectors, 1);  // 1 .. batch vectors
      b.alui(AluOp::kMin, vectors, vectors, static_cast<int64_t>(p_.batch));
    } else {
      b.li(vectors, static_cast<int64_t>(p_.batch));
    }
    b.li(x_pitch, static_cast<int64_t>(p_.k));
    b.li(y_pitch, static_cast<int64_t>(p_.m));
  }
  if (plan.x_resident) def_x(p_.k, zero);
  // A block's single row tile (every decode GEMV on 8 cores) needs no loop around it.
  const bool one_tile = even_block_count(static_cast<int64_t>(plan.row_tiles), plan.grid) == 1;
  if (!one_tile) b.loop_begin(count);
  b.alui(AluOp::kMin, rows, left, rpt);  // only the matrix's last row tile may be short
  if (batch) {
    b.tdef(tacc, DType::kF32, vectors, rows, plan.acc_local);
  } else {
    b.tdef(tacc, DType::kF32, rows, 1, plan.acc_local);
  }
  emit_chunk(kt, true);
  if (full_chunks > 1 || tail) {
    b.mov(w_off, w_row);
    b.li(x_off, 0);
  }
  if (full_chunks > 1) {
    b.li(chunks, static_cast<int64_t>(full_chunks - 1));
    b.loop_begin(chunks);
    next_chunk();
    emit_chunk(kt, false);
    b.loop_end();
  }
  if (tail) {
    next_chunk();
    emit_chunk(tail, false);
  }
  if (p_.epilogue == GemvEpilogue::kGeluTanh) b.tun(isa::UnOp::kGeluTanh, tacc, tacc);
  if (p_.epilogue == GemvEpilogue::kSilu) b.tun(isa::UnOp::kSilu, tacc, tacc);
  if (batch) {
    b.tst(tacc, y, y_off, DType::kF32, y_pitch);
  } else {
    b.tst(tacc, y, y_off, DType::kF32);
  }
  if (!one_tile) {
    // Every row tile but the matrix's last is whole, so the next one starts rpt rows on.
    b.alui(AluOp::kAdd, w_row, w_row, rpt * row_bytes);
    b.alui(AluOp::kAdd, y_off, y_off, rpt * 4);
    b.alui(AluOp::kSub, left, left, rpt);
    b.loop_end();
  }
  b.reserve_local(plan.local_bytes);
  return static_cast<uint32_t>(plan.grid);
}

void Gemv::compute_reference(std::span<const HostArg> args) const {
  const uint64_t row_bytes = isa::dtype_bytes(p_.weight, p_.k);
  const uint64_t vectors = p_.batch_runtime ? std::clamp<int64_t>(args[3].as_i64(), 1, p_.batch) : p_.batch;
  const std::vector<float> x = read_f32(args[1], DType::kF32);
  std::vector<float> y = read_f32(args[2], DType::kF32);
  // Row by row: the whole of a large matrix in f32 would be gigabytes.
  for (uint64_t i = 0; i < p_.m; ++i) {
    const HostArg row_arg = HostArg::buffer(args[0].bytes.subspan(i * row_bytes, row_bytes));
    const std::vector<float> row = read_f32(row_arg, p_.weight);
    for (uint64_t t = 0; t < vectors; ++t) {
      double sum = 0;
      for (uint64_t j = 0; j < p_.k; ++j) sum += static_cast<double>(row[j]) * x[t * p_.k + j];
      y[t * p_.m + i] = apply_epilogue(p_.epilogue, static_cast<float>(sum));
    }
  }
  write_f32(args[2], DType::kF32, y);
}

}  // namespace npurt::ops
