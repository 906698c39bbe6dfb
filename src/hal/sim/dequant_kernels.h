// Vectorized weight decoding for the simulated cores: dequantization for TLDQ and
// quantized TGATHER, and row dot products straight from GM for TMV.
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

// y[i] = (accumulate ? y[i] : 0) + sum_{j<k} row_i[j] * x[j] for i < rows, where row i
// holds k values of `type` (plain f32/bf16/f16 or quantized; k a multiple of the
// block size) starting at byte i * row_stride_bytes of w. Products and sums are f32;
// quantized blocks (K types: 32-value sub-blocks) are summed unscaled and then
// multiplied by their scale, so results match dequantize-then-dot up to f32
// rounding, not bit for bit. On CPUs with AVX512_VNNI, Q4_0, Q5_0, Q4_K and Q6_K rows
// take x in fixed point per group of 16 or 32 values (block sums exact in integers),
// which adds an error of at most 2^-20 max|x| of the group per |weight|.
void matvec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate);

// matvec for `batch` vectors: x holds them (batch x k, rows contiguous), y the results
// (batch x rows). Each weight row is read from memory once for every vector (rows are
// taken in groups that stay in cache while each vector uses them), and each vector's
// results are bitwise what matvec of that vector alone gives, whatever the batch and
// the vector's place in it: a row's sums never depend on the other rows or vectors.
void matvec_batch(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                  size_t batch, float* y, bool accumulate);

// WRONG, for tests only: with batch > 1, matvec_batch sums each vector's products in
// another order (dequantized row, last to first), so batch-invariance tests can fail.
bool matvec_batch_reorder();
void matvec_set_batch_reorder_for_test(bool reorder);

// Whether TMV may take the fixed-point x path above (default true where the CPU has
// AVX512_VNNI). Tests turn it off to check the f32 kernels on the same machine.
bool matvec_integer_path();
void matvec_set_integer_path_for_test(bool enabled);

}  // namespace npurt::sim
