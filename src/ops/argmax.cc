#include "npurt/ops/argmax.h"

#include <bit>
#include <cmath>
#include <algorithm>
#include <cstring>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr char kOp[] = "argmax";
// Elements per load: large loads amortize the dispatch, 128 KiB leaves room for the
// per-row results.
constexpr uint64_t kLoadElements = 32768;
// Rows are listed in local memory and named by TDEF immediates.
constexpr uint64_t kMaxRows = 65535;

}  // namespace

std::string Argmax::name() const {
  return std::string(kOp) + " f32 " + std::to_string(p_.n) +
         (p_.index_base ? " base " + std::to_string(p_.index_base) : "") + (p_.with_value ? " with value" : "") +
         (p_.vectors > 1 || p_.vectors_runtime
              ? " x" + std::to_string(p_.vectors) + (p_.vectors_runtime ? " (runtime rows)" : "")
              : "");
}

Status Argmax::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "n", p_.n, INT32_MAX, "must be < 2^31 (the index is i32)"));
  if (p_.chunk > 65535) return invalid_param(kOp, "chunk", "must be <= 65535");
  if (ceil_div(p_.n, chunk()) > kMaxRows) return invalid_param(kOp, "chunk", "splits n into more than 65535 rows");
  if (p_.vectors < 1 || p_.vectors > 65535) return invalid_param(kOp, "vectors", "must be 1 .. 65535");
  if (p_.index_base > INT32_MAX - p_.n) {
    return invalid_param(kOp, "index_base", "must be <= 2^31 - 1 - n (the reported index is i32)");
  }
  return ok_status();
}

std::vector<ArgSpec> Argmax::signature() const {
  std::vector<ArgSpec> s{ArgSpec::buffer("x", Access::kIn, DType::kF32, uint64_t{p_.vectors} * p_.n),
                         ArgSpec::buffer("index", Access::kOut, DType::kI32, uint64_t{p_.vectors} * (p_.with_value ? 2 : 1))};
  if (p_.vectors_runtime) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

uint64_t Argmax::chunk() const {
  // Rows of 1024 keep the row list short (256 rows at 262144 elements).
  const uint64_t c = p_.chunk ? p_.chunk : std::max<uint64_t>(1024, ceil_div(p_.n, 4096));
  return std::min<uint64_t>(c, p_.n);
}

StatusOr<uint32_t> Argmax::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t chunk = this->chunk(), rows = ceil_div(p_.n, chunk), full_rows = p_.n / chunk;
  const uint64_t tail = p_.n % chunk;
  const uint64_t rows_per_load = std::clamp<uint64_t>(kLoadElements / chunk, 1, std::max<uint64_t>(full_rows, 1));
  // Local layout: the loaded rows, each row's maximum (f32), its position (i32), the
  // best row and the result (index, then the value).
  const uint64_t max_at = 4 * rows_per_load * chunk, pos_at = max_at + 4 * rows, best_at = pos_at + 4 * rows;
  const uint64_t local = best_at + 12;
  NPURT_RETURN_IF_ERROR(local_fits(kOp, "chunk", local, target));
  const int chunk_cols = static_cast<int>(chunk), nrows = static_cast<int>(rows);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t x = ctx.arg("x");
  const uint8_t index = ctx.arg("index");
  const Reg loads{0}, left{1}, off{2}, slot{3}, nload{4}, bytes{5}, zero{6}, best_row{7}, best_col{8}, result{9},
      value_off{10}, bid{11}, vec{12}, vec_count{13}, x_base{14}, out_off{15}, total{16}, per{17};
  const Tile data{0}, maxima{1}, positions{2}, best{3}, out{4}, value{5};
  // Several vectors: each block takes a range of them, one after another.
  const int64_t out_bytes = p_.with_value ? 8 : 4;
  const uint32_t grid = grid_for(p_.vectors, cores_of(0, target));
  b.block_id(bid);
  if (p_.vectors_runtime) {
    b.arg_value(total, ctx.arg(kRowsScalar));
    b.alui(AluOp::kMax, total, total, 1);
    b.alui(AluOp::kMin, total, total, p_.vectors);
    emit_block_range_at_run_time(b, bid, total, grid, vec, vec_count, per);
  } else {
    emit_block_range(b, bid, p_.vectors, grid, vec, vec_count);
  }
  b.alui(AluOp::kMul, x_base, vec, static_cast<int64_t>(p_.n) * 4);
  b.alui(AluOp::kMul, out_off, vec, out_bytes);
  b.loop_begin(vec_count);
  b.li(loads, static_cast<int64_t>(ceil_div(full_rows, rows_per_load)));
  b.li(left, static_cast<int64_t>(full_rows));
  b.mov(off, x_base);
  b.li(slot, 0);  // byte offset of the next row's entries in the maxima/positions lists
  b.loop_begin(loads);
  b.alui(AluOp::kMin, nload, left, static_cast<int64_t>(rows_per_load));
  b.tdef(data, DType::kF32, nload, chunk_cols, 0);
  b.tld(data, x, off, DType::kF32);
  b.tdef(maxima, DType::kF32, nload, 1, static_cast<uint32_t>(max_at), slot);
  b.tdef(positions, DType::kI32, nload, 1, static_cast<uint32_t>(pos_at), slot);
  b.tred(RedOp::kMax, maxima, data);
  b.tred(RedOp::kArgmax, positions, data);
  emit_advance(b, off, nload, static_cast<int64_t>(chunk) * 4, bytes);
  emit_advance(b, slot, nload, 4, bytes);
  b.alu(AluOp::kSub, left, left, nload);
  b.loop_end();
  if (tail) {  // the short last row; off and slot point at it
    b.tdef(data, DType::kF32, 1, static_cast<int>(tail), 0);
    b.tld(data, x, off, DType::kF32);
    b.tdef(maxima, DType::kF32, 1, 1, static_cast<uint32_t>(max_at), slot);
    b.tdef(positions, DType::kI32, 1, 1, static_cast<uint32_t>(pos_at), slot);
    b.tred(RedOp::kMax, maxima, data);
    b.tred(RedOp::kArgmax, positions, data);
  }
  // The first row holding the overall maximum holds the first maximum.
  b.tdef(maxima, DType::kF32, 1, nrows, static_cast<uint32_t>(max_at));
  b.tdef(positions, DType::kI32, 1, nrows, static_cast<uint32_t>(pos_at));
  b.tdef(best, DType::kI32, 1, 1, static_cast<uint32_t>(best_at));
  b.tred(RedOp::kArgmax, best, maxima);
  b.li(zero, 0);
  b.tget(best_row, best, zero);
  b.tget(best_col, positions, best_row);
  b.alui(AluOp::kMul, result, best_row, static_cast<int64_t>(chunk));
  b.alu(AluOp::kAdd, result, result, best_col);
  if (p_.with_value) {
    // x[result] reloaded, not the row maximum: TRED max may return either zero of
    // -0 == +0. TRED max of one element is the element, or -inf for NaN. It lands in
    // the result's second slot.
    b.alui(AluOp::kMul, value_off, result, 4);
    b.alu(AluOp::kAdd, value_off, value_off, x_base);
    b.tdef(value, DType::kF32, 1, 1, static_cast<uint32_t>(best_at + 8));
    b.tld(value, x, value_off, DType::kF32);
    b.tred(RedOp::kMax, value, value);
  }
  if (p_.index_base) b.alui(AluOp::kAdd, result, result, static_cast<int64_t>(p_.index_base));
  b.tdef(out, DType::kI32, 1, 1, static_cast<uint32_t>(best_at + 4));
  b.tfill(out, result);
  if (p_.with_value) b.tdef(out, DType::kI32, 1, 2, static_cast<uint32_t>(best_at + 4));
  b.tst(out, index, out_off, DType::kI32);
  b.alui(AluOp::kAdd, x_base, x_base, static_cast<int64_t>(p_.n) * 4);
  b.alui(AluOp::kAdd, out_off, out_off, out_bytes);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local));
  return grid;
}

void Argmax::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> all = read_f32(args[0], DType::kF32);
  const uint64_t vectors = p_.vectors_runtime ? std::clamp<int64_t>(args[2].as_i64(), 1, p_.vectors) : p_.vectors;
  const uint64_t words = p_.with_value ? 2 : 1;
  for (uint64_t v = 0; v < vectors; ++v) {
    const float* x = all.data() + v * p_.n;
    float best = -INFINITY;
    uint64_t best_index = 0;
    for (uint64_t i = 0; i < p_.n; ++i) {
      if (x[i] > best) {  // false for NaN, and for later equal values
        best = x[i];
        best_index = i;
      }
    }
    // Written as raw i32: an f32 round trip would lose indices above 2^24. `best` is
    // x[best_index], or -inf when nothing beats it.
    const int32_t result[2] = {static_cast<int32_t>(best_index + p_.index_base), std::bit_cast<int32_t>(best)};
    std::memcpy(args[1].bytes.data() + v * words * 4, result, words * 4);
  }
}

int32_t argmax_pick(std::span<const int32_t> pairs) {
  int32_t best_index = pairs[0];
  float best = std::bit_cast<float>(pairs[1]);
  for (size_t i = 2; i + 1 < pairs.size(); i += 2) {
    const float v = std::bit_cast<float>(pairs[i + 1]);
    if (v > best || (v == best && pairs[i] < best_index)) {
      best = v;
      best_index = pairs[i];
    }
  }
  return best_index;
}

}  // namespace npurt::ops
