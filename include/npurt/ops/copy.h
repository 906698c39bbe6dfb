// Data movement: contiguous copies with dtype conversion, strided 2-D copies (the
// KV-cache append), and 2-D transposes.
//
// Copy: "src" (in, n elements of src_dtype) -> "dst" (out, n elements of dst_dtype).
//   Conversions round to nearest even, so a copy is exact whenever dst_dtype can hold
//   every value (f32 <- bf16/f16, and any same-type copy).
//
// StridedCopy: rows x cols elements from "src" (row r at element r * src_stride) into
//   "dst" (row r at element (dst_row + r) * dst_stride). dst is inout: elements the
//   copy does not write keep their contents. The row offset dst_row is 0, or with
//   dst_row_runtime the value of the i32 scalar argument "dst_row" (after "dst"),
//   read at launch: a KV-cache append writes one new row at position p this way with
//   one compiled kernel. A dst_row that puts any row outside dst faults the launch
//   (GM accesses are bounds-checked); nothing is written out of bounds.
//   With src_row_runtime the copy reads from row "src_row" of src (a scalar after
//   dst_row), and with rows_runtime only the first "rows" rows (the last scalar) are
//   copied: batched prefill appends a runtime number of KV rows and takes the last
//   token's row this way. src then has src_rows rows (0: rows).
//   With dst_row_index, src row r goes to row dst_row_of[r] of dst instead, from the
//   i32 buffer "dst_row_of" (rows entries, the last argument): the KV append of a
//   batch of sequences into a paged pool (models/kv_blocks.h's AppendPlan::rows). An
//   index outside [0, dst_rows) faults the launch before that row is stored.
//   Buffers: src has (rows - 1) * src_stride + cols elements, dst
//   (dst_rows - 1) * dst_stride + cols, so a copy may target a column slice.
//
// Transpose: "src" (in, rows x cols of dtype) -> "dst" (out, cols x rows of dtype).
//   There is no transpose instruction; each tile is multiplied by an identity
//   matrix (dst tile = I * src_tile^T with TMMA's transposed operand), which
//   reproduces every finite value exactly, with two caveats: -0 becomes +0 (the
//   products with the identity's zeros add +0), and an Inf or NaN in a src row
//   turns every dst value of that row within the same tile into NaN (Inf * 0 = NaN).
//   Callers that transpose non-finite data need a different path.
//
// dtypes are f32, bf16 or f16 throughout.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct CopyParams {
  uint64_t n = 0;
  isa::DType src_dtype = isa::DType::kF32;
  isa::DType dst_dtype = isa::DType::kF32;
  uint32_t tile = 0;   // elements per tile; 0: chosen by the operator
  uint32_t cores = 0;  // blocks; 0: the target's cores
};

class Copy final : public OperatorWith<CopyParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
};

struct StridedCopyParams {
  uint64_t rows = 1;
  uint32_t cols = 0;
  uint64_t src_stride = 0;  // elements between src rows; 0: cols
  uint64_t dst_stride = 0;  // elements between dst rows; 0: cols
  uint64_t dst_rows = 0;    // rows of dst; 0: rows
  uint64_t src_rows = 0;    // rows of src; 0: rows
  bool dst_row_runtime = false;
  // The i32 scalar "src_row" (after dst_row, if any): src rows start at that row.
  bool src_row_runtime = false;
  // The i32 scalar "rows" (last): only the first `rows` rows are copied at run time.
  bool rows_runtime = false;
  // The i32 buffer "dst_row_of" (last) gives each row's dst row; not with dst_row_runtime
  // or src_row_runtime.
  bool dst_row_index = false;
  isa::DType src_dtype = isa::DType::kF32;
  isa::DType dst_dtype = isa::DType::kF32;
  uint32_t rows_per_tile = 0;  // 0: chosen by the operator
  uint32_t cores = 0;          // blocks; 0: the target's cores
};

class StridedCopy final : public OperatorWith<StridedCopyParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint64_t src_stride() const { return p_.src_stride ? p_.src_stride : p_.cols; }
  uint64_t dst_stride() const { return p_.dst_stride ? p_.dst_stride : p_.cols; }
  uint64_t dst_rows() const { return p_.dst_rows ? p_.dst_rows : p_.rows; }
  uint64_t src_rows() const { return p_.src_rows ? p_.src_rows : p_.rows; }
  StatusOr<uint32_t> emit_indexed(EmitContext& ctx) const;
};

struct TransposeParams {
  uint64_t rows = 0;  // of src
  uint64_t cols = 0;  // of src
  isa::DType dtype = isa::DType::kF32;
  uint32_t tile_rows = 0;  // src rows per tile; 0: chosen by the operator
  uint32_t tile_cols = 0;  // src cols per tile (the identity's size); 0: chosen by the operator
  uint32_t cores = 0;      // blocks; 0: the target's cores
};

class Transpose final : public OperatorWith<TransposeParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint64_t tile_rows() const;
  uint64_t tile_cols() const;
};

}  // namespace npurt::ops
