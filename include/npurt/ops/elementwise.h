// Elementwise operators over n-element vectors: add, mul, gelu-tanh, silu and the
// fused gelu_tanh(a) * b of gated MLPs.
//
// Arguments: "a" (in), "b" (in, binary ops only), "out" (out), all of `dtype`
// (f32, bf16 or f16); math is f32 on the cores. The vector is cut into tiles of
// `tile` elements spread over the cores in contiguous ranges; the last tile may be
// short, so any n works.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

enum class ElementwiseKind : uint8_t { kAdd, kMul, kGeluTanh, kSilu, kGeluTanhMul };

struct ElementwiseParams {
  ElementwiseKind kind = ElementwiseKind::kAdd;
  uint64_t n = 0;
  isa::DType dtype = isa::DType::kF32;
  uint32_t tile = 0;   // elements per tile; 0: chosen by the operator
  uint32_t cores = 0;  // blocks; 0: the target's cores
  // Nonzero: n is rows of `row_elems` elements and the i32 scalar "rows" (last
  // argument) says how many leading rows a launch processes (batched prefill); the
  // other elements are left as they are.
  uint64_t row_elems = 0;
};

class Elementwise final : public OperatorWith<ElementwiseParams, InPlace::kSafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  bool binary() const { return p_.kind != ElementwiseKind::kGeluTanh && p_.kind != ElementwiseKind::kSilu; }
};

// Host f32 definitions shared by references: the same formulas the cores use.
float gelu_tanh_ref(float x);
float silu_ref(float x);

}  // namespace npurt::ops
