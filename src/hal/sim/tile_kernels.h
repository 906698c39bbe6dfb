// Tile math executed by the simulated NPU cores: dtype conversion, elementwise and
// unary ops, row reductions and matrix multiply on dense host arrays.
//
// The simulator interprets one tile instruction per call, so every function here is
// an inner loop: callers validate shapes and operands once (the image verifier and
// the core's decoder); these functions only check that enum arguments are in range
// and abort on an out-of-range value, which is an npurt bug.
//
// Implementation choice: the vector implementation (AVX-512, AVX2, or the portable
// scalar fallback) is picked once, on the first call, from the CPU's capabilities;
// all functions then run that implementation. Every implementation with FMA (AVX-512,
// AVX2) gives the same bits for every function: sums run in one canonical order on 16
// lanes whatever the vector width (reduce_rows, matmul), and elementwise functions are
// lane by lane. The portable fallback keeps that order, but Highway's scalar
// multiply-add rounds twice, so its results may differ in the last bits.
//
// Threading: every function is thread-safe and keeps no state between calls except
// a per-thread scratch buffer used by matmul to repack operands; it grows to the
// largest operand seen on that thread and is then reused, so steady-state calls do
// not allocate.
//
// Memory: pointers need no particular alignment beyond their element type's; 16-bit
// element arrays (bf16, f16) are raw bit patterns stored as uint16_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "npurt/isa/isa.h"

namespace npurt::sim {

// Converts n contiguous elements between plain dtypes (f32, bf16, f16, i32).
//   * f32 -> bf16 and f32 -> f16 round to nearest even; values beyond the f16 range
//     become infinities; NaN stays NaN (quieted).
//   * bf16/f16 -> f32 is exact (f16 subnormals included).
//   * i32 -> f32 rounds to nearest even; f32 -> i32 truncates toward zero and
//     saturates to [INT32_MIN, INT32_MAX]; NaN becomes 0.
//   * Any other pair goes through f32 (for example i32 -> bf16 rounds twice).
// src and dst must not overlap unless the types are identical (then it is a move).
void convert(const void* src, isa::DType src_type, void* dst, isa::DType dst_type, size_t n);

// out[i] = a[i] op b[i]; out may alias a or b (or both).
// Arithmetic ops are IEEE f32 operations (correctly rounded). max(a, b) is
// (a > b ? a : b) and min(a, b) is (a < b ? a : b), so a NaN in either operand yields b.
void binary(isa::BinOp op, const float* a, const float* b, float* out, size_t n);

// out[i] = a[i] op s, with the semantics of binary(); out may alias a.
void binary_scalar(isa::BinOp op, const float* a, float s, float* out, size_t n);

// out[i] = op(in[i]); out may alias in.
//   exp, tanh: polynomial approximations, a few ulp; exp overflows to +inf above ~88.7.
//   gelu_tanh(x) = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), silu(x) = x/(1+exp(-x)).
//   sqrt, recip (1/x), neg, abs: exact IEEE results; rsqrt = 1/sqrt(x) (two roundings).
//   sin, cos: polynomial after a four-part pi range reduction, for |x| <= 39000:
//     within 3 ulp (about 1.8 measured) and an absolute error below 1e-7. Larger |x|
//     are computed element by element with the C library in double and rounded to
//     f32 (as accurate, much slower); +-inf gives NaN; sin(+-0) = +-0.
//   log (natural): polynomial, within 3 ulp on (0, +inf), subnormals included;
//     log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf.
// NaN inputs give NaN for every op except abs/neg, which only change the sign bit.
void unary(isa::UnOp op, const float* in, float* out, size_t n);

// For each of `rows` dense rows of `cols` floats (row stride cols):
//   kSum, kSumSq: f32 sum / sum of squares (0 for cols == 0);
//   kMax:         f32 maximum (-inf for cols == 0);
//   kArgmax:      int32 index of the first element equal to the maximum (-1 for cols == 0).
// out holds `rows` float values, or int32_t values for kArgmax; it may be the same
// array as in (each row is read before its result is written). Max and argmax treat
// NaN elements as -inf (a row of NaNs has max -inf and argmax 0). Sums run on 16
// lanes: the row zero-padded to a multiple of 16, lane l adding the elements at l,
// l + 16, ... in order (by FMA for squares), then the halving tree l + l+8, l + l+4,
// l + l+2, l + l+1; so their rounding differs from a sequential sum.
void reduce_rows(isa::RedOp op, const float* in, size_t rows, size_t cols, void* out);

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols (the arrays
// do not overlap); 8 x 8 blocks go through registers where a vector holds 8 floats.
void transpose(const float* src, size_t src_stride, size_t rows, size_t cols, float* dst, size_t dst_stride);

// C[m x n] (f32, row stride n) = (accumulate ? C : 0) + A * B, where A is m x k (row
// stride k) and B is k x n (row stride n) or, with trans_b, n x k (row stride k).
// A and B may each be f32, bf16 or f16; products are formed from the exact f32 values
// of the inputs and accumulated in f32 by FMA. The order depends on the shape alone:
// narrow C (n < 16; with trans_b, m < 64 or n < 32) takes dot products in the order of
// reduce_rows' sums (bf16 A: elements 2l and 2l + 1 of each 32 on lane l), wider C
// sums each k slice of 128 in order and adds it to C. C must not alias A or B. With
// k == 0, C is zeroed (or left unchanged when accumulating).
void matmul(const void* a, isa::DType a_type, const void* b, isa::DType b_type, float* c,
            size_t m, size_t n, size_t k, bool trans_b, bool accumulate);

// Name of the implementation in use, e.g. "AVX3", "AVX2" or "SCALAR", for reports.
const char* tile_kernels_target();

// Runs `rounds` rounds of independent register-only FMAs with the implementation in
// use and returns the number of floating-point operations performed. Benchmarks time
// it to measure the single-core peak the kernels are compared against.
uint64_t tile_kernels_fma_probe(uint64_t rounds);

// Highway target bits (HWY_AVX3, ...) of the implementations compiled in that this CPU
// can run, best first; the last is the portable fallback.
std::vector<int64_t> tile_kernels_targets();

// For tests and benchmarks: makes every later call use `target` (one of
// tile_kernels_targets()), or the best one again with target == 0. This sets
// Highway's process-wide target mask, so it also affects other Highway users; call it
// only while no kernel is running.
void tile_kernels_set_target_for_test(int64_t target);

}  // namespace npurt::sim
