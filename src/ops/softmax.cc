#include "npurt/ops/softmax.h"

#include <cmath>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

constexpr char kOp[] = "softmax";
// |offset| bound: keeps every register expression far from int64 overflow.
constexpr int64_t kMaxOffset = int64_t{1} << 40;

// Registers of the kernel; the masked row loop uses the second group.
constexpr Reg kBid{0}, kFirst{1}, kCount{2}, kOff{3}, kLeft{4}, kRows{5}, kBytes{6}, kZero{7};
constexpr Reg kRow{8}, kRowAt{9}, kLo{10}, kHi{11}, kVisible{12}, kAt{13}, kRight{14}, kRowsLeft{15};
// The x tile, the per-row max and sum (full tiles), one row's visible range, the
// masked parts left and right of it, and that row's max and sum.
constexpr Tile kX{0}, kMax{1}, kSum{2}, kSub{3}, kLeftPart{4}, kRightPart{5}, kRowMax{6}, kRowSum{7};

// exp(t - max) / sum over each row of t, with `max`/`sum` tiles of t.rows x 1.
void emit_row_softmax(isa::KernelBuilder& b, Tile t, Tile max, Tile sum) {
  b.tred(RedOp::kMax, max, t);
  b.tbin(BinOp::kSub, t, t, max, isa::kBcastCol);
  b.tun(isa::UnOp::kExp, t, t);
  b.tred(RedOp::kSum, sum, t);
  b.tbin(BinOp::kDiv, t, t, sum, isa::kBcastCol);
}

}  // namespace

int64_t Softmax::offset() const {
  return p_.offset ? *p_.offset : static_cast<int64_t>(p_.cols) - static_cast<int64_t>(p_.rows);
}

std::string Softmax::name() const {
  std::string n = std::string(kOp) + " " + std::to_string(p_.rows) + "x" + std::to_string(p_.cols);
  if (p_.causal) n += " causal" + (p_.offset ? "@" + std::to_string(*p_.offset) : std::string());
  if (p_.window) n += " window " + std::to_string(p_.window);
  return n;
}

Status Softmax::validate() const {
  NPURT_RETURN_IF_ERROR(check_count(kOp, "rows", p_.rows, INT32_MAX, "must be < 2^31"));
  NPURT_RETURN_IF_ERROR(check_count(kOp, "cols", p_.cols, 65535, "must be <= 65535"));
  if (p_.window && !p_.causal) return invalid_param(kOp, "window", "needs causal");
  if (p_.offset && !p_.causal) return invalid_param(kOp, "offset", "needs causal");
  if (p_.offset && (*p_.offset > kMaxOffset || *p_.offset < -kMaxOffset)) {
    return invalid_param(kOp, "offset", "must be within +-2^40");
  }
  return ok_status();
}

std::vector<ArgSpec> Softmax::signature() const {
  const uint64_t n = p_.rows * p_.cols;
  return {ArgSpec::buffer("x", Access::kIn, DType::kF32, n), ArgSpec::buffer("out", Access::kOut, DType::kF32, n)};
}

uint64_t Softmax::rows_per_tile(const Target& target) const {
  if (p_.rows_per_tile) return std::min<uint64_t>(p_.rows_per_tile, p_.rows);
  const uint64_t per_core = ceil_div(p_.rows, cores_of(p_.cores, target));
  return std::max<uint64_t>(1, std::min<uint64_t>(per_core, kTileElements / p_.cols));
}

// The rows of a loaded tile one at a time: each row's visible columns [lo, hi) form
// one contiguous range, so the softmax runs on a register-shaped 1 x (hi - lo)
// sub-tile and the columns outside it are filled with zeros.
namespace {

void emit_masked_rows(isa::KernelBuilder& b, int64_t cols, int64_t offset, int64_t window) {
  b.li(kRowAt, 0);
  b.mov(kRowsLeft, kRows);
  b.loop_begin(kRowsLeft);
  b.alui(AluOp::kAdd, kHi, kRow, offset + 1);  // hi = clamp(row + offset + 1, 0, cols)
  b.alui(AluOp::kMin, kHi, kHi, cols);
  b.alui(AluOp::kMax, kHi, kHi, 0);
  if (window) {
    b.alui(AluOp::kAdd, kLo, kRow, offset - window + 1);  // lo = clamp(row + offset - window + 1, 0, hi)
    b.alui(AluOp::kMax, kLo, kLo, 0);
    b.alu(AluOp::kMin, kLo, kLo, kHi);
  } else {
    b.li(kLo, 0);
  }
  b.alu(AluOp::kSub, kVisible, kHi, kLo);
  b.alui(AluOp::kMul, kAt, kLo, 4);
  b.alu(AluOp::kAdd, kAt, kAt, kRowAt);
  b.tdef(kSub, DType::kF32, 1, kVisible, 0, kAt);
  emit_row_softmax(b, kSub, kRowMax, kRowSum);
  b.tdef(kLeftPart, DType::kF32, 1, kLo, 0, kRowAt);
  b.tfill(kLeftPart, kZero);
  b.alui(AluOp::kMul, kRight, kHi, -1);
  b.alui(AluOp::kAdd, kRight, kRight, cols);
  b.alui(AluOp::kMul, kAt, kHi, 4);
  b.alu(AluOp::kAdd, kAt, kAt, kRowAt);
  b.tdef(kRightPart, DType::kF32, 1, kRight, 0, kAt);
  b.tfill(kRightPart, kZero);
  b.alui(AluOp::kAdd, kRow, kRow, 1);
  b.alui(AluOp::kAdd, kRowAt, kRowAt, cols * 4);
  b.loop_end();
}

}  // namespace

StatusOr<uint32_t> Softmax::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  const uint64_t rpt = rows_per_tile(target);
  NPURT_RETURN_IF_ERROR(local_fits(kOp, p_.rows_per_tile ? "rows_per_tile" : "cols", local_bytes(rpt), target));
  const uint64_t chunks = ceil_div(p_.rows, rpt);
  const uint32_t grid = grid_for(chunks, cores_of(p_.cores, target));
  const int64_t cols = p_.cols;
  const uint32_t max_at = static_cast<uint32_t>(4 * rpt * p_.cols), sum_at = static_cast<uint32_t>(max_at + 4 * rpt);

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t x = ctx.arg("x");
  const uint8_t out = ctx.arg("out");
  b.block_id(kBid);
  emit_block_range(b, kBid, static_cast<int64_t>(chunks), grid, kFirst, kCount);
  b.li(kZero, 0);  // f32 +0
  b.alui(AluOp::kMul, kRow, kFirst, static_cast<int64_t>(rpt));
  b.alui(AluOp::kMul, kOff, kRow, cols * 4);
  b.alui(AluOp::kMul, kLeft, kRow, -1);
  b.alui(AluOp::kAdd, kLeft, kLeft, static_cast<int64_t>(p_.rows));
  b.tdef(kRowMax, DType::kF32, 1, 1, max_at);
  b.tdef(kRowSum, DType::kF32, 1, 1, sum_at);
  b.loop_begin(kCount);
  b.alui(AluOp::kMin, kRows, kLeft, static_cast<int64_t>(rpt));  // the last tile may be short
  b.tdef(kX, DType::kF32, kRows, static_cast<int>(cols), 0);
  b.tld(kX, x, kOff, DType::kF32);
  if (p_.causal) {
    emit_masked_rows(b, cols, offset(), p_.window);
  } else {
    b.tdef(kMax, DType::kF32, kRows, 1, max_at);
    b.tdef(kSum, DType::kF32, kRows, 1, sum_at);
    emit_row_softmax(b, kX, kMax, kSum);
  }
  b.tst(kX, out, kOff, DType::kF32);
  emit_advance(b, kOff, kRows, cols * 4, kBytes);
  b.alu(AluOp::kSub, kLeft, kLeft, kRows);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(local_bytes(rpt)));
  return static_cast<uint32_t>(grid);
}

void Softmax::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> x = read_f32(args[0], DType::kF32);
  std::vector<float> out(x.size(), 0.f);
  const int64_t off = offset();
  const auto visible = [&](int64_t i, int64_t j) {
    if (p_.causal && j > i + off) return false;
    if (p_.window && j <= i + off - static_cast<int64_t>(p_.window)) return false;
    return true;
  };
  for (uint64_t i = 0; i < p_.rows; ++i) {
    const float* row = &x[i * p_.cols];
    float* o = &out[i * p_.cols];
    float max = -INFINITY;
    for (uint32_t j = 0; j < p_.cols; ++j) {
      if (visible(i, j)) max = std::max(max, row[j]);
    }
    double sum = 0;
    for (uint32_t j = 0; j < p_.cols; ++j) {
      if (visible(i, j)) sum += std::exp(static_cast<double>(row[j]) - max);
    }
    for (uint32_t j = 0; j < p_.cols; ++j) {
      if (visible(i, j)) o[j] = static_cast<float>(std::exp(static_cast<double>(row[j]) - max) / sum);
    }
  }
  write_f32(args.back(), DType::kF32, out);
}

}  // namespace npurt::ops
