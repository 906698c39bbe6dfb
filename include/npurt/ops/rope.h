// Rope: rotary position embedding, NeoX half-rotation (Gemma 3's q and k heads).
//
// For each of `n_heads` heads of `head_dim` contiguous values, with r = rotary_dim,
// half = r / 2 and j in [0, half):
//   theta_j    = pos * base^(-2j / r)
//   y[j]        = x[j] cos(theta_j) - x[j + half] sin(theta_j)
//   y[j + half] = x[j] sin(theta_j) + x[j + half] cos(theta_j)
// and y[i] = x[i] for i in [r, head_dim) (no such values when r = head_dim).
//
// Arguments: "x" (in, f32, n_heads x head_dim), "out" (out, f32, n_heads x head_dim),
// "pos" (scalar i32, the token position), "base" (scalar f32, e.g. 10000 for Gemma's
// local layers and 1e6 for its global ones). Position and base are read at run time,
// so one compiled kernel serves every decode step and every layer of a shape.
// `out` may be bound to the same buffer as `x`: every tile is loaded completely
// before it is written and the blocks own disjoint heads.
//
// The cores compute the angles themselves, in f32: inv_freq_j = exp(e_j * log(base))
// with e_j = -2j/r from the image constants, theta_j = f32(pos) * inv_freq_j, then
// sin/cos (a few ulp; see the TUN ops in docs/isa.md). A base <= 0 or NaN gives NaN
// outputs.
//
// Accuracy: theta is an f32 product, as in every f32 RoPE, so the angle is only as
// exact as f32 allows: its rounding is up to pos * 2^-24 rad (about 2e-3 rad at pos
// 32767), which alone puts any f32 RoPE at a rel-L2 of about 8e-9 * pos from the
// exact rotation (3e-5 at pos 4095, 3e-4 at pos 32767). The cores' inv_freq is
// within a few ulp of the correctly rounded value but not bit-identical to it (no
// f32 exp/log chain is), and pos multiplies that difference the same way; sin/cos
// and the rotation add about 1e-7. Against the reference below, and against the
// exact rotation, the kernel measures rel-L2 <= 1e-5 up to pos ~1000 and about
// 8e-9 * pos beyond (3.1e-5 at 4095, 3.1e-4 at 32767). The reference computes
// inv_freq_j = f32(base^(-2j/r)) correctly rounded (in double), theta = f32(pos) *
// inv_freq_j in f32, and the trigonometry and rotation in double.
#pragma once

#include <cstdint>

#include "npurt/ops/operator.h"

namespace npurt::ops {

struct RopeParams {
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;        // even
  uint32_t rotary_dim = 0;      // leading dimensions rotated, even, <= head_dim; 0: head_dim
  uint32_t heads_per_tile = 0;  // 0: chosen by the operator
  uint32_t cores = 0;           // blocks; 0: the target's cores
  // Batched (prefill): 0 rotates one token at "pos"; T > 0 makes x and out T tokens
  // of n_heads heads each, token i at position pos + i, with the i32 scalar "rows"
  // (last) giving how many leading tokens a launch rotates. Angles, sin/cos and the
  // rotation are the same f32 operations as the one-token form, so token i's result
  // is bit-identical to a one-token launch at pos + i.
  uint32_t tokens = 0;
  // With tokens > 0: token i is at position positions[i], from the i32 buffer
  // "positions" (tokens entries, the last argument), instead of pos + i ("pos" is then
  // unused): a batch of sequences, each at its own position. Token i's result is
  // bit-identical to a one-token launch at positions[i].
  bool positions = false;
};

class Rope final : public OperatorWith<RopeParams, InPlace::kSafe> {
  NPURT_OPERATOR_OVERRIDES;

 private:
  uint32_t rotary_dim() const { return p_.rotary_dim ? p_.rotary_dim : p_.head_dim; }
  uint64_t heads_per_tile() const;
  uint64_t local_bytes(uint64_t heads_per_tile) const;
  uint64_t tokens_per_tile(const Target& target) const;
  StatusOr<uint32_t> emit_batched(EmitContext& ctx) const;
};

}  // namespace npurt::ops
