// Row dot products straight from GM for TMV: y = W x for one vector or a batch.
//
// The results are a property of the tile ISA, not of the CPU that simulates it: every
// Highway target with FMA (AVX-512 with or without VNNI, AVX2) and the portable
// fallback give the same bits, and a vector's results do not depend on the batch it
// is in or its place there. Each kernel fixes its order of operations on 16 "lanes"
// that AVX-512 holds in one register, AVX2 in two and the fallback in an array:
//
//   * Quantized rows (every type Gemma files use: Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)
//     form their products in integers. Each vector is put in fixed point once per
//     call: per group of 32 values (16 for Q6_K) x = s * X with s = 2^e and |X| <=
//     2^20, X = round(x / s). The weights' small integers q (made unsigned by the
//     format's bias) and X are multiplied exactly; lane l of a 64-value piece holds
//     the exact sum of q * X over 4 of its values minus bias * sum X, which is
//     converted to f32 and added to lane l's accumulator with one FMA by the lane's
//     scale (d or d * sc, times s). The K types' minimum terms, (dmin * m_j) * (s_j *
//     sum_j X), accumulate by FMA in 8 more lanes, one per 32-value sub-block. The
//     result is the lane sum by a fixed halving tree (16 -> 8 -> 4 -> 2 -> 1), minus
//     the minimum lanes' sum by the same tree. The one error beyond f32 rounding is
//     rounding x to s * X: at most 2^-20 max|x| of the group per |weight|.
//   * Plain rows (f32, bf16, f16): lane l accumulates w[j] * x[j] by FMA for j = l mod
//     16, in order; the lanes are summed by the same tree, then the k mod 16 values
//     left over are added by FMA in order.
//   * A vector with a non-finite value takes the reference order instead (each row
//     dequantized, products added first to last by FMA), which yields its inf or NaN.
//
// Instructions: VPDPBUSD on CPUs with AVX512_VNNI, VPMADDUBSW + VPMADDWD elsewhere
// (both exact, so both give the same sums).
#pragma once

#include <cstddef>

#include "npurt/isa/isa.h"

namespace npurt::sim {

// y[i] = (accumulate ? y[i] : 0) + sum_{j<k} row_i[j] * x[j] for i < rows, where row i
// holds k values of `type` (plain f32/bf16/f16 or quantized; k a multiple of the
// block size) starting at byte i * row_stride_bytes of w.
void matvec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate);

// matvec for `batch` vectors: x holds them (batch x k, rows contiguous), y the results
// (batch x rows). Each weight row is read from memory once for every vector (rows are
// taken in groups that stay in cache while the vectors use them); each vector's
// results are bitwise what matvec of that vector alone gives.
void matvec_batch(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                  size_t batch, float* y, bool accumulate);

// WRONG, for tests only: with batch > 1, matvec_batch sums each vector's products in
// another order (dequantized row, last to first), so batch-invariance tests can fail.
bool matvec_batch_reorder();
void matvec_set_batch_reorder_for_test(bool reorder);

// Whether the AVX-512 kernels use VPDPBUSD (default: where the CPU has AVX512_VNNI).
// Tests turn it off to run the VPMADDUBSW form on the same machine.
bool matvec_vnni();
void matvec_set_vnni_for_test(bool enabled);

// The instructions the kernels use now, e.g. "AVX3 + VNNI", "AVX2", "SCALAR".
const char* matvec_isa();

}  // namespace npurt::sim
