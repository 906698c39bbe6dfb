// Vectorized weight decoding for the simulated cores: dequantization for TLDQ and
// quantized TGATHER (row dot products for TMV are in matvec_kernels.h).
//
// Produces exactly the bits of isa::dequantize_row (the format's reference decoder):
// the same f32 operations in the same order, only several lanes at a time. The
// implementation (AVX-512, AVX2 or scalar) follows the Highway target chosen for the
// tile kernels (see tile_kernels_set_target_for_test).
#pragma once

#include <cstddef>

#include "npurt/isa/isa.h"

namespace npurt::sim {

// As isa::dequantize_row: n values from consecutive blocks at `blocks` (any
// alignment); n a multiple of the block size; `type` quantized.
void dequantize(const void* blocks, isa::DType type, float* out, size_t n);

}  // namespace npurt::sim
