// Dequantization of the block-quantized weight formats (GGUF's Q8_0, Q4_0, Q5_0,
// Q4_K, Q5_K, Q6_K) to f32. Block layouts and reconstruction follow ggml's
// (block_* in ggml-common.h, dequantize_row_* in ggml-quants.c; docs/isa.md); every
// f16 scale converts to f32 exactly, and each output is formed with the same f32
// operations in the same order as those formulas (no fused multiply-add), so results
// are bit-reproducible.
#pragma once

#include <cstddef>
#include <cstdint>

#include "npurt/isa/isa.h"
#include "npurt/isa/numeric.h"

namespace npurt::isa {

// All blocks are little-endian byte structures with no padding; f16 values are
// stored as raw bit patterns.
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // u32, little-endian
  uint8_t qs[16];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Writes n values decoded from consecutive blocks of `type` at `blocks` (no
// alignment needed) to out. n must be a multiple of dtype_block_elems(type) and
// `type` one of the quantized dtypes; anything else is a programming error (callers
// validate; NPURT_CHECK aborts naming it).
void dequantize_row(const void* blocks, DType type, float* out, size_t n);

}  // namespace npurt::isa
