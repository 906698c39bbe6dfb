// Highway implementation of sim::matvec (see matvec_kernels.h): the 16-lane vocabulary
// each target implements, the fixed-point form of x, and the dispatch. The row
// kernels themselves are in matvec_rows-inl.h, compiled once per target (twice on
// AVX-512: with VPDPBUSD and without).

#include "hal/sim/matvec_kernels.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hal/sim/dequant_kernels.h"
#include "isa/quant_layout.h"
#include "npurt/isa/numeric.h"
#include "npurt/isa/quant.h"

#include "hal/sim/hwy_targets.h"  // before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "hal/sim/matvec_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace npurt::sim {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- 16 lanes ------------------------------------------------------------------------
// FV: 16 f32 lanes; IV: 16 i32 lanes; BV: 64 u8 lanes (byte 4l .. 4l + 3 feeding i32
// lane l); F8: 8 f32 lanes. Every operation is the same IEEE (or exact integer)
// operation per lane on every target, so the lanes hold the same bits everywhere.

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define NPURT_MV_512 1
struct FV { __m512 v; };
struct IV { __m512i v; };
struct BV { __m512i v; };
struct F8 { __m256 v; };

HWY_INLINE FV LoadF(const float* p) { return {_mm512_loadu_ps(p)}; }
HWY_INLINE FV ZeroF() { return {_mm512_setzero_ps()}; }
HWY_INLINE FV MulF(FV a, FV b) { return {_mm512_mul_ps(a.v, b.v)}; }
// a * b + c, one rounding.
HWY_INLINE FV FmaF(FV a, FV b, FV c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// As FmaF in lanes 0..7; lanes 8..15 keep c.
HWY_INLINE FV FmaLowF(FV a, FV b, FV c) { return {_mm512_mask3_fmadd_ps(a.v, b.v, c.v, 0x00ff)}; }
HWY_INLINE FV ToF(IV a) { return {_mm512_cvtepi32_ps(a.v)}; }
// [f16 at a as f32] x 8, [f16 at b] x 8 (exact): each half broadcast as words, then
// one conversion, where converting each alone and splatting the floats costs twice
// the instructions (Q*_0 do it for every 64 values).
HWY_INLINE FV HalvesAt(const uint8_t* a, const uint8_t* b) {
  uint16_t ha, hb;
  std::memcpy(&ha, a, 2);
  std::memcpy(&hb, b, 2);
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(ha))),
                                            _mm_set1_epi16(static_cast<short>(hb)), 1);
  return {_mm512_cvtph_ps(h)};
}
// Lane l of the result is lane idx[l] of a (idx: 16 values in 0..15).
HWY_INLINE FV PermuteF(FV a, const int32_t* idx) { return {_mm512_permutexvar_ps(_mm512_loadu_si512(idx), a.v)}; }
HWY_INLINE F8 UpperF8(FV a) { return {_mm512_extractf32x8_ps(a.v, 1)}; }
// f32(b[l]) * scale[l] for the 16 bytes at b (u8, or i8 with kSigned).
template <bool kSigned>
HWY_INLINE FV ScaleBytes(const void* b, FV scale) {
  const __m128i v = _mm_loadu_si128(static_cast<const __m128i*>(b));
  const __m512i i = kSigned ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
  return MulF(scale, {_mm512_cvtepi32_ps(i)});
}
HWY_INLINE float Tree8(__m256 v) {
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}
// ((l + l+8) + (l+4 ...)) ...: the halving tree.
HWY_INLINE float Tree16(FV a) {
  return Tree8(_mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1)));
}
HWY_INLINE F8 LoadF8(const float* p) { return {_mm256_loadu_ps(p)}; }
HWY_INLINE F8 ZeroF8() { return {_mm256_setzero_ps()}; }
HWY_INLINE F8 FmaF8(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
HWY_INLINE float Tree8(F8 a) { return Tree8(a.v); }

HWY_INLINE IV LoadI(const int32_t* p) { return {_mm512_loadu_si512(p)}; }
HWY_INLINE IV SubI(IV a, IV b) { return {_mm512_sub_epi32(a.v, b.v)}; }

HWY_INLINE BV LoadB(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
// Bytes 0..31 from p, 32..63 from q.
HWY_INLINE BV LoadB2(const uint8_t* p, const uint8_t* q) {
  return {_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), 1)};
}
// The 32 bytes at p in both halves.
HWY_INLINE BV BroadcastB(const uint8_t* p) {
  return {_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
HWY_INLINE BV AndB(BV a, uint8_t m) { return {_mm512_and_si512(a.v, _mm512_set1_epi8(static_cast<char>(m)))}; }
HWY_INLINE BV OrB(BV a, BV b) { return {_mm512_or_si512(a.v, b.v)}; }
HWY_INLINE BV XorB(BV a, uint8_t m) { return {_mm512_xor_si512(a.v, _mm512_set1_epi8(static_cast<char>(m)))}; }
// Per byte: b >> 4.
HWY_INLINE BV HighNibbles(BV a) { return AndB({_mm512_srli_epi16(a.v, 4)}, 15); }
// 16-bit word shifts, by lo in bytes 0..31 and by hi in bytes 32..63 (bits cross into
// the neighbouring byte: callers mask).
HWY_INLINE BV ShiftLeftHalves(BV a, int lo, int hi) {
  return {_mm512_sllv_epi16(a.v, _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(lo)), _mm256_set1_epi16(static_cast<short>(hi)), 1))};
}
HWY_INLINE BV ShiftRightHalves(BV a, int lo, int hi) {
  return {_mm512_srlv_epi16(a.v, _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(lo)), _mm256_set1_epi16(static_cast<short>(hi)), 1))};
}
// The 32 values of a Q4_0 / Q5_0 block from its 16 qs bytes at p (low nibbles, then
// high) in bytes 0..31, and q's in bytes 32..63.
HWY_INLINE BV NibblePairs(const uint8_t* p, const uint8_t* q) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(a), 0xff00, b);
  return AndB({_mm512_mask_srli_epi16(v, 0xff00ff00, v, 4)}, 15);
}
// Adds 16 to byte j < 32 where bit j of the 32-bit word at lo is set, and to byte 32 + j
// where bit j of the word at hi is.
HWY_INLINE BV AddSixteenWhere(BV a, const uint8_t* lo, const uint8_t* hi) {
  uint32_t l, h;
  std::memcpy(&l, lo, 4);
  std::memcpy(&h, hi, 4);
  // Each word into a mask register, the two joined there (kunpckdq), not in a 64-bit
  // general register first.
  const __mmask64 bits = _mm512_kunpackd(_cvtu32_mask32(h), _cvtu32_mask32(l));
  return {_mm512_mask_add_epi8(a.v, bits, a.v, _mm512_set1_epi8(16))};
}

// Per i32 lane: sum over its 4 bytes of w (u8) * digit (i8), for the three digits of
// X (x2 at d, x1 at d + 64, x0 at d + 128) combined as x2 * 2^14 + x1 * 2^7 + x0.
// Exact. Without VNNI: VPMADDUBSW (pairs: |w| <= 255 times |digit| <= 64, twice,
// fits i16) then VPMADDWD by the digit's weight.
HWY_INLINE IV DotDigitsMadd(BV w, const int8_t* d) {
  const __m512i p2 = _mm512_maddubs_epi16(w.v, _mm512_loadu_si512(d));
  const __m512i p1 = _mm512_maddubs_epi16(w.v, _mm512_loadu_si512(d + 64));
  const __m512i p0 = _mm512_maddubs_epi16(w.v, _mm512_loadu_si512(d + 128));
  const __m512i s2 = _mm512_madd_epi16(p2, _mm512_set1_epi16(1 << 14));
  const __m512i s1 = _mm512_madd_epi16(p1, _mm512_set1_epi16(1 << 7));
  const __m512i s0 = _mm512_madd_epi16(p0, _mm512_set1_epi16(1));
  return {_mm512_add_epi32(_mm512_add_epi32(s2, s1), s0)};
}

#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
#define NPURT_MV_256 1
// Lanes 0..7 in lo, 8..15 in hi; bytes 0..31 in lo, 32..63 in hi.
struct FV { __m256 lo, hi; };
struct IV { __m256i lo, hi; };
struct BV { __m256i lo, hi; };
struct F8 { __m256 v; };

HWY_INLINE __m256i Load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
HWY_INLINE FV LoadF(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
HWY_INLINE FV ZeroF() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
HWY_INLINE FV MulF(FV a, FV b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
HWY_INLINE FV FmaF(FV a, FV b, FV c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
HWY_INLINE FV FmaLowF(FV a, FV b, FV c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), c.hi}; }
HWY_INLINE FV ToF(IV a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
HWY_INLINE FV HalvesAt(const uint8_t* a, const uint8_t* b) {
  uint16_t ha, hb;
  std::memcpy(&ha, a, 2);
  std::memcpy(&hb, b, 2);
  return {_mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ha))), _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(hb)))};
}
// Lane l of the result is lane idx[l] of a; lanes 0..7 and 8..15 of the result each
// take lanes from one half of a (as every caller's idx does).
HWY_INLINE FV PermuteF(FV a, const int32_t* idx) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + 8));
  return {_mm256_permutevar8x32_ps(idx[0] < 8 ? a.lo : a.hi, lo), _mm256_permutevar8x32_ps(idx[8] < 8 ? a.lo : a.hi, hi)};
}
HWY_INLINE F8 UpperF8(FV a) { return {a.hi}; }
template <bool kSigned>
HWY_INLINE FV ScaleBytes(const void* b, FV scale) {
  const auto* p = static_cast<const uint8_t*>(b);
  const __m128i v0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i v1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8));
  const __m256i i0 = kSigned ? _mm256_cvtepi8_epi32(v0) : _mm256_cvtepu8_epi32(v0);
  const __m256i i1 = kSigned ? _mm256_cvtepi8_epi32(v1) : _mm256_cvtepu8_epi32(v1);
  return {_mm256_mul_ps(scale.lo, _mm256_cvtepi32_ps(i0)), _mm256_mul_ps(scale.hi, _mm256_cvtepi32_ps(i1))};
}
HWY_INLINE float Tree8(__m256 v) {
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}
HWY_INLINE float Tree16(FV a) { return Tree8(_mm256_add_ps(a.lo, a.hi)); }
HWY_INLINE F8 LoadF8(const float* p) { return {_mm256_loadu_ps(p)}; }
HWY_INLINE F8 ZeroF8() { return {_mm256_setzero_ps()}; }
HWY_INLINE F8 FmaF8(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
HWY_INLINE float Tree8(F8 a) { return Tree8(a.v); }

HWY_INLINE IV LoadI(const int32_t* p) { return {Load256(p), Load256(p + 8)}; }
HWY_INLINE IV SubI(IV a, IV b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }

HWY_INLINE BV LoadB(const uint8_t* p) { return {Load256(p), Load256(p + 32)}; }
HWY_INLINE BV LoadB2(const uint8_t* p, const uint8_t* q) { return {Load256(p), Load256(q)}; }
HWY_INLINE BV BroadcastB(const uint8_t* p) {
  const __m256i v = Load256(p);
  return {v, v};
}
HWY_INLINE BV AndB(BV a, uint8_t m) {
  const __m256i vm = _mm256_set1_epi8(static_cast<char>(m));
  return {_mm256_and_si256(a.lo, vm), _mm256_and_si256(a.hi, vm)};
}
HWY_INLINE BV OrB(BV a, BV b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
HWY_INLINE BV XorB(BV a, uint8_t m) {
  const __m256i vm = _mm256_set1_epi8(static_cast<char>(m));
  return {_mm256_xor_si256(a.lo, vm), _mm256_xor_si256(a.hi, vm)};
}
HWY_INLINE BV HighNibbles(BV a) { return AndB({_mm256_srli_epi16(a.lo, 4), _mm256_srli_epi16(a.hi, 4)}, 15); }
HWY_INLINE BV ShiftLeftHalves(BV a, int lo, int hi) {
  return {_mm256_sll_epi16(a.lo, _mm_cvtsi32_si128(lo)), _mm256_sll_epi16(a.hi, _mm_cvtsi32_si128(hi))};
}
HWY_INLINE BV ShiftRightHalves(BV a, int lo, int hi) {
  return {_mm256_srl_epi16(a.lo, _mm_cvtsi32_si128(lo)), _mm256_srl_epi16(a.hi, _mm_cvtsi32_si128(hi))};
}
// The 16 bytes at p in both halves (one load), the upper half shifted right by 4: low
// nibbles in bytes 0..15, high nibbles in 16..31.
HWY_INLINE __m256i NibblePair(const uint8_t* p) {
  const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(a, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}
HWY_INLINE BV NibblePairs(const uint8_t* p, const uint8_t* q) { return {NibblePair(p), NibblePair(q)}; }
// 0x10 in byte j where bit j of the 32-bit word at p is set: the word in every dword
// (one load), byte j / 8 of it spread to byte j, that byte's bit j % 8 tested.
HWY_INLINE __m256i SixteenWhere(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}
HWY_INLINE BV AddSixteenWhere(BV a, const uint8_t* lo, const uint8_t* hi) {
  return {_mm256_add_epi8(a.lo, SixteenWhere(lo)), _mm256_add_epi8(a.hi, SixteenWhere(hi))};
}
HWY_INLINE __m256i DotDigits256(__m256i w, const int8_t* d) {
  const __m256i s2 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, Load256(d)), _mm256_set1_epi16(1 << 14));
  const __m256i s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, Load256(d + 64)), _mm256_set1_epi16(1 << 7));
  const __m256i s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, Load256(d + 128)), _mm256_set1_epi16(1));
  return _mm256_add_epi32(_mm256_add_epi32(s2, s1), s0);
}
HWY_INLINE IV DotDigitsMadd(BV w, const int8_t* d) { return {DotDigits256(w.lo, d), DotDigits256(w.hi, d + 32)}; }

#else
// The portable fallback: the same lanes in arrays, FMA by std::fma.
struct FV { float v[16]; };
struct IV { int32_t v[16]; };
struct BV { uint8_t v[64]; };
struct F8 { float v[8]; };

HWY_INLINE FV LoadF(const float* p) { FV r; std::memcpy(r.v, p, sizeof r.v); return r; }
HWY_INLINE FV ZeroF() { return FV{}; }
HWY_INLINE FV MulF(FV a, FV b) { for (int l = 0; l < 16; ++l) a.v[l] *= b.v[l]; return a; }
HWY_INLINE FV FmaF(FV a, FV b, FV c) { for (int l = 0; l < 16; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
HWY_INLINE FV FmaLowF(FV a, FV b, FV c) { for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
HWY_INLINE FV ToF(IV a) { FV r; for (int l = 0; l < 16; ++l) r.v[l] = static_cast<float>(a.v[l]); return r; }
HWY_INLINE FV HalvesAt(const uint8_t* a, const uint8_t* b) {
  uint16_t ha, hb;
  std::memcpy(&ha, a, 2);
  std::memcpy(&hb, b, 2);
  FV r;
  for (int l = 0; l < 16; ++l) r.v[l] = isa::f16_to_f32(l < 8 ? ha : hb);
  return r;
}
HWY_INLINE FV PermuteF(FV a, const int32_t* idx) { FV r; for (int l = 0; l < 16; ++l) r.v[l] = a.v[idx[l]]; return r; }
HWY_INLINE F8 UpperF8(FV a) { F8 r; std::memcpy(r.v, a.v + 8, sizeof r.v); return r; }
template <bool kSigned>
HWY_INLINE FV ScaleBytes(const void* b, FV scale) {
  FV r;
  for (int l = 0; l < 16; ++l) {
    const int v = kSigned ? static_cast<const int8_t*>(b)[l] : static_cast<const uint8_t*>(b)[l];
    r.v[l] = scale.v[l] * static_cast<float>(v);
  }
  return r;
}
HWY_INLINE float Tree8(const float* v) {
  const float a0 = v[0] + v[4], a1 = v[1] + v[5], a2 = v[2] + v[6], a3 = v[3] + v[7];
  const float b0 = a0 + a2, b1 = a1 + a3;
  return b0 + b1;
}
HWY_INLINE float Tree16(FV a) { float h[8]; for (int l = 0; l < 8; ++l) h[l] = a.v[l] + a.v[l + 8]; return Tree8(h); }
HWY_INLINE F8 LoadF8(const float* p) { F8 r; std::memcpy(r.v, p, sizeof r.v); return r; }
HWY_INLINE F8 ZeroF8() { return F8{}; }
HWY_INLINE F8 FmaF8(F8 a, F8 b, F8 c) { for (int l = 0; l < 8; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
HWY_INLINE float Tree8(F8 a) { return Tree8(a.v); }

HWY_INLINE IV LoadI(const int32_t* p) { IV r; std::memcpy(r.v, p, sizeof r.v); return r; }
HWY_INLINE IV SubI(IV a, IV b) { for (int l = 0; l < 16; ++l) a.v[l] -= b.v[l]; return a; }

HWY_INLINE BV LoadB(const uint8_t* p) { BV r; std::memcpy(r.v, p, 64); return r; }
HWY_INLINE BV LoadB2(const uint8_t* p, const uint8_t* q) { BV r; std::memcpy(r.v, p, 32); std::memcpy(r.v + 32, q, 32); return r; }
HWY_INLINE BV BroadcastB(const uint8_t* p) { return LoadB2(p, p); }
HWY_INLINE BV AndB(const BV& a, uint8_t m) { BV r; for (int j = 0; j < 64; ++j) r.v[j] = a.v[j] & m; return r; }
HWY_INLINE BV OrB(const BV& a, const BV& b) { BV r; for (int j = 0; j < 64; ++j) r.v[j] = a.v[j] | b.v[j]; return r; }
HWY_INLINE BV XorB(const BV& a, uint8_t m) { BV r; for (int j = 0; j < 64; ++j) r.v[j] = a.v[j] ^ m; return r; }
HWY_INLINE BV HighNibbles(const BV& a) { BV r; for (int j = 0; j < 64; ++j) r.v[j] = static_cast<uint8_t>(a.v[j] >> 4); return r; }
// As the vector forms: 16-bit little-endian words shifted.
HWY_INLINE BV ShiftHalves(const BV& a, int lo, int hi, bool left) {
  BV r;
  for (int j = 0; j < 64; j += 2) {
    const int n = j < 32 ? lo : hi;
    const unsigned w = a.v[j] | (unsigned{a.v[j + 1]} << 8);
    const unsigned s = (left ? w << n : w >> n) & 0xffff;
    r.v[j] = static_cast<uint8_t>(s);
    r.v[j + 1] = static_cast<uint8_t>(s >> 8);
  }
  return r;
}
HWY_INLINE BV ShiftLeftHalves(const BV& a, int lo, int hi) { return ShiftHalves(a, lo, hi, true); }
HWY_INLINE BV ShiftRightHalves(const BV& a, int lo, int hi) { return ShiftHalves(a, lo, hi, false); }
HWY_INLINE BV NibblePairs(const uint8_t* p, const uint8_t* q) {
  BV r;
  for (int j = 0; j < 16; ++j) {
    r.v[j] = p[j] & 15;
    r.v[16 + j] = static_cast<uint8_t>(p[j] >> 4);
    r.v[32 + j] = q[j] & 15;
    r.v[48 + j] = static_cast<uint8_t>(q[j] >> 4);
  }
  return r;
}
HWY_INLINE BV AddSixteenWhere(BV a, const uint8_t* lo, const uint8_t* hi) {
  for (int j = 0; j < 64; ++j) {
    const uint8_t* p = j < 32 ? lo : hi;
    a.v[j] = static_cast<uint8_t>(a.v[j] + ((p[(j % 32) / 8] >> (j % 8)) & 1) * 16);
  }
  return a;
}
HWY_INLINE IV DotDigitsMadd(BV w, const int8_t* d) {
  IV r;
  for (int l = 0; l < 16; ++l) {
    int32_t s[3] = {0, 0, 0};
    for (int i = 4 * l; i < 4 * l + 4; ++i) {
      for (int g = 0; g < 3; ++g) s[g] += w.v[i] * d[64 * g + i];
    }
    r.v[l] = s[0] * (1 << 14) + s[1] * (1 << 7) + s[2];
  }
  return r;
}
#endif

// ---- x in fixed point ------------------------------------------------------------------
// A row is cut into pieces of 64 values, each made of two halves of 32 that a type
// takes from x at offsets of its own (HalfSource). Per piece the prepared vector holds
// the digits of X in the order the weights' bytes come (64 x2, 64 x1, 64 x0), then, for
// biased types, bias * (sum of X over each lane's 4 values) as 16 i32. Per unit of the
// type (64 or 256 values) 16 floats of s: per lane of the unit's one piece (64-value
// units), or per group in x order (256-value units, 8 or 16 groups). K types add 8
// floats per block: s_j * sum_j X for its sub-blocks.

constexpr int kNotFinite = -1000;

// e for the n values at x (n = 16 or 32): s = 2^e with |x / s| < 2^20, or kNotFinite.
HWY_INLINE int GroupExp(const float* x, size_t n) {
  const hn::CappedTag<float, 16> d;
  auto m = hn::Zero(d);
  for (size_t i = 0; i < n; i += hn::Lanes(d)) {
    const auto v = hn::LoadU(d, x + i);
    if (!hn::AllTrue(d, hn::IsFinite(v))) return kNotFinite;
    m = hn::Max(m, hn::Abs(v));
  }
  int e = 0;
  std::frexp(hn::GetLane(hn::MaxOfLanes(d, m)), &e);  // max < 2^e
  return std::max(e - 20, -149);
}

// X = round(x / 2^e) (ties to even) for n values, exact: a power-of-two scaling, in two
// steps where 2^-e itself is not a finite f32.
HWY_INLINE void ToFixed(const float* x, size_t n, int e, int32_t* X) {
  const hn::CappedTag<float, 16> d;
  const hn::Rebind<int32_t, decltype(d)> di;
  const bool split = -e > 127;
  const auto f1 = hn::Set(d, std::ldexp(1.0f, split ? 64 : -e)), f2 = hn::Set(d, std::ldexp(1.0f, split ? -e - 64 : 0));
  for (size_t i = 0; i < n; i += hn::Lanes(d)) {
    auto v = hn::Mul(hn::LoadU(d, x + i), f1);
    if (split) v = hn::Mul(v, f2);
    hn::StoreU(hn::ConvertTo(di, hn::Round(v)), di, X + i);
  }
}

// X = x2 * 2^14 + x1 * 2^7 + x0 with each digit in [-64, 64], for 32 values to
// out[0..32), out[64..96) and out[128..160).
HWY_INLINE void PutDigits(const int32_t* X, int8_t* out) {
  const hn::CappedTag<int32_t, 16> di;
  const hn::Rebind<int8_t, decltype(di)> d8;
  for (size_t i = 0; i < 32; i += hn::Lanes(di)) {
    const auto v = hn::LoadU(di, X + i);
    const auto x2 = hn::ShiftRight<14>(hn::Add(v, hn::Set(di, 1 << 13)));
    const auto r = hn::Sub(v, hn::ShiftLeft<14>(x2));
    const auto x1 = hn::ShiftRight<7>(hn::Add(r, hn::Set(di, 64)));
    const auto x0 = hn::Sub(r, hn::ShiftLeft<7>(x1));
    hn::StoreU(hn::DemoteTo(d8, x2), d8, out + i);
    hn::StoreU(hn::DemoteTo(d8, x1), d8, out + 64 + i);
    hn::StoreU(hn::DemoteTo(d8, x0), d8, out + 128 + i);
  }
}

// How a type's rows are cut (see matvec_rows-inl.h for the weight side).
struct Layout {
  size_t unit;   // values per unit: 64 (two Q*_0 blocks) or 256 (a K block)
  size_t group;  // values per scale s of x: 32, or 16
  int bias;      // subtracted from the unsigned weight values (0 for K types)
  bool mins;     // K types: sub-block sums of X for the minimum terms
  bool k_order;  // halves of piece p are sub-blocks 4 (p / 2) + p % 2 and + 2 (Q4_K, Q5_K)
};

constexpr size_t PieceBytes(const Layout& t) { return 192 + (t.bias != 0 ? 64 : 0); }

// Where half i of piece p starts in x.
HWY_INLINE size_t HalfSource(const Layout& t, size_t p, size_t i) {
  if (!t.k_order) return 64 * p + 32 * i;
  const size_t in_block = p % 4;
  return 256 * (p / 4) + 32 * (4 * (in_block / 2) + in_block % 2 + 2 * i);
}

// The prepared form of one vector for a type; `pieces` covers k (the last piece of a
// row with an odd number of 32-value blocks has a zero second half).
struct PreparedX {
  std::vector<int8_t> digits;   // pieces x PieceBytes
  std::vector<float> unit_s;    // units x 16
  std::vector<float> min_sums;  // K types: blocks x 8
  std::vector<float> source;    // the x these were prepared from (PrepareOnce)
};

// Fills px for x (k values); false if x has a value that is not finite.
inline bool Prepare(const Layout& t, const float* x, size_t k, PreparedX& px) {
  const size_t pieces = (k + 63) / 64, pb = PieceBytes(t), units = (k + t.unit - 1) / t.unit;
  px.digits.assign(pieces * pb, 0);
  px.unit_s.assign(units * 16, 0.0f);
  px.min_sums.assign(t.mins ? k / 256 * 8 : 0, 0.0f);
  HWY_ALIGN int32_t X[32];
  for (size_t p = 0; p < pieces; ++p) {
    int8_t* dig = px.digits.data() + p * pb;
    for (size_t i = 0; i < 2; ++i) {
      const size_t src = HalfSource(t, p, i);
      if (src >= k) break;  // the missing half of an odd last block: zero digits
      float s = 0.0f;
      for (size_t g = 0; g < 32; g += t.group) {
        const int e = GroupExp(x + src + g, t.group);
        if (e == kNotFinite) return false;
        ToFixed(x + src + g, t.group, e, X + g);
        s = std::ldexp(1.0f, e);
        float* us = px.unit_s.data() + 16 * (src / t.unit);
        if (t.unit == 64) {
          std::fill(us + 8 * i, us + 8 * i + 8, s);
        } else {
          us[(src + g) % t.unit / t.group] = s;
        }
      }
      PutDigits(X, dig + 32 * i);
      if (t.bias != 0) {
        int32_t bias[8];
        for (size_t l = 0; l < 8; ++l) bias[l] = t.bias * (X[4 * l] + X[4 * l + 1] + X[4 * l + 2] + X[4 * l + 3]);
        std::memcpy(dig + 192 + 32 * i, bias, sizeof bias);
      }
      if (t.mins) {
        int32_t sum = 0;
        for (size_t l = 0; l < 32; ++l) sum += X[l];
        px.min_sums[src / 32] = s * static_cast<float>(sum);
      }
    }
  }
  return true;
}

// Prepare, unless px holds the prepared form of these very k values already: the
// blocks of one GEMV that a host thread runs in turn share x, and an equal x gives
// equal digits, so all but the first skip the work.
inline bool PrepareOnce(const Layout& t, const float* x, size_t k, PreparedX& px) {
  if (px.source.size() == k && std::memcmp(px.source.data(), x, k * sizeof(float)) == 0) return true;
  px.source.clear();
  if (!Prepare(t, x, k, px)) return false;
  px.source.assign(x, x + k);
  return true;
}

// ---- rows and batches --------------------------------------------------------------------

// Software prefetch distance for streamed weight rows: the hardware prefetchers alone
// leave one core's stream latency-bound well below DRAM bandwidth.
constexpr size_t kPrefetchBytes = 1024;

// One vector's rows are taken kStreams at a time, one from each of kStreams equal
// sub-ranges of the rows: one core then reads kStreams independent sequential
// streams, as the STREAM-style read does, where adjacent rows would be one stream.
constexpr size_t kStreams = 4;
// Vectors one pass over a row takes at once in a batch: they share each block's
// decoding, and their accumulators stay in registers.
constexpr size_t kBatchChunk = 4;

template <size_t N>
using Count = std::integral_constant<size_t, N>;

// Calls dot(rows, out, Count<n>) for every row of a one-vector matvec: kStreams rows
// far apart, then the rows left over one by one; out[r] is row rows[r]'s result.
template <typename Dot>
HWY_INLINE void StreamRows(const uint8_t* base, size_t stride, size_t rows, float* y, bool accumulate, const Dot& dot) {
  const auto put = [&](size_t i, float v) { y[i] = accumulate ? y[i] + v : v; };
  const size_t seg = rows / kStreams;
  // The row loop prefetches kPrefetchBytes ahead of where it reads, so each stream's
  // first bytes would come by demand misses, one latency after another; a core's share
  // of a small GEMV (8 blocks of attn_k: 14 KB) is a third such bytes. Ask for them all
  // at once.
  const size_t lead = std::min(kPrefetchBytes, std::max<size_t>(seg, 1) * stride);
  for (size_t s = 0; s < (seg ? kStreams : 1); ++s) {
    for (size_t b = 0; b < lead; b += 64) hwy::Prefetch(base + s * seg * stride + b);
  }
  for (size_t j = 0; j < seg; ++j) {
    const uint8_t* rp[kStreams];
    float v[kStreams];
    for (size_t s = 0; s < kStreams; ++s) rp[s] = base + (s * seg + j) * stride;
    dot(rp, v, Count<kStreams>{});
    for (size_t s = 0; s < kStreams; ++s) put(s * seg + j, v[s]);
  }
  for (size_t i = kStreams * seg; i < rows; ++i) {
    const uint8_t* rp = base + i * stride;
    float v;
    dot(&rp, &v, Count<1>{});
    put(i, v);
  }
}

// Rows a batch takes in turn per chunk of vectors: their bytes (16 KiB of q8_0 rows
// of 640 values) stay in the first-level cache while each chunk passes over them, and
// one chunk's prepared vectors with them; a whole batch of 16 prepared vectors would
// not fit beside a row (about 3 KiB each at k = 640).
constexpr size_t kBatchRowBlockBytes = 16 << 10;

// Calls dot(row, t0, out, Count<n>) for every row and every chunk of at most
// kBatchChunk vectors t0 .. t0 + n, a block of rows at a time: a row comes from memory
// for its first chunk and from cache for the others. out[j] is vector t0 + j's result,
// which goes to ys[t0 + j].
template <typename Dot>
HWY_INLINE void BatchRows(const uint8_t* base, size_t stride, size_t rows, size_t batch, float* const* ys,
                          bool accumulate, const Dot& dot) {
  const size_t block = std::max<size_t>(1, kBatchRowBlockBytes / std::max<size_t>(stride, 1));
  for (size_t i0 = 0; i0 < rows; i0 += block) {
    const size_t i1 = std::min(rows, i0 + block);
    for (size_t t0 = 0; t0 < batch; t0 += kBatchChunk) {
      const size_t n = std::min(kBatchChunk, batch - t0);
      for (size_t i = i0; i < i1; ++i) {
        const uint8_t* row = base + i * stride;
        float v[kBatchChunk];
        switch (n) {
          case 1: dot(row, t0, v, Count<1>{}); break;
          case 2: dot(row, t0, v, Count<2>{}); break;
          case 3: dot(row, t0, v, Count<3>{}); break;
          default: dot(row, t0, v, Count<4>{}); break;
        }
        for (size_t j = 0; j < n; ++j) {
          float& out = ys[t0 + j][i];
          out = accumulate ? out + v[j] : v[j];
        }
      }
    }
  }
}

// ---- plain rows (f32, bf16, f16) ----------------------------------------------------------

HWY_INLINE float ScalarAt(const uint8_t* row, isa::DType type, size_t j) {
  if (type == isa::DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * j, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * j, 2);
  return type == isa::DType::kBF16 ? isa::bf16_to_f32(h) : isa::f16_to_f32(h);
}

// 16 consecutive values of a plain row as f32 (exact).
HWY_INLINE FV LoadRow16(const uint8_t* p, isa::DType type) {
  if (type == isa::DType::kF32) {
    HWY_ALIGN float f[16];
    std::memcpy(f, p, 64);
    return LoadF(f);
  }
  const hn::CappedTag<float, 16> df;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  const hn::Rebind<uint32_t, decltype(df)> d32;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  HWY_ALIGN float f[16];
  for (size_t i = 0; i < 16; i += hn::Lanes(df)) {
    const auto h = hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p) + i);
    const auto v = type == isa::DType::kBF16 ? hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(d32, h)))
                                              : hn::PromoteTo(df, hn::BitCast(dh, h));
    hn::Store(v, df, f + i);
  }
  return LoadF(f);
}

// R rows against N vectors of a plain type.
template <size_t R, size_t N>
HWY_INLINE void DotPlain(const uint8_t* const* row, isa::DType type, const float* const* x, size_t k, float* out) {
  FV acc[R][N];
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < N; ++t) acc[r][t] = ZeroF();
  }
  const size_t esize = isa::dtype_size(type), body = k / 16 * 16;
  for (size_t j = 0; j < body; j += 16) {
    for (size_t r = 0; r < R; ++r) {
      hwy::Prefetch(row[r] + j * esize + kPrefetchBytes);
      const FV w = LoadRow16(row[r] + j * esize, type);
      for (size_t t = 0; t < N; ++t) acc[r][t] = FmaF(w, LoadF(x[t] + j), acc[r][t]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t t = 0; t < N; ++t) {
      float s = Tree16(acc[r][t]);
      for (size_t j = body; j < k; ++j) s = std::fma(ScalarAt(row[r], type, j), x[t][j], s);
      out[r * N + t] = s;
    }
  }
}

void MatVecPlain(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                 size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  if (batch == 1) {
    StreamRows(base, stride, rows, y, accumulate, [&](const uint8_t* const* rp, float* out, auto n) {
      DotPlain<decltype(n)::value, 1>(rp, type, &x, k, out);
    });
    return;
  }
  float* ys[isa::kMaxTmvBatch];
  for (size_t t = 0; t < batch; ++t) ys[t] = y + t * y_pitch;
  BatchRows(base, stride, rows, batch, ys, accumulate, [&](const uint8_t* row, size_t t0, float* out, auto n) {
    constexpr size_t N = decltype(n)::value;
    const float* xs[N];
    for (size_t j = 0; j < N; ++j) xs[j] = x + (t0 + j) * x_pitch;
    DotPlain<1, N>(&row, type, xs, k, out);
  });
}

// The reference order, for a vector with a non-finite value and for the test-only
// reordering: each row dequantized, products added by FMA first to last (or last to
// first).
void MatVecReference(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                     float* y, bool accumulate, bool backwards) {
  std::vector<float> w(k);
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* row = base + i * stride;
    if (isa::dtype_is_quantized(type)) {
      dequantize(row, type, w.data(), k);
    } else {
      for (size_t j = 0; j < k; ++j) w[j] = ScalarAt(row, type, j);
    }
    float s = 0.0f;
    if (backwards) {
      for (size_t j = k; j-- > 0;) s = std::fma(w[j], x[j], s);
    } else {
      for (size_t j = 0; j < k; ++j) s = std::fma(w[j], x[j], s);
    }
    y[i] = accumulate ? y[i] + s : s;
  }
}

// ---- quantized rows ---------------------------------------------------------------------

namespace dot_madd {
#define NPURT_MV_ATTR
#define NPURT_MV_DOT DotDigitsMadd
#include "hal/sim/matvec_rows-inl.h"
#undef NPURT_MV_DOT
#undef NPURT_MV_ATTR
}  // namespace dot_madd

#if defined(NPURT_MV_512)
// VPDPBUSD: per lane, the sum of 4 u8 * i8 products added to the lane; the digits'
// sums combined by shifts (exact, as DotDigitsMadd).
#define NPURT_MV_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
namespace dot_vnni {
HWY_INLINE NPURT_MV_ATTR IV DotDigitsVnni(BV w, const int8_t* d) {
  const __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.v, _mm512_loadu_si512(d));
  const __m512i t2 = _mm512_dpbusd_epi32(_mm512_slli_epi32(t, 7), w.v, _mm512_loadu_si512(d + 64));
  return {_mm512_dpbusd_epi32(_mm512_slli_epi32(t2, 7), w.v, _mm512_loadu_si512(d + 128))};
}
#define NPURT_MV_DOT DotDigitsVnni
#include "hal/sim/matvec_rows-inl.h"
#undef NPURT_MV_DOT
}  // namespace dot_vnni
#undef NPURT_MV_ATTR
#endif

// A quantized matvec over up to isa::kMaxTmvBatch vectors: each vector in fixed point,
// the finite ones through the integer rows, any other in the reference order.
void MatVecQuantized(const uint8_t* base, isa::DType type, size_t stride, size_t rows, const float* x, size_t k,
                     size_t batch, size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
#if defined(NPURT_MV_512)
  if (matvec_vnni()) {
    dot_vnni::MatVecQuantized(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
    return;
  }
#endif
  dot_madd::MatVecQuantized(base, type, stride, rows, x, k, batch, x_pitch, y, y_pitch, accumulate);
}

void MatVecBatch(const void* w, isa::DType type, size_t stride, size_t rows, const float* x, size_t k, size_t batch,
                 size_t x_pitch, float* y, size_t y_pitch, bool accumulate) {
  const auto* base = static_cast<const uint8_t*>(w);
  if (batch > 1 && matvec_batch_reorder()) {
    for (size_t t = 0; t < batch; ++t) {
      MatVecReference(base, type, stride, rows, x + t * x_pitch, k, y + t * y_pitch, accumulate, /*backwards=*/true);
    }
    return;
  }
  for (size_t t0 = 0; t0 < batch; t0 += isa::kMaxTmvBatch) {
    const size_t n = std::min<size_t>(isa::kMaxTmvBatch, batch - t0);
    const float* xs = x + t0 * x_pitch;
    float* ys = y + t0 * y_pitch;
    if (isa::dtype_is_quantized(type)) {
      MatVecQuantized(base, type, stride, rows, xs, k, n, x_pitch, ys, y_pitch, accumulate);
    } else {
      MatVecPlain(base, type, stride, rows, xs, k, n, x_pitch, ys, y_pitch, accumulate);
    }
  }
}

const char* IsaName() {
#if defined(NPURT_MV_512)
  return matvec_vnni() ? "AVX3 + VNNI" : "AVX3";
#else
  return hwy::TargetName(HWY_TARGET);
#endif
}

#undef NPURT_MV_512
#undef NPURT_MV_256

}  // namespace HWY_NAMESPACE
}  // namespace npurt::sim
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace npurt::sim {

HWY_EXPORT(MatVecBatch);
HWY_EXPORT(IsaName);

namespace {
std::atomic<bool> g_vnni{__builtin_cpu_supports("avx512vnni") != 0};
std::atomic<bool> g_batch_reorder{false};
}  // namespace

bool matvec_vnni() { return g_vnni.load(std::memory_order_relaxed); }
void matvec_set_vnni_for_test(bool enabled) {
  g_vnni.store(enabled && __builtin_cpu_supports("avx512vnni") != 0, std::memory_order_relaxed);
}
bool matvec_batch_reorder() { return g_batch_reorder.load(std::memory_order_relaxed); }
void matvec_set_batch_reorder_for_test(bool reorder) { g_batch_reorder.store(reorder, std::memory_order_relaxed); }

void matvec(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
            float* y, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatVecBatch)(w, type, row_stride_bytes, rows, x, k, 1, k, y, rows, accumulate);
}

void matvec_batch(const void* w, isa::DType type, size_t row_stride_bytes, size_t rows, const float* x, size_t k,
                  size_t batch, float* y, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(MatVecBatch)(w, type, row_stride_bytes, rows, x, k, batch, k, y, rows, accumulate);
}

const char* matvec_isa() { return HWY_DYNAMIC_DISPATCH(IsaName)(); }

}  // namespace npurt::sim
#endif  // HWY_ONCE
