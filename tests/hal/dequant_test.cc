// Dequantization of the block formats: hand-built blocks with values worked out
// from the format description, random blocks against a plain scalar reference, and
// the TLDQ / TGATHER instructions on the simulated device.
#include "npurt/isa/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hal/sim/dequant_kernels.h"
#include "hal/sim/matvec_kernels.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/numeric.h"
#include "hal/sim/tile_kernels.h"
#include "sim_test_util.h"

namespace npurt {
namespace {

using namespace npurt::testing;
using namespace npurt::isa;
using hal::KernelArg;
using isa::dequantize_row;
using Bytes = std::vector<uint8_t>;

// f16 bit patterns of a few exact values.
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5
constexpr uint16_t kHalfOne = 0x3C00;      // 1.0
constexpr uint16_t kHalfTwo = 0x4000;      // 2.0
constexpr uint16_t kHalfMinusTwo = 0xC000; // -2.0

void put16(Bytes& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xFF);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> dq(const Bytes& blocks, DType t, size_t n) {
  std::vector<float> out(n, std::nanf(""));
  dequantize_row(blocks.data(), t, out.data(), n);
  return out;
}

// ---------------------------------------------------------------- f16 scales

TEST(DequantHalf, ConvertsExactly) {
  EXPECT_EQ(isa::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(isa::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(isa::f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(isa::f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(isa::f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(isa::f16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(isa::f16_to_f32(0x3555), 0.25f + 341.0f / 4096.0f);  // 2^-2 * (1 + 0x155 / 1024)
  EXPECT_EQ(std::bit_cast<uint32_t>(isa::f16_to_f32(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isinf(isa::f16_to_f32(0xFC00)));
  EXPECT_TRUE(std::isnan(isa::f16_to_f32(0x7E00)));
}

// ---------------------------------------------------------------- hand-built blocks

// d = 0.5, qs[l] = 8l - 128 (so -128, -120, ..., 120): y[l] = 4l - 64.
TEST(DequantHand, Q8_0) {
  Bytes b(34);
  put16(b, 0, kHalfHalf);
  for (int l = 0; l < 32; ++l) b[2 + l] = static_cast<uint8_t>(static_cast<int8_t>(8 * l - 128));
  const std::vector<float> want = {-64, -60, -56, -52, -48, -44, -40, -36, -32, -28, -24, -20, -16, -12, -8, -4,
                                   0,   4,   8,   12,  16,  20,  24,  28,  32,  36,  40,  44,  48,  52,  56, 60};
  EXPECT_EQ(dq(b, DType::kQ8_0, 32), want);

  // A subnormal scale 2^-24 (f16 0x0001) is kept exactly: -128 * 2^-24 = -2^-17.
  put16(b, 0, 0x0001);
  const auto sub = dq(b, DType::kQ8_0, 32);
  EXPECT_EQ(sub[0], -std::ldexp(1.0f, -17));
  EXPECT_EQ(sub[31], std::ldexp(120.0f, -24));
}

// d = 2, qs[j] = j | (15 - j) << 4: y[j] = (j - 8) * 2, y[j + 16] = (7 - j) * 2.
TEST(DequantHand, Q4_0) {
  Bytes b(18);
  put16(b, 0, kHalfTwo);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const std::vector<float> want = {-16, -14, -12, -10, -8, -6, -4, -2, 0,  2,  4,   6,   8,   10,  12,  14,
                                   14,  12,  10,  8,   6,  4,  2,  0,  -2, -4, -6, -8, -10, -12, -14, -16};
  EXPECT_EQ(dq(b, DType::kQ4_0, 32), want);

  put16(b, 0, kHalfMinusTwo);  // a negative scale flips every sign
  const auto neg = dq(b, DType::kQ4_0, 32);
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(neg[i], -want[i]) << i;
}

// d = 1, qs[j] = j | 3 << 4, qh = 0x8001FF00 (bits 8..15, 16 and 31 set):
//   y[j] = j - 16 for j < 8, j for 8 <= j < 16;
//   y[16] = 3 + 16 - 16 = 3, y[17..30] = 3 - 16 = -13, y[31] = 3.
TEST(DequantHand, Q5_0) {
  Bytes b(22);
  put16(b, 0, kHalfOne);
  const uint32_t qh = 0x8001FF00u;
  for (int k = 0; k < 4; ++k) b[2 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(j | 3 << 4);
  const std::vector<float> want = {-16, -15, -14, -13, -12, -11, -10, -9,  8,   9,   10,  11,  12,  13,  14,  15,
                                   3,   -13, -13, -13, -13, -13, -13, -13, -13, -13, -13, -13, -13, -13, -13, 3};
  EXPECT_EQ(dq(b, DType::kQ5_0, 32), want);
}

// Sub-block scales and mins chosen by hand, packed into the 12 scale bytes of a
// Q4_K / Q5_K block: sc = {1, 2, 3, 4, 17, 33, 63, 5}, m = {0, 1, 2, 3, 20, 40, 6, 63}.
//   s[0..3]  = sc0..3 | (sc4..7 >> 4) << 6   = 0x41 0x82 0xC3 0x04
//   s[4..7]  = m0..3  | (m4..7 >> 4) << 6    = 0x40 0x81 0x02 0xC3
//   s[8..11] = (sc4..7 & 15) | (m4..7 & 15) << 4 = 0x41 0x81 0x6F 0xF5
constexpr float kSc[8] = {1, 2, 3, 4, 17, 33, 63, 5};
constexpr float kMin[8] = {0, 1, 2, 3, 20, 40, 6, 63};
constexpr uint8_t kScaleBytes[12] = {0x41, 0x82, 0xC3, 0x04, 0x40, 0x81, 0x02, 0xC3, 0x41, 0x81, 0x6F, 0xF5};

// d = 1, dmin = 0.5; qs[k] = (k % 16) | (15 - k % 16) << 4 for all 128 bytes.
// y[64c + l] = sc[2c] * (l % 16) - 0.5 m[2c]; y[64c + 32 + l] = sc[2c+1] * (15 - l % 16) - 0.5 m[2c+1].
TEST(DequantHand, Q4_K) {
  Bytes b(144);
  put16(b, 0, kHalfOne);
  put16(b, 2, kHalfHalf);
  std::memcpy(&b[4], kScaleBytes, 12);
  for (int k = 0; k < 128; ++k) b[16 + k] = static_cast<uint8_t>((k % 16) | (15 - k % 16) << 4);
  const auto y = dq(b, DType::kQ4_K, 256);
  EXPECT_EQ(y[0], 0.0f);                  // 1*0 - 0
  EXPECT_EQ(y[5], 5.0f);                  // 1*5 - 0
  EXPECT_EQ(y[32], 29.5f);                // 2*15 - 0.5
  EXPECT_EQ(y[64 + 3], 8.0f);             // 3*3 - 1
  EXPECT_EQ(y[128 + 7], 109.0f);          // 17*7 - 10
  EXPECT_EQ(y[128 + 32], 475.0f);         // 33*15 - 20
  EXPECT_EQ(y[192 + 15], 942.0f);         // 63*15 - 3
  EXPECT_EQ(y[192 + 32 + 15], -31.5f);    // 5*0 - 31.5
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const float lo = static_cast<float>(l % 16), hi = static_cast<float>(15 - l % 16);
      EXPECT_EQ(y[64 * c + l], kSc[2 * c] * lo - 0.5f * kMin[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], kSc[2 * c + 1] * hi - 0.5f * kMin[2 * c + 1]) << c << " " << l;
    }
  }
}

// d = 0.25, dmin = 1, same scales and qs as the Q4_K case; qh[l] = 0x55 for even l
// (the fifth bit of every low-nibble value) and 0xAA for odd l (of every high one).
TEST(DequantHand, Q5_K) {
  Bytes b(176);
  put16(b, 0, kHalfQuarter);
  put16(b, 2, kHalfOne);
  std::memcpy(&b[4], kScaleBytes, 12);
  for (int l = 0; l < 32; ++l) b[16 + l] = (l % 2 == 0) ? 0x55 : 0xAA;
  for (int k = 0; k < 128; ++k) b[48 + k] = static_cast<uint8_t>((k % 16) | (15 - k % 16) << 4);
  const auto y = dq(b, DType::kQ5_K, 256);
  EXPECT_EQ(y[0], 4.0f);           // 0.25*1*16 - 0
  EXPECT_EQ(y[33], 14.0f);         // 0.25*2*30 - 1
  EXPECT_EQ(y[128 + 2], 56.5f);    // 0.25*17*18 - 20
  EXPECT_EQ(y[224 + 31], -43.0f);  // 0.25*5*16 - 63
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const bool even = l % 2 == 0;
      const float lo = static_cast<float>(l % 16 + (even ? 16 : 0));
      const float hi = static_cast<float>(15 - l % 16 + (even ? 0 : 16));
      EXPECT_EQ(y[64 * c + l], 0.25f * kSc[2 * c] * lo - kMin[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], 0.25f * kSc[2 * c + 1] * hi - kMin[2 * c + 1]) << c << " " << l;
    }
  }
}

// d = 0.5, scales = {1, -1, 2, -2, ..., 8, -8}, ql[k] = (k % 16) | (15 - k % 16) << 4,
// qh[k] = 0xE4 (2-bit fields 0, 1, 2, 3 from the bottom). Then for l < 32:
//   q1 = l%16 - 32, q2 = l%16 - 16, q3 = 15 - l%16, q4 = 31 - l%16,
//   y[128h + 32k + l] = 0.5 * scales[8h + l/16 + 2k] * q(k+1).
TEST(DequantHand, Q6_K) {
  Bytes b(210);
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -8};
  for (int k = 0; k < 128; ++k) b[k] = static_cast<uint8_t>((k % 16) | (15 - k % 16) << 4);
  for (int k = 0; k < 64; ++k) b[128 + k] = 0xE4;
  std::memcpy(&b[192], scales, 16);
  put16(b, 208, kHalfHalf);
  const auto y = dq(b, DType::kQ6_K, 256);
  EXPECT_EQ(y[0], -16.0f);             // 0.5*1*(0-32)
  EXPECT_EQ(y[17], 15.5f);             // 0.5*-1*(1-32)
  EXPECT_EQ(y[32 + 3], -13.0f);        // 0.5*2*(3-16)
  EXPECT_EQ(y[64 + 20], -16.5f);       // 0.5*-3*(15-4)
  EXPECT_EQ(y[96 + 31], -32.0f);       // 0.5*-4*(31-15)
  EXPECT_EQ(y[128 + 96 + 16], -124.0f);  // 0.5*-8*31
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const float q[4] = {static_cast<float>(l % 16 - 32), static_cast<float>(l % 16 - 16),
                          static_cast<float>(15 - l % 16), static_cast<float>(31 - l % 16)};
      for (int k = 0; k < 4; ++k) {
        const float sc = scales[8 * h + l / 16 + 2 * k];
        EXPECT_EQ(y[128 * h + 32 * k + l], 0.5f * sc * q[k]) << h << " " << k << " " << l;
      }
    }
  }
}

// ---------------------------------------------------------------- random blocks

// Position of the f16 scale fields in a block.
std::vector<size_t> half_fields(DType t) {
  switch (t) {
    case DType::kQ4_K:
    case DType::kQ5_K: return {0, 2};
    case DType::kQ6_K: return {208};
    default: return {0};
  }
}

// Random bytes with every f16 field a finite value (normal or subnormal, either sign).
Bytes random_blocks(DType t, size_t nblocks, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bb = dtype_block_bytes(t);
  Bytes b(nblocks * bb);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < nblocks; ++i) {
    for (size_t f : half_fields(t)) {
      const auto exp = static_cast<uint16_t>(rng() % 18);  // up to 2^3
      const auto h = static_cast<uint16_t>((rng() & 0x8000u) | (exp << 10) | (rng() & 0x3FFu));
      put16(b, i * bb + f, h);
    }
  }
  return b;
}

// Reference decoder written directly from the format description, one value at a
// time, with its own f16 decoding.
float ref_half(const uint8_t* p) {
  const uint16_t h = static_cast<uint16_t>(p[0] | p[1] << 8);
  const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                             : std::ldexp(static_cast<float>(man + 1024), exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

void ref_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

std::vector<float> reference(const Bytes& blocks, DType t) {
  const size_t bb = dtype_block_bytes(t), be = dtype_block_elems(t), nb = blocks.size() / bb;
  std::vector<float> y(nb * be);
  for (size_t i = 0; i < nb; ++i) {
    const uint8_t* p = &blocks[i * bb];
    float* o = &y[i * be];
    switch (t) {
      case DType::kQ8_0: {
        const float d = ref_half(p);
        for (int l = 0; l < 32; ++l) o[l] = static_cast<float>(static_cast<int8_t>(p[2 + l])) * d;
        break;
      }
      case DType::kQ4_0: {
        const float d = ref_half(p);
        const uint8_t* qs = p + 2;
        for (int j = 0; j < 16; ++j) {
          o[j] = static_cast<float>((qs[j] & 15) - 8) * d;
          o[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
        }
        break;
      }
      case DType::kQ5_0: {
        const float d = ref_half(p);
        uint32_t qh = 0;
        std::memcpy(&qh, p + 2, 4);
        const uint8_t* qs = p + 6;
        for (int j = 0; j < 16; ++j) {
          const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
          const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
          o[j] = static_cast<float>(((qs[j] & 15) | h0) - 16) * d;
          o[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
        }
        break;
      }
      case DType::kQ4_K:
      case DType::kQ5_K: {
        const bool five = t == DType::kQ5_K;
        const float d = ref_half(p), dmin = ref_half(p + 2);
        const uint8_t* s = p + 4;
        const uint8_t* qh = p + 16;
        const uint8_t* qs = p + (five ? 48 : 16);
        for (int c = 0; c < 4; ++c) {
          for (int half = 0; half < 2; ++half) {
            int sc = 0, m = 0;
            ref_scale_min(2 * c + half, s, &sc, &m);
            for (int l = 0; l < 32; ++l) {
              int q = half == 0 ? (qs[32 * c + l] & 15) : (qs[32 * c + l] >> 4);
              if (five && ((qh[l] >> (2 * c + half)) & 1)) q += 16;
              const float scale = d * static_cast<float>(sc);
              const float prod = scale * static_cast<float>(q);
              const float off = dmin * static_cast<float>(m);
              o[64 * c + 32 * half + l] = prod - off;
            }
          }
        }
        break;
      }
      case DType::kQ6_K: {
        const float d = ref_half(p + 208);
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = p + 64 * h;
          const uint8_t* qh = p + 128 + 32 * h;
          const auto* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * h);
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            o[128 * h + l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
            o[128 * h + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
            o[128 * h + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
            o[128 * h + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
          }
        }
        break;
      }
      default: ADD_FAILURE() << "not a quantized type";
    }
  }
  return y;
}

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0,
                                 DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::string name_of(DType t) { return std::string(dtype_name(t)); }

class DequantRandom : public ::testing::TestWithParam<DType> {};

// Five blocks at an odd byte address, bit-exact against the reference.
TEST_P(DequantRandom, MatchesScalarReference) {
  const DType t = GetParam();
  constexpr size_t kBlocks = 5;
  const size_t be = dtype_block_elems(t);
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const Bytes blocks = random_blocks(t, kBlocks, 100 + seed);
    Bytes shifted(blocks.size() + 1);
    std::memcpy(&shifted[1], blocks.data(), blocks.size());
    std::vector<float> got(kBlocks * be, std::nanf(""));
    dequantize_row(&shifted[1], t, got.data(), got.size());
    const auto want = reference(blocks, t);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << "seed " << seed << " element " << i << ": " << got[i] << " vs " << want[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dequant, DequantRandom, ::testing::ValuesIn(kQuantTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return name_of(i.param); });

// The cores' vectorized decoder gives the reference decoder's bits, on every vector
// implementation this CPU runs, for unaligned blocks and every scale (subnormal
// f16 scales included).
TEST(DequantVectorized, BitIdenticalToReferenceOnEveryTarget) {
  for (int64_t target : sim::tile_kernels_targets()) {
    sim::tile_kernels_set_target_for_test(target);
    for (DType t : kQuantTypes) {
      const size_t be = dtype_block_elems(t), nb = 24;
      const Bytes blocks = random_blocks(t, nb, 7 + static_cast<uint32_t>(t));
      Bytes shifted(blocks.size() + 3);
      std::memcpy(&shifted[3], blocks.data(), blocks.size());
      std::vector<float> want(nb * be), got(nb * be, std::nanf(""));
      dequantize_row(blocks.data(), t, want.data(), want.size());
      sim::dequantize(&shifted[3], t, got.data(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << name_of(t) << " on " << sim::tile_kernels_target() << ", element " << i;
      }
    }
  }
  sim::tile_kernels_set_target_for_test(0);
}

// `rows` rows of k random values of `t` (quantized: random blocks, seeded
// quantized_seed + r; plain: random floats stored as `t`, seeded plain_seed + r), row
// r at byte 1 + r * stride: odd addresses, with gaps between the rows.
Bytes random_rows(DType t, size_t k, size_t rows, size_t stride, uint32_t quantized_seed, uint32_t plain_seed) {
  Bytes w(1 + rows * stride);
  for (size_t r = 0; r < rows; ++r) {
    uint8_t* row = &w[1 + r * stride];
    const auto seed_offset = static_cast<uint32_t>(r);
    if (dtype_is_quantized(t)) {
      const Bytes blocks = random_blocks(t, k / dtype_block_elems(t), quantized_seed + seed_offset);
      std::memcpy(row, blocks.data(), blocks.size());
    } else {
      const std::vector<float> values = random_floats(k, plain_seed + seed_offset);
      from_f32(values.data(), t, row, k);
    }
  }
  return w;
}

// Row dot products straight from blocks (and plain rows) agree with a double-precision
// dot of the reference-dequantized rows, with gaps between rows and rows at odd byte
// addresses; accumulate adds to y. `blocks` per row (quantized) or a vector tail.
void check_matvec(DType t, size_t blocks, const std::string& where) {
  const size_t k = dtype_is_quantized(t) ? blocks * dtype_block_elems(t) : 77 + blocks;
  const size_t rows = 5, stride = dtype_bytes(t, k) + 3;
  const Bytes w = random_rows(t, k, rows, stride, 50, 60);
  std::vector<float> wf(rows * k);
  for (size_t r = 0; r < rows; ++r) to_f32(&w[1 + r * stride], t, &wf[r * k], k);
  const auto x = random_floats(k, 99);
  std::vector<float> y(rows, 0.5f);
  sim::matvec(&w[1], t, stride, rows, x.data(), k, y.data(), /*accumulate=*/true);
  for (size_t r = 0; r < rows; ++r) {
    double want = 0.5, mag = 0;
    for (size_t j = 0; j < k; ++j) {
      want += double(wf[r * k + j]) * x[j];
      mag += std::fabs(double(wf[r * k + j]) * x[j]);
    }
    ASSERT_NEAR(y[r], want, 1e-5 * mag + 1e-6) << name_of(t) << " row " << r << ", k " << k << ", " << where;
  }
}

// Every vector implementation (on AVX-512 with and without VPDPBUSD, where the CPU
// has AVX512_VNNI), over odd and even numbers of blocks per row.
TEST(DequantVectorized, MatVecMatchesDequantizedDot) {
  constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                              DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  for (int64_t target : sim::tile_kernels_targets()) {
    sim::tile_kernels_set_target_for_test(target);
    for (bool vnni : {true, false}) {
      sim::matvec_set_vnni_for_test(vnni);
      const std::string where = sim::matvec_isa();
      for (DType t : kTypes) {
        for (size_t blocks : {3u, 4u}) check_matvec(t, blocks, where);
      }
    }
  }
  sim::matvec_set_vnni_for_test(true);
  sim::tile_kernels_set_target_for_test(0);
}

// The TMV kernels' bits are a property of the tile ISA, not of the CPU: every vector
// implementation this CPU runs (AVX-512 with and without VPDPBUSD, AVX2, the portable
// fallback) gives every vector the same bits, alone and in batches of any size, on
// values from 1e-30 to 1e20, rows at odd addresses and row counts that leave rows
// over from the kernels' groups of four.
TEST(MatVecBits, EveryTargetAndFormGivesTheSameBits) {
  constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                              DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  constexpr size_t kRows = 37, kBatch = 16;
  std::set<std::string> forms;
  for (DType t : kTypes) {
    const size_t k = dtype_is_quantized(t) ? (dtype_block_elems(t) == 32 ? 7 * 32 : 2 * 256) : 16 * 5 + 9;
    const size_t stride = dtype_bytes(t, k) + 5;
    const Bytes w = random_rows(t, k, kRows, stride, 300, 400);
    std::vector<float> x = random_floats(kBatch * k, 17 + static_cast<uint32_t>(t));
    const float scales[] = {1.0f, 1e-30f, 1e20f, 3e-3f};
    for (size_t v = 0; v < kBatch; ++v) {
      for (size_t j = 0; j < k; ++j) x[v * k + j] *= scales[v % 4] * (j % 37 == 0 ? 100.0f : 1.0f);
    }
    const auto run = [&](size_t batch) {
      std::vector<float> y(batch * kRows, std::nanf(""));
      sim::matvec_batch(&w[1], t, stride, kRows, x.data(), k, batch, y.data(), /*accumulate=*/false);
      std::vector<uint32_t> bits(y.size());
      std::memcpy(bits.data(), y.data(), y.size() * 4);
      return bits;
    };
    sim::tile_kernels_set_target_for_test(0);
    const std::vector<uint32_t> want = run(kBatch);
    for (int64_t target : sim::tile_kernels_targets()) {
      sim::tile_kernels_set_target_for_test(target);
      for (bool vnni : {true, false}) {
        sim::matvec_set_vnni_for_test(vnni);
        forms.insert(sim::matvec_isa());
        for (size_t batch : {size_t{1}, size_t{5}, kBatch}) {
          const std::vector<uint32_t> got = run(batch);
          size_t differ = 0;
          for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
          EXPECT_EQ(differ, 0u) << name_of(t) << " on " << sim::matvec_isa() << ", batch " << batch;
        }
      }
    }
    sim::matvec_set_vnni_for_test(true);
    sim::tile_kernels_set_target_for_test(0);
    // The comparison can fail: the test-only reordered sums give other bits.
    sim::matvec_set_batch_reorder_for_test(true);
    const std::vector<uint32_t> reordered = run(kBatch);
    sim::matvec_set_batch_reorder_for_test(false);
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += reordered[i] != want[i];
    EXPECT_GT(differ, want.size() / 4) << name_of(t) << ": the reordered sums went unnoticed";
  }
  // The fallback and at least one vector form were compared.
  EXPECT_GE(forms.size(), 2u);
  for (const std::string& f : forms) std::printf("compared: %s\n", f.c_str());
}

// ---------------------------------------------------------------- device

using Buf = DeviceBuffer;

// The kernel runner with f32 outputs poisoned with NaN.
class Sim : public KernelRunner {
 public:
  explicit Sim(bool sanitize = false) : KernelRunner(options(sanitize)) {}
  Buf output(size_t floats) { return input(std::vector<float>(floats, std::nanf(""))); }
  std::vector<float> read(const Buf& b) { return KernelRunner::read<float>(b); }

 private:
  static hal::SimOptions options(bool sanitize) {
    hal::SimOptions o;
    o.sanitize = sanitize;
    return o;
  }
};

struct TldqCase {
  DType type;
  int rows, cols;
  int64_t offset;  // bytes before row 0
  int64_t gap;     // bytes between rows beyond the row's blocks
};
class Tldq : public ::testing::TestWithParam<TldqCase> {};

// A rows x cols matrix of blocks (with a leading offset and gaps between rows),
// loaded with TLDQ into an f32 tile and stored: equal to dequantize_row per row; with
// kTransB the tile is cols x rows and row r of the matrix is its column r.
void check_tldq(const TldqCase& p, bool transposed) {
  const size_t be = dtype_block_elems(p.type), bb = dtype_block_bytes(p.type);
  const auto rows = static_cast<size_t>(p.rows), cols = static_cast<size_t>(p.cols);
  const size_t row_bytes = cols / be * bb, pitch = row_bytes + static_cast<size_t>(p.gap);
  const Bytes blocks = random_blocks(p.type, rows * cols / be + 1, 2001);
  Bytes gm(static_cast<size_t>(p.offset) + (rows - 1) * pitch + row_bytes, 0xEE);
  for (size_t r = 0; r < rows; ++r) {
    std::memcpy(&gm[static_cast<size_t>(p.offset) + r * pitch], &blocks[r * row_bytes], row_bytes);
  }
  KernelBuilder b("tldq");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, p.type);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0}, off{1}, stride{2};
  b.li(zero, 0);
  b.li(off, p.offset);
  b.li(stride, static_cast<int64_t>(pitch));
  if (transposed) {
    b.tdef(Tile{0}, DType::kF32, p.cols, p.rows, 0);
  } else {
    b.tdef(Tile{0}, DType::kF32, p.rows, p.cols, 0);
  }
  b.tldq(Tile{0}, aw, off, stride, p.type, transposed);
  b.tst(Tile{0}, aout, zero, DType::kF32);
  Sim sim(/*sanitize=*/true);
  const Buf bw = sim.input(gm), bo = sim.output(rows * cols);
  NPURT_ASSERT_OK(sim.run(b, {bw.arg(), bo.arg()}));
  const auto got = sim.read(bo);
  std::vector<float> want(rows * cols);
  for (size_t r = 0; r < rows; ++r) dequantize_row(&blocks[r * row_bytes], p.type, &want[r * cols], cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const float g = transposed ? got[c * rows + r] : got[r * cols + c];
      ASSERT_EQ(std::bit_cast<uint32_t>(g), std::bit_cast<uint32_t>(want[r * cols + c])) << r << "," << c;
    }
  }
}

TEST_P(Tldq, LoadsMatrixExactly) { check_tldq(GetParam(), false); }
TEST_P(Tldq, LoadsMatrixTransposedExactly) { check_tldq(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Dequant, Tldq,
                         ::testing::Values(TldqCase{DType::kQ4_K, 7, 512, 0, 0}, TldqCase{DType::kQ4_K, 7, 512, 5, 3},
                                           TldqCase{DType::kQ8_0, 7, 640, 0, 0}, TldqCase{DType::kQ8_0, 3, 640, 17, 1},
                                           TldqCase{DType::kQ4_0, 4, 96, 1, 2}, TldqCase{DType::kQ5_0, 5, 640, 0, 0},
                                           TldqCase{DType::kQ5_K, 3, 768, 0, 0}, TldqCase{DType::kQ6_K, 6, 512, 2, 0},
                                           TldqCase{DType::kQ6_K, 1, 256, 0, 0}, TldqCase{DType::kQ4_K, 37, 512, 3, 1},
                                           TldqCase{DType::kQ5_0, 64, 160, 0, 0}),
                         [](const ::testing::TestParamInfo<TldqCase>& i) {
                           const TldqCase& c = i.param;
                           return name_of(c.type) + "_" + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                                  "_off" + std::to_string(c.offset) + "_gap" + std::to_string(c.gap);
                         });

class Gemv : public ::testing::TestWithParam<DType> {};

// y = W x with W (out x in) quantized: TLDQ the rows, then TMMA x (1 x in) against
// W with kTransB; compared with a double-precision product of the dequantized W.
TEST_P(Gemv, MatchesDoubleReference) {
  const DType t = GetParam();
  constexpr size_t kOut = 24, kIn = 512;
  const size_t be = dtype_block_elems(t), bb = dtype_block_bytes(t), row_bytes = kIn / be * bb;
  const Bytes w = random_blocks(t, kOut * kIn / be, 2101);
  const auto x = random_floats(kIn, 2102);
  KernelBuilder b("gemv");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, t);
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t ay = b.arg_buffer("y", Access::kOut, DType::kF32);
  const Reg zero{0}, stride{1};
  b.li(zero, 0);
  b.li(stride, static_cast<int64_t>(row_bytes));
  b.tdef(Tile{0}, DType::kF32, kOut, kIn, 0);
  b.tdef(Tile{1}, DType::kF32, 1, kIn, kOut * kIn * 4);
  b.tdef(Tile{2}, DType::kF32, 1, kOut, (kOut + 1) * kIn * 4);
  b.tldq(Tile{0}, aw, zero, stride, t);
  b.tld(Tile{1}, ax, zero, DType::kF32);
  b.tmma(Tile{2}, Tile{1}, Tile{0}, kTransB);
  b.tst(Tile{2}, ay, zero, DType::kF32);
  Sim sim;
  const Buf bw = sim.input(w), bx = sim.input(x), by = sim.output(kOut);
  NPURT_ASSERT_OK(sim.run(b, {bw.arg(), bx.arg(), by.arg()}));
  std::vector<float> wf(kOut * kIn);
  dequantize_row(w.data(), t, wf.data(), wf.size());
  std::vector<double> want(kOut);
  for (size_t o = 0; o < kOut; ++o) {
    double s = 0;
    for (size_t k = 0; k < kIn; ++k) s += double{wf[o * kIn + k]} * double{x[k]};
    want[o] = s;
  }
  EXPECT_LE(rel_l2(sim.read(by), want), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Dequant, Gemv, ::testing::ValuesIn(kQuantTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return name_of(i.param); });

// Gathers rows of a Q8_0 table (64 values = 2 blocks per row, pitch 70 bytes) by the
// first column of an index tile, as an embedding lookup does.
TEST(DequantGather, Q8_0RowsByIndex) {
  constexpr size_t kTableRows = 23, kCols = 64, kRowBytes = 68, kPitch = 70, kN = 5, kIdxCols = 2;
  const Bytes blocks = random_blocks(DType::kQ8_0, kTableRows * 2, 2201);
  Bytes table(kTableRows * kPitch, 0xEE);
  for (size_t r = 0; r < kTableRows; ++r) std::memcpy(&table[r * kPitch], &blocks[r * kRowBytes], kRowBytes);
  table.resize((kTableRows - 1) * kPitch + kRowBytes);  // the last row ends the buffer
  const std::vector<int32_t> idx = {22, -7, 0, 99, 13, 5, 22, 1, 7, 0};
  KernelBuilder b("tgather_q8_0");
  const uint8_t at = b.arg_buffer("table", Access::kIn, DType::kQ8_0);
  const uint8_t ai = b.arg_buffer("idx", Access::kIn, DType::kI32);
  const uint8_t aout = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg zero{0}, pitch{1};
  b.li(zero, 0);
  b.li(pitch, kPitch);
  b.tdef(Tile{0}, DType::kI32, kN, kIdxCols, 0);
  b.tdef(Tile{1}, DType::kF32, kN, kCols, 256);
  b.tld(Tile{0}, ai, zero, DType::kI32);
  b.tgather(Tile{1}, at, Tile{0}, pitch, DType::kQ8_0);
  b.tst(Tile{1}, aout, zero, DType::kF32);
  Sim sim(/*sanitize=*/true);
  const Buf bt = sim.input(table), bi = sim.input(idx), bo = sim.output(kN * kCols);
  NPURT_ASSERT_OK(sim.run(b, {bt.arg(), bi.arg(), bo.arg()}));
  const auto got = sim.read(bo);
  for (size_t r = 0; r < kN; ++r) {
    const auto row = static_cast<size_t>(idx[r * kIdxCols]);
    std::vector<float> want(kCols);
    dequantize_row(&blocks[row * kRowBytes], DType::kQ8_0, want.data(), kCols);
    for (size_t c = 0; c < kCols; ++c) ASSERT_EQ(got[r * kCols + c], want[c]) << "row " << r << " col " << c;
  }
}

// ---------------------------------------------------------------- faults

struct QFault {
  const char* name;
  DType type;
  DType tile_type;
  int rows, cols;
  int64_t offset, stride;
  size_t buffer_bytes;
  bool gather;
  const char* message;
};

// Q4_K rows are 144 bytes per 256 values, Q8_0 rows 34 bytes per 32.
const QFault kQFaults[] = {
    {"bad_cols", DType::kQ4_K, DType::kF32, 2, 100, 0, 144, 4096, false,
     "TLDQ: tile cols 100 is not a multiple of the q4_K block size 256"},
    {"bf16_destination", DType::kQ8_0, DType::kBF16, 1, 32, 0, 34, 4096, false,
     "TLDQ: destination tile must be f32"},
    {"last_row_one_byte_short", DType::kQ4_K, DType::kF32, 3, 256, 0, 150, 2 * 150 + 144 - 1, false,
     "out-of-bounds access to arg 0: bytes [0, 444) of a 443-byte buffer"},
    {"offset_out_of_bounds", DType::kQ8_0, DType::kF32, 1, 64, 3, 68, 70, false,
     "out-of-bounds access to arg 0: bytes [3, 71) of a 70-byte buffer"},
    {"negative_stride", DType::kQ8_0, DType::kF32, 2, 32, 100, -34, 4096, false, "negative offset 100 or stride -34"},
    {"gather_bad_cols", DType::kQ6_K, DType::kF32, 1, 128, 0, 210, 4096, true,
     "TGATHER: tile cols 128 is not a multiple of the q6_K block size 256"},
    {"gather_out_of_bounds", DType::kQ8_0, DType::kF32, 1, 32, 0, 34, 34 * 3 - 1, true,
     "out-of-bounds access to arg 0: bytes [68, 102) of a 101-byte buffer"},
};

class QuantFaults : public ::testing::TestWithParam<QFault> {};

TEST_P(QuantFaults, FailTheLaunchWithAMessage) {
  const QFault& c = GetParam();
  KernelBuilder b(std::string("qfault_") + c.name);
  const uint8_t aw = b.arg_buffer("w", Access::kIn, c.type);
  const Reg off{0}, stride{1}, row{2};
  b.li(off, c.offset);
  b.li(stride, c.stride);
  b.tdef(Tile{0}, c.tile_type, c.rows, c.cols, 0);
  if (c.gather) {
    b.li(row, 2);
    b.tdef(Tile{1}, DType::kI32, c.rows, 1, 64 << 10);
    b.tfill(Tile{1}, row);
    b.tgather(Tile{0}, aw, Tile{1}, stride, c.type);
  } else {
    b.tldq(Tile{0}, aw, off, stride, c.type);
  }
  Sim sim;
  const Buf bw = sim.input(Bytes(c.buffer_bytes, 0));
  const Status st = sim.run(b, {bw.arg()});
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
  EXPECT_TRUE(contains(st, c.message)) << st.to_string();
  EXPECT_TRUE(contains(st, std::string("kernel 'qfault_") + c.name + "'")) << st.to_string();
}

INSTANTIATE_TEST_SUITE_P(Dequant, QuantFaults, ::testing::ValuesIn(kQFaults),
                         [](const ::testing::TestParamInfo<QFault>& i) { return std::string(i.param.name); });

// With the sanitizer on, TLDQ of blocks never written from the host is a hazard.
TEST(DequantSanitizer, TldqOfNeverWrittenBlocksIsAHazard) {
  hal::SimOptions o;
  o.sanitize = true;
  auto dev = make_sim(o);
  auto s = dev->create_stream().value();
  KernelBuilder b("tldq_uninit");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, DType::kQ8_0);
  const Reg zero{0}, stride{1};
  b.li(zero, 0);
  b.li(stride, 34);
  b.tdef(Tile{0}, DType::kF32, 2, 32, 0);
  b.tldq(Tile{0}, aw, zero, stride, DType::kQ8_0);
  const auto image = b.build(dev->info().local_memory_bytes);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const auto code = upload(*dev, *image);
  const auto w = dev->allocate(68).value();
  // Only the first row is written.
  const Bytes first_row = random_blocks(DType::kQ8_0, 1, 2301);
  NPURT_ASSERT_OK(dev->copy_to_device(s, w, first_row.data(), first_row.size()));
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  NPURT_ASSERT_OK(dev->launch(s, {code, 1, {KernelArg::buffer(w, 68)}}));
  const Status st = dev->stream_synchronize(s);
  EXPECT_EQ(st.code(), StatusCode::kHazard) << st.to_string();
  EXPECT_TRUE(contains(st, "read of never-written global memory")) << st.to_string();
}


// ---------------------------------------------------------------- TMV

// Rows of W (any weight type) at an offset with gaps, multiplied with x in two K halves:
// the first TMV overwrites the accumulator (poisoned with NaN), the second accumulates.
// Compared with a double-precision product of the reference-dequantized rows.
class Tmv : public ::testing::TestWithParam<DType> {};

TEST_P(Tmv, MatchesDequantizedProductInTwoHalves) {
  const DType t = GetParam();
  const size_t be = dtype_block_elems(t), k = dtype_is_quantized(t) ? 4 * be : 100, half = k / 2;
  const size_t rows = 9, row_bytes = dtype_bytes(t, k), pitch = row_bytes + 5, offset = 3;
  Bytes gm(offset + rows * pitch, 0xEE);
  std::vector<float> wf(rows * k);
  for (size_t r = 0; r < rows; ++r) {
    Bytes row(row_bytes);
    if (dtype_is_quantized(t)) {
      row = random_blocks(t, k / be, 3000 + static_cast<uint32_t>(r));
    } else {
      const auto v = random_floats(k, 3100 + static_cast<uint32_t>(r));
      from_f32(v.data(), t, row.data(), k);
    }
    std::memcpy(&gm[offset + r * pitch], row.data(), row_bytes);
    to_f32(row.data(), t, &wf[r * k], k);
  }
  const auto x = random_floats(k, 3200);
  KernelBuilder b("tmv");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, t);
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t ay = b.arg_buffer("y", Access::kInOut, DType::kF32);
  const Reg zero{0}, off{1}, stride{2}, xoff{3};
  b.li(zero, 0);
  b.li(off, static_cast<int64_t>(offset));
  b.li(stride, static_cast<int64_t>(pitch));
  b.li(xoff, static_cast<int64_t>(half * 4));
  b.tdef(Tile{0}, DType::kF32, static_cast<int>(rows), 1, 0);
  b.tdef(Tile{1}, DType::kF32, 1, static_cast<int>(half), 64);
  b.tld(Tile{0}, ay, zero, DType::kF32);  // NaN: must be overwritten, not accumulated
  b.tld(Tile{1}, ax, zero, DType::kF32);
  b.tmv(Tile{0}, aw, off, stride, Tile{1}, t);
  b.li(off, static_cast<int64_t>(offset + dtype_bytes(t, half)));
  b.tld(Tile{1}, ax, xoff, DType::kF32);
  b.tmv(Tile{0}, aw, off, stride, Tile{1}, t, /*accumulate=*/true);
  b.tst(Tile{0}, ay, zero, DType::kF32);
  Sim sim(/*sanitize=*/true);
  const Buf bw = sim.input(gm), bx = sim.input(x), by = sim.output(rows);
  NPURT_ASSERT_OK(sim.run(b, {bw.arg(), bx.arg(), by.arg()}));
  const auto got = sim.read(by);
  for (size_t r = 0; r < rows; ++r) {
    double want = 0, mag = 0;
    for (size_t j = 0; j < k; ++j) {
      want += double(wf[r * k + j]) * x[j];
      mag += std::fabs(double(wf[r * k + j]) * x[j]);
    }
    EXPECT_NEAR(got[r], want, 1e-5 * mag) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Dequant, Tmv,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                                           DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const ::testing::TestParamInfo<DType>& i) { return name_of(i.param); });

// Each malformed TMV faults with a message naming the problem; the device stays usable.
TEST(TmvFaults, NameTheProblem) {
  struct Case {
    const char* what;
    DType type;
    int acc_rows, acc_cols, x_cols;
    int64_t offset;
    const char* message;
  };
  const Case cases[] = {
      {"i32 weights", DType::kI32, 2, 1, 32, 0, "are i32"},
      {"accumulator not a column", DType::kF32, 2, 2, 32, 0, "TMV shapes"},
      {"k not whole blocks", DType::kQ8_0, 2, 1, 48, 0, "not a multiple of the q8_0 block size"},
      {"rows beyond the buffer", DType::kF32, 64, 1, 32, 0, "out-of-bounds"},
      {"negative offset", DType::kF32, 2, 1, 32, -4, "negative offset"},
  };
  Sim sim;
  const Buf w = sim.input(Bytes(4096, 1)), x = sim.input(random_floats(64, 1)), y = sim.output(64);
  for (const Case& c : cases) {
    KernelBuilder b("tmv_fault");
    const uint8_t aw = b.arg_buffer("w", Access::kIn, c.type);
    const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
    b.arg_buffer("y", Access::kOut, DType::kF32);
    const Reg zero{0}, off{1}, stride{2};
    b.li(zero, 0);
    b.li(off, c.offset);
    b.li(stride, 128);
    b.tdef(Tile{0}, DType::kF32, c.acc_rows, c.acc_cols, 0);
    b.tdef(Tile{1}, DType::kF32, 1, c.x_cols, 1024);
    b.tld(Tile{1}, ax, zero, DType::kF32);
    b.tmv(Tile{0}, aw, off, stride, Tile{1}, c.type);
    const Status s = sim.run(b, {w.arg(), x.arg(), y.arg()});
    EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << c.what;
    EXPECT_TRUE(contains(s, c.message)) << c.what << ": " << s.to_string();
  }
}

TEST(TmvFaults, UninitializedWeightsAreAHazardUnderTheSanitizer) {
  Sim sim(/*sanitize=*/true);
  auto addr = sim.dev().allocate(1024);
  ASSERT_TRUE(addr.ok());
  const Buf w{*addr, 1024}, x = sim.input(random_floats(32, 2)), y = sim.output(4);
  KernelBuilder b("tmv_uninit");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, DType::kQ8_0);
  const uint8_t ax = b.arg_buffer("x", Access::kIn, DType::kF32);
  b.arg_buffer("y", Access::kOut, DType::kF32);
  const Reg zero{0}, stride{1};
  b.li(zero, 0);
  b.li(stride, 34);
  b.tdef(Tile{0}, DType::kF32, 4, 1, 0);
  b.tdef(Tile{1}, DType::kF32, 1, 32, 64);
  b.tld(Tile{1}, ax, zero, DType::kF32);
  b.tmv(Tile{0}, aw, zero, stride, Tile{1}, DType::kQ8_0);
  const Status s = sim.run(b, {w.arg(), x.arg(), y.arg()});
  EXPECT_EQ(s.code(), StatusCode::kHazard) << s.to_string();
}

// `b` builds and its disassembly contains `text`; with `bad` appended it fails to
// build, naming `rule`.
void expect_text_then_rejected(KernelBuilder b, const std::string& text, const Insn& bad,
                               const std::string& rule) {
  auto image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_NE(disassemble(*image).find(text), std::string::npos) << disassemble(*image);
  b.emit(bad);
  const Status s = b.build().status();
  EXPECT_TRUE(contains(s, rule)) << s.to_string();
}

TEST(TmvEncoding, DisassemblesAndRejectsForeignFlags) {
  KernelBuilder b("tmv_text");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, DType::kQ4_K);
  const Reg zero{0};
  b.tdef(Tile{0}, DType::kF32, 4, 1, 0);
  b.tdef(Tile{1}, DType::kF32, 1, 256, 64);
  b.tmv(Tile{0}, aw, zero, zero, Tile{1}, DType::kQ4_K, /*accumulate=*/true);
  Insn bad = make_insn(Opcode::kTmv, 0, 0, 0, 0, static_cast<uint8_t>(DType::kF32), kTransB | kAccumulate);
  bad.e = 1;
  expect_text_then_rejected(std::move(b), "tmv t0, arg0[r0], stride_bytes r0, t1, q4_K, accumulate", bad,
                            "kAccumulate");
}
TEST(TldqEncoding, TransposedDisassemblesAndForeignFlagsAreRejected) {
  KernelBuilder b("tldq_text");
  const uint8_t aw = b.arg_buffer("w", Access::kIn, DType::kQ8_0);
  const Reg zero{0};
  b.li(zero, 0);
  b.tdef(Tile{0}, DType::kF32, 32, 4, 0);
  b.tldq(Tile{0}, aw, zero, zero, DType::kQ8_0, /*transposed=*/true);
  const Insn bad = make_insn(Opcode::kTldq, 0, 0, 0, 0, static_cast<uint8_t>(DType::kQ8_0), kAccumulate);
  expect_text_then_rejected(std::move(b), "tldq t0, arg0[r0], stride_bytes r0, q8_0, trans", bad, "kTransB");
}
}  // namespace
}  // namespace npurt
