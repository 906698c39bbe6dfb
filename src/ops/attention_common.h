// What the attention operators (DecodeAttention, PrefillAttention) share, private to
// ops/: their parameter checks, name, buffer arguments and scale, the host reference
// of one query head, and the online softmax step of their kernels. Templates take
// either operator's params struct, which name the shared fields alike.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "npurt/isa/builder.h"
#include "ops/emit_util.h"

namespace npurt::ops {

// n_kv_heads: nonzero and dividing n_heads.
template <typename P>
Status check_kv_heads(std::string_view op, const P& p) {
  if (p.n_kv_heads == 0) return invalid_param(op, "n_kv_heads", "must be > 0");
  if (p.n_heads % p.n_kv_heads != 0) return invalid_param(op, "n_kv_heads", "must divide n_heads");
  return ok_status();
}

// max_len: nonzero and an i32 (`why` names the i32 the positions reach).
template <typename P>
Status check_max_len(std::string_view op, const P& p, std::string_view why) {
  if (p.max_len == 0) return invalid_param(op, "max_len", "must be > 0");
  if (p.max_len > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_param(op, "max_len", "must be <= 2^31 - 1 (" + std::string(why) + ")");
  }
  return ok_status();
}

// scale: finite and >= 0; kv_dtype: a plain float type.
template <typename P>
Status check_scale_and_kv_dtype(std::string_view op, const P& p) {
  if (!std::isfinite(p.scale) || p.scale < 0) {
    return invalid_param(op, "scale", "must be finite and >= 0 (0: 1/sqrt(head_dim))");
  }
  if (!is_float_io(p.kv_dtype)) return invalid_param(op, "kv_dtype", "must be f32, bf16 or f16");
  return ok_status();
}

// "<op> <kv_dtype> h<heads>/kv<kv heads> d<head_dim> max<max_len><extra>[ window<w>]".
template <typename P>
std::string attention_name(std::string_view op, const P& p, const std::string& extra = "") {
  std::string n = std::string(op) + " " + std::string(isa::dtype_name(p.kv_dtype)) + " h" +
                  std::to_string(p.n_heads) + "/kv" + std::to_string(p.n_kv_heads) + " d" +
                  std::to_string(p.head_dim) + " max" + std::to_string(p.max_len) + extra;
  if (p.window) n += " window" + std::to_string(p.window);
  return n;
}

// "q", "k_cache", "v_cache" and "out" (q and out of `q_elems` f32), the arguments both
// operators start with.
template <typename P>
std::vector<ArgSpec> attention_buffers(const P& p, uint64_t q_elems) {
  const uint64_t cache_elems = uint64_t{p.max_len} * p.n_kv_heads * p.head_dim;
  return {ArgSpec::buffer("q", Access::kIn, DType::kF32, q_elems),
          ArgSpec::buffer("k_cache", Access::kIn, p.kv_dtype, cache_elems),
          ArgSpec::buffer("v_cache", Access::kIn, p.kv_dtype, cache_elems),
          ArgSpec::buffer("out", Access::kOut, DType::kF32, q_elems)};
}

// The scale the scores get: `scale`, or 1/sqrt(head_dim) when it is 0.
template <typename P>
float attention_scale(const P& p) {
  return p.scale != 0 ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
}

// Host reference of one query head `q` (p.head_dim values) against kv head `g` of
// caches k and v ([position][kv head][dim], as f32), over positions [first, len):
// out = sum_t softmax(scale * q . k[t])_t v[t], in double.
template <typename P>
void attend_reference(const P& p, const float* q, const std::vector<float>& k, const std::vector<float>& v,
                      uint64_t g, int64_t first, int64_t len, double scale, float* out) {
  const uint64_t D = p.head_dim, KV = p.n_kv_heads;
  std::vector<double> score(len - first);
  for (int64_t t = first; t < len; ++t) {
    double dot = 0;
    for (uint64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[(t * KV + g) * D + d];
    score[t - first] = scale * dot;
  }
  const double max = *std::max_element(score.begin(), score.end());
  double sum = 0;
  for (double& x : score) sum += (x = std::exp(x - max));
  for (uint64_t d = 0; d < D; ++d) {
    double acc = 0;
    for (int64_t t = first; t < len; ++t) acc += score[t - first] * v[(t * KV + g) * D + d];
    out[d] = static_cast<float>(acc / sum);
  }
}

// Local memory of one attention work unit (`heads` query heads sharing one kv head):
// the scaled queries, the output accumulator, five per-head statistics columns, the
// score tile (heads x positions) and one K-or-V tile (positions x dim in the cache
// dtype; V reuses K's space once the scores are computed), from offset 0.
struct AttentionUnitLayout {
  uint32_t heads = 0, dim = 0, positions = 0, kv_esize = 0;

  uint64_t q() const { return 0; }
  uint64_t o() const { return q() + uint64_t{heads} * dim * 4; }
  uint64_t stat(int i) const { return o() + uint64_t{heads} * dim * 4 + uint64_t{heads} * 4 * i; }
  uint64_t scores() const { return stat(kNumStats); }
  uint64_t kv() const { return scores() + uint64_t{heads} * positions * 4; }
  uint64_t kv_end() const { return kv() + uint64_t{positions} * dim * kv_esize; }

  // Bytes that do not depend on `positions`, and those each position adds.
  uint64_t fixed_bytes() const { return scores(); }
  uint64_t per_position_bytes() const { return uint64_t{heads} * 4 + uint64_t{dim} * kv_esize; }

  static constexpr int kNumStats = 5;  // running max, tile max, rescale factor, running sum, tile sum
};

// Per-row statistics (rows x 1 tiles), the score tile (rows x positions) and the
// output accumulator (rows x dim) of an attention kernel.
struct OnlineSoftmaxTiles {
  isa::Tile max, tile_max, rescale, sum, tile_sum, scores, out;
};

// Folds one tile of scores into the running softmax of every row: m_new = max(m,
// rowmax(s)); the sum and the output accumulated under m are rescaled by exp(m -
// m_new), and the scores become this tile's weights exp(s - m_new), added to the sum.
// The caller then adds weights x V into `out`.
inline void emit_online_softmax_fold(isa::KernelBuilder& b, const OnlineSoftmaxTiles& t) {
  b.tred(isa::RedOp::kMax, t.tile_max, t.scores);
  b.tbin(BinOp::kMax, t.tile_max, t.tile_max, t.max);  // m_new
  b.tbin(BinOp::kSub, t.rescale, t.max, t.tile_max);
  b.tun(isa::UnOp::kExp, t.rescale, t.rescale);
  b.tbin(BinOp::kMax, t.max, t.max, t.tile_max);
  b.tbin(BinOp::kSub, t.scores, t.scores, t.tile_max, isa::kBcastCol);
  b.tun(isa::UnOp::kExp, t.scores, t.scores);
  b.tred(isa::RedOp::kSum, t.tile_sum, t.scores);
  b.tbin(BinOp::kMul, t.sum, t.sum, t.rescale);
  b.tbin(BinOp::kAdd, t.sum, t.sum, t.tile_sum);
  b.tbin(BinOp::kMul, t.out, t.out, t.rescale, isa::kBcastCol);
}

}  // namespace npurt::ops
