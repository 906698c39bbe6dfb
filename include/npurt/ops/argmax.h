// Argmax: the index of the first maximum of an n-element f32 vector (greedy
// sampling over Gemma's 262144 logits).
//
// Arguments: "x" (in, n f32), "index" (out, 1 i32). NaN never wins: it counts as
// -inf, and a vector with no value above -inf yields 0. Ties go to the lowest index.
//
// One block does the whole vector: it reduces rows of `chunk` elements, many rows per
// load, keeping each row's maximum and its position in local memory, then takes the
// first row holding the overall maximum. At 262144 elements the loads and reductions
// dominate and a handful of instructions suffice, so splitting over cores would add
// a grid-wide barrier and a scratch buffer without making the operator faster.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct ArgmaxParams {
  uint64_t n = 0;
  uint32_t chunk = 0;  // elements per reduced row; 0: chosen by the operator
};

class Argmax final : public OperatorWith<ArgmaxParams, InPlace::kUnsafe> {
 public:
  using OperatorWith::OperatorWith;
  std::string name() const override;
  Status validate() const override;
  std::vector<isa::ArgSpec> signature() const override;

 protected:
  StatusOr<uint32_t> emit(EmitContext& ctx) const override;
  void compute_reference(std::span<const HostArg> args) const override;

 private:
  uint64_t chunk() const;
};

}  // namespace npurt::ops
