#include "npurt/ops/embedding.h"

#include <bit>
#include <cmath>
#include <limits>

#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"

namespace npurt::ops {

using isa::DType;
using isa::Reg;
using isa::Tile;

namespace {

constexpr const char* kOp = "embedding";

uint64_t row_bytes(DType dtype, uint32_t dim) { return isa::dtype_bytes(dtype, dim); }

}  // namespace

std::string Embedding::name() const {
  return std::string(kOp) + " " + std::string(isa::dtype_name(p_.dtype)) + " " + std::to_string(p_.vocab) + "x" +
         std::to_string(p_.dim);
}

Status Embedding::validate() const {
  if (p_.vocab == 0) return invalid_param(kOp, "vocab", "must be > 0");
  // Tokens are i32 and gather indices are i32 too.
  if (p_.vocab > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_param(kOp, "vocab", "must be <= 2^31 - 1 (tokens are i32)");
  }
  if (p_.dim == 0) return invalid_param(kOp, "dim", "must be > 0");
  if (p_.dim > 65535) return invalid_param(kOp, "dim", "must be <= 65535 (one tile row)");
  if (!isa::dtype_is_valid(static_cast<uint8_t>(p_.dtype)) || p_.dtype == DType::kI32) {
    return invalid_param(kOp, "dtype", "must be f32, bf16, f16 or a quantized block type");
  }
  if (isa::dtype_is_quantized(p_.dtype) && p_.dim % isa::dtype_block_elems(p_.dtype) != 0) {
    return invalid_param(kOp, "dim",
                         "must be a multiple of the " + std::string(isa::dtype_name(p_.dtype)) + " block size " +
                             std::to_string(isa::dtype_block_elems(p_.dtype)));
  }
  if (!std::isfinite(p_.scale)) return invalid_param(kOp, "scale", "must be finite");
  return Status();
}

std::vector<OpArg> Embedding::signature() const {
  return {OpArg::buffer("table", isa::Access::kIn, p_.dtype, p_.vocab * p_.dim),
          OpArg::scalar("token", DType::kI32),
          OpArg::buffer("out", isa::Access::kOut, DType::kF32, p_.dim)};
}

StatusOr<uint32_t> Embedding::emit(EmitContext& ctx) const {
  const Target& target = ctx.target;
  // The i32 index tile sits in the first 16 bytes; the row follows.
  constexpr uint32_t kRowOffset = 16;
  if (kRowOffset + uint64_t{p_.dim} * 4 > target.local_bytes) {
    return invalid_param(kOp, "dim", "row of " + std::to_string(p_.dim) + " f32 does not fit local memory");
  }
  isa::KernelBuilder& b = ctx.builder;
  const uint8_t table = ctx.arg("table");
  const uint8_t token = ctx.arg("token");
  const uint8_t out = ctx.arg("out");
  const Reg tok{0}, pitch{1}, scale{2}, zero{3};
  const Tile index{0}, row{1};
  b.arg_value(tok, token);
  b.li(pitch, static_cast<int64_t>(row_bytes(p_.dtype, p_.dim)));
  b.li(zero, 0);
  b.tdef(index, DType::kI32, 1, 1, 0);
  b.tdef(row, DType::kF32, 1, static_cast<int>(p_.dim), kRowOffset);
  b.tfill(index, tok);  // i32 fill takes the register's low 32 bits: the i32 token
  b.tgather(row, table, index, pitch, p_.dtype);
  if (p_.scale != 1.0f) {
    b.li(scale, std::bit_cast<uint32_t>(p_.scale));
    b.tsop(isa::BinOp::kMul, row, row, scale);
  }
  b.tst(row, out, zero, DType::kF32);
  return static_cast<uint32_t>(1);
}

void Embedding::compute_reference(std::span<const HostArg> args) const {
  const int32_t token = static_cast<int32_t>(args[1].as_i64());
  std::vector<float> out(p_.dim, std::numeric_limits<float>::quiet_NaN());  // the kernel faults: no result
  if (token >= 0 && static_cast<uint64_t>(token) < p_.vocab) {
    const uint64_t bytes = row_bytes(p_.dtype, p_.dim);
    const std::vector<float> row = read_f32(HostArg::buffer(args[0].bytes.subspan(token * bytes, bytes)), p_.dtype);
    for (uint32_t i = 0; i < p_.dim; ++i) out[i] = row[i] * p_.scale;
  }
  write_f32(args[2], DType::kF32, out);
}

}  // namespace npurt::ops
