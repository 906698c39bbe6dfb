// Argmax: the index of the first maximum of an n-element f32 vector (greedy
// sampling over Gemma's 262144 logits).
//
// Arguments: "x" (in, n f32), "index" (out, 1 i32; 2 with `with_value`). NaN never wins: it counts as
// -inf, and a vector with no value above -inf yields 0. Ties go to the lowest index.
//
// Vocabulary shards (tensor-parallel decoding): `index_base` is added to the reported
// index, and `with_value` makes "index" 2 i32: [index, bit pattern of the maximum as
// f32]. The maximum is x at the (unbased) index, or -inf when no value is above -inf,
// so it is never NaN. Each device reports the pair of its shard; argmax_pick()
// combines the gathered pairs into the argmax of the whole vector.
//
// One block does the whole vector: it reduces rows of `chunk` elements, many rows per
// load, keeping each row's maximum and its position in local memory, then takes the
// first row holding the overall maximum. At 262144 elements the loads and reductions
// dominate and a handful of instructions suffice, so splitting over cores would add
// a grid-wide barrier and a scratch buffer without making the operator faster.
#pragma once

#include <cstdint>
#include <span>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct ArgmaxParams {
  uint64_t n = 0;
  uint32_t chunk = 0;  // elements per reduced row; 0: chosen by the operator
  bool with_value = false;  // "index" is [index, f32 bits of the maximum]
  uint64_t index_base = 0;  // added to the index (a shard's first element); base + n < 2^31
  // Several vectors (x: vectors x n, "index": one result per vector, in order), spread
  // over the blocks; with vectors_runtime the i32 scalar "rows" (last) says how many
  // (clamped to 1 .. vectors).
  uint32_t vectors = 1;
  bool vectors_runtime = false;
};

// The global argmax from the [index, value bits] pairs of with_value launches, one per
// shard, concatenated: the largest value, the lowest index among equal values (the
// first maximum of the whole vector when the shards' index_base are their offsets).
// `pairs` must hold at least one pair.
int32_t argmax_pick(std::span<const int32_t> pairs);

class Argmax final : public OperatorWith<ArgmaxParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint64_t chunk() const;
};

}  // namespace npurt::ops
