#include "npurt/ops/elementwise.h"

#include <algorithm>
#include <cmath>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

namespace {

const char* kind_name(ElementwiseKind k) {
  switch (k) {
    case ElementwiseKind::kAdd: return "add";
    case ElementwiseKind::kMul: return "mul";
    case ElementwiseKind::kGeluTanh: return "gelu_tanh";
    case ElementwiseKind::kSilu: return "silu";
    case ElementwiseKind::kGeluTanhMul: return "gelu_tanh_mul";
  }
  return "?";
}

}  // namespace

float gelu_tanh_ref(float x) {
  const double xd = x;
  return static_cast<float>(0.5 * xd * (1.0 + std::tanh(0.7978845608028654 * (xd + 0.044715 * xd * xd * xd))));
}

float silu_ref(float x) { return static_cast<float>(x / (1.0 + std::exp(-static_cast<double>(x)))); }

std::string Elementwise::name() const {
  return std::string(kind_name(p_.kind)) + " " + std::string(isa::dtype_name(p_.dtype)) + " " + std::to_string(p_.n) +
         (p_.row_elems ? " (runtime rows of " + std::to_string(p_.row_elems) + ")" : "");
}

Status Elementwise::validate() const {
  const std::string op = kind_name(p_.kind);
  if (static_cast<uint8_t>(p_.kind) > static_cast<uint8_t>(ElementwiseKind::kGeluTanhMul)) {
    return invalid_param("elementwise", "kind", "is not a known elementwise operation");
  }
  if (p_.n == 0) return invalid_param(op, "n", "must be > 0");
  if (!is_float_io(p_.dtype)) return invalid_param(op, "dtype", "must be f32, bf16 or f16");
  if (p_.tile > 16384) return invalid_param(op, "tile", "must be <= 16384 elements");
  if (p_.row_elems && p_.n % p_.row_elems != 0) return invalid_param(op, "row_elems", "must divide n");
  return ok_status();
}

std::vector<ArgSpec> Elementwise::signature() const {
  std::vector<ArgSpec> s{ArgSpec::buffer("a", Access::kIn, p_.dtype, p_.n)};
  if (binary()) s.push_back(ArgSpec::buffer("b", Access::kIn, p_.dtype, p_.n));
  s.push_back(ArgSpec::buffer("out", Access::kOut, p_.dtype, p_.n));
  if (p_.row_elems) s.push_back(ArgSpec::scalar(kRowsScalar, DType::kI32));
  return s;
}

StatusOr<uint32_t> Elementwise::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  // 4096 f32 elements per operand: two tiles use 32 KiB of local memory and each
  // instruction amortizes its dispatch over enough elements.
  const uint64_t tile = p_.tile ? p_.tile : std::min<uint64_t>(4096, p_.n);
  const uint32_t grid = grid_for(ceil_div(p_.n, tile), cores_of(p_.cores, target));
  const int64_t esize = static_cast<int64_t>(isa::dtype_size(p_.dtype));

  isa::KernelBuilder& b = ctx.builder;
  const uint8_t a = ctx.arg("a");
  const uint8_t bb = binary() ? ctx.arg("b") : 0;
  const uint8_t out = ctx.arg("out");
  const Reg bid{0}, first{1}, count{2}, off{3}, cols{4}, left{5}, bytes{6}, total{7}, tiles{8}, per{9};
  const Tile ta{0}, tb{1};
  b.block_id(bid);
  // Rows of row_elems at run time, else n elements as one row.
  const uint64_t row = p_.row_elems ? p_.row_elems : p_.n;
  emit_row_tiles(b, ctx, p_.row_elems != 0, p_.n / row, row, tile, grid, {bid, total, tiles, per, first, count});
  b.alui(AluOp::kMul, off, first, static_cast<int64_t>(tile) * esize);  // byte offset of the first chunk
  b.alui(AluOp::kMul, left, first, -static_cast<int64_t>(tile));
  b.alu(AluOp::kAdd, left, left, total);  // elements from the first chunk on
  b.loop_begin(count);
  b.alui(AluOp::kMin, cols, left, static_cast<int64_t>(tile));  // the last tile may be short
  b.tdef(ta, DType::kF32, 1, cols, 0);
  b.tdef(tb, DType::kF32, 1, cols, static_cast<uint32_t>(tile * 4));
  b.tld(ta, a, off, p_.dtype);
  if (binary()) b.tld(tb, bb, off, p_.dtype);
  switch (p_.kind) {
    case ElementwiseKind::kAdd: b.tbin(isa::BinOp::kAdd, ta, ta, tb); break;
    case ElementwiseKind::kMul: b.tbin(isa::BinOp::kMul, ta, ta, tb); break;
    case ElementwiseKind::kGeluTanh: b.tun(isa::UnOp::kGeluTanh, ta, ta); break;
    case ElementwiseKind::kSilu: b.tun(isa::UnOp::kSilu, ta, ta); break;
    case ElementwiseKind::kGeluTanhMul:
      b.tun(isa::UnOp::kGeluTanh, ta, ta);
      b.tbin(isa::BinOp::kMul, ta, ta, tb);
      break;
  }
  b.tst(ta, out, off, p_.dtype);
  emit_advance(b, off, cols, esize, bytes);
  b.alu(AluOp::kSub, left, left, cols);
  b.loop_end();
  b.reserve_local(static_cast<uint32_t>(tile * 8));
  return static_cast<uint32_t>(grid);
}

void Elementwise::compute_reference(std::span<const HostArg> args) const {
  const std::vector<float> a = read_f32(args[0], p_.dtype);
  const std::vector<float> b = binary() ? read_f32(args[1], p_.dtype) : std::vector<float>();
  const HostArg& out_arg = args[binary() ? 2 : 1];
  std::vector<float> out = read_f32(out_arg, p_.dtype);
  const uint64_t n =
      p_.row_elems ? std::min<uint64_t>(p_.n, std::max<int64_t>(0, args.back().as_i64()) * p_.row_elems) : p_.n;
  for (uint64_t i = 0; i < n; ++i) {
    switch (p_.kind) {
      case ElementwiseKind::kAdd: out[i] = a[i] + b[i]; break;
      case ElementwiseKind::kMul: out[i] = a[i] * b[i]; break;
      case ElementwiseKind::kGeluTanh: out[i] = gelu_tanh_ref(a[i]); break;
      case ElementwiseKind::kSilu: out[i] = silu_ref(a[i]); break;
      case ElementwiseKind::kGeluTanhMul: out[i] = gelu_tanh_ref(a[i]) * b[i]; break;
    }
  }
  write_f32(out_arg, p_.dtype, out);
}

}  // namespace npurt::ops
