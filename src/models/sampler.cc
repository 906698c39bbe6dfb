#include "npurt/models/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace npurt::models {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

std::string num(double v) { return std::to_string(v); }

// Most likely first; equal logits: the lower id first.
struct MoreLikely {
  std::span<const float> z;
  bool operator()(int32_t a, int32_t b) const { return z[a] > z[b] || (z[a] == z[b] && a < b); }
};

// Cloned for AVX2 (twice the lanes; the same operations, so the same bits), except
// under ThreadSanitizer, whose runtime is not up yet when the clones' resolver runs.
#if defined(__SANITIZE_THREAD__)
#define NPURT_AVX2_CLONE
#else
#define NPURT_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#endif

// Whether any of v is NaN: the largest magnitude's bits, an integer max the compiler
// vectorizes (the caller finds which one only then).
NPURT_AVX2_CLONE bool has_nan(std::span<const float> v) {
  uint32_t m = 0;
  for (float x : v) m = std::max(m, std::bit_cast<uint32_t>(x) & 0x7fffffffu);
  return m > 0x7f800000u;
}

// Larger floats give larger keys (NaN excluded; -0 below +0).
inline uint32_t float_key(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// The largest of v (no NaN in v), by an integer max over the keys (a float max does
// not vectorize without giving up NaN and signed-zero rules).
NPURT_AVX2_CLONE float largest(std::span<const float> v) {
  uint32_t m = 0;
  for (float x : v) m = std::max(m, float_key(x));
  return std::bit_cast<float>((m & 0x80000000u) != 0 ? m & 0x7fffffffu : ~m);
}

// The logits after the penalties (a copy only when one applies); an error for a NaN
// logit or a context token outside the vocabulary.
StatusOr<std::vector<float>> penalized(std::span<const float> logits, const SamplingParams& p,
                                       std::span<const int32_t> context, size_t prompt_len) {
  if (logits.empty()) return invalid_argument("sampling: no logits");
  if (has_nan(logits)) {
    const auto bad = std::find_if(logits.begin(), logits.end(), [](float v) { return std::isnan(v); });
    return invalid_argument("sampling: the logit of token " + std::to_string(bad - logits.begin()) + " is NaN");
  }
  std::vector<float> z(logits.begin(), logits.end());
  const bool repetition = p.repetition_penalty != 1.0f, counts = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (!repetition && !counts) return z;
  for (int32_t t : context) {
    if (t < 0 || static_cast<size_t>(t) >= z.size()) {
      return invalid_argument("sampling: context token " + std::to_string(t) + " is outside the vocabulary of " +
                              std::to_string(z.size()));
    }
  }
  if (repetition) {
    std::vector<int32_t> seen(context.begin(), context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) z[t] = z[t] > 0.0f ? z[t] / p.repetition_penalty : z[t] * p.repetition_penalty;
  }
  if (counts) {
    std::vector<int32_t> out(context.begin() + static_cast<std::ptrdiff_t>(std::min(prompt_len, context.size())),
                             context.end());
    std::sort(out.begin(), out.end());
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      z[out[i]] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(j - i);
      i = j;
    }
  }
  return z;
}

// The lowest id of the largest of z (no NaN in z): the largest first, in a pass the
// compiler vectorizes, then the first id that equals it (-0 equals +0, as in a scan
// that keeps the first of equal values).
int32_t argmax(std::span<const float> z) {
  const float m = largest(z);
  return static_cast<int32_t>(std::find(z.begin(), z.end(), m) - z.begin());
}

// e^x for x <= 0, as 2^n e^r with |r| <= ln2 / 2 and a degree-6 Taylor polynomial for
// e^r (relative error under 2e-7); 0 below -87 (where 2^n stops being normal). Plain
// float arithmetic without contraction, so the compiler vectorizes the loops that call
// it and every x86-64 host gets the same bits.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f, kRound = 12582912.0f;
  const float c = std::max(x, -87.0f);
  const float n = (c * kLog2e + kRound) - kRound;  // round to nearest
  const float r = (c - n * kLn2Hi) - n * kLn2Lo;
  const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float live = static_cast<float>(x >= -87.0f);  // branch-free, so it vectorizes
  return p * scale * live;
}

// The sum of v in double, over 8 interleaved partial sums (a fixed order that the
// compiler can vectorize).
double sum_of(std::span<const float> v) {
  std::array<double, 8> acc{};
  const size_t body = v.size() / 8 * 8;
  for (size_t i = 0; i < body; i += 8) {
    for (size_t j = 0; j < 8; ++j) acc[j] += v[i + j];
  }
  for (size_t i = body; i < v.size(); ++i) acc[i - body] += v[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// sum_of of w with every id but `ids` (ascending) set to 0, in the same bits: each id
// adds to the partial sum of its lane (id mod 8) in id order, and the zeros the full
// pass would add change no sum.
double sum_at(std::span<const float> w, std::span<const int32_t> ids) {
  std::array<double, 8> acc{};
  for (int32_t i : ids) acc[static_cast<size_t>(i) % 8] += w[static_cast<size_t>(i)];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// The id where the running sum of the positive weights, in id order, first passes
// `target`: over every id (`all`), or over `ids` (ascending) only. Rounding may leave
// the target just past the last sum: then the last positive weight's id.
int32_t walk_to(double target, std::span<const float> w, bool all, std::span<const int32_t> ids) {
  int32_t token = 0;
  double cum = 0.0;
  const size_t n = all ? w.size() : ids.size();
  for (size_t j = 0; j < n; ++j) {
    const size_t i = all ? j : static_cast<size_t>(ids[j]);
    if (w[i] == 0.0f) continue;
    token = static_cast<int32_t>(i);
    cum += w[i];
    if (cum > target) break;
  }
  return token;
}

// The weight of logit v relative to the largest, zmax, at temperature 1 / inv: one
// expression for the pass over every id and for single ids, so both give its bits.
inline float relative_weight(float v, float zmax, float inv) { return exp_nonpositive((v - zmax) * inv); }

// Weights relative to the largest of z, exp((z - zmax) / t), one per id.
NPURT_AVX2_CLONE std::vector<float> relative_weights(std::span<const float> z, float zmax, float t) {
  std::vector<float> w(z.size());
  const float inv = 1.0f / t;
  for (size_t i = 0; i < z.size(); ++i) w[i] = relative_weight(z[i], zmax, inv);
  return w;
}

// The largest of the (penalized) logits, which the weights are relative to.
StatusOr<float> finite_largest(std::span<const float> z) {
  const float zmax = z[argmax(z)];
  if (!std::isfinite(zmax)) return invalid_argument("sampling: no token has a finite logit (largest: " + num(zmax) + ")");
  return zmax;
}

// Below this many ids a selection sorts them and walks.
constexpr size_t kSortedWalk = 64;

// Larger logits give larger keys (NaN excluded); -0 and +0 share one, as they compare
// equal (their order is the ids').
uint32_t order_key(float v) { return float_key(v == 0.0f ? 0.0f : v); }

// The fewest most likely of `ids` whose measure (measure(id) each: 1 for a count,
// the weight for a mass) reaches `need`, in no particular order. A radix selection
// on the logits' keys, 11 bits a level: a few sequential passes over the ids, so a
// flat distribution costs no more than a peaked one.
template <typename Measure>
std::vector<int32_t> select_top(std::vector<int32_t> ids, std::span<const float> z, const Measure& measure, double need) {
  std::vector<int32_t> kept, next;
  for (int shift = 21; ids.size() > kSortedWalk && shift >= 0; shift -= 11) {
    const uint32_t mask = shift > 0 ? 2047u : 1023u;
    const auto digit = [&](int32_t i) { return (order_key(z[i]) >> shift) & mask; };
    // Four interleaved tables, summed in a fixed order after: consecutive ids that
    // fall in one bucket (most of them, at the first level) no longer wait on each
    // other's additions.
    // (A count's measure is an integer: its tables count exactly in integers.)
    using Part = decltype(measure(0));
    std::vector<Part> part(4 * 2048, Part{0});
    for (size_t j = 0; j < ids.size(); ++j) part[(j & 3) * 2048 + digit(ids[j])] += measure(ids[j]);
    std::array<double, 2048> hist{};
    for (size_t d = 0; d < hist.size(); ++d) {
      hist[d] = static_cast<double>((part[d] + part[2048 + d]) + (part[4096 + d] + part[6144 + d]));
    }
    int64_t b = mask;
    double cum = 0.0;
    for (; b >= 0 && cum + hist[b] < need; --b) cum += hist[b];
    if (b < 0) {  // all of them do not reach it (rounding): keep all
      kept.insert(kept.end(), ids.begin(), ids.end());
      return kept;
    }
    next.clear();
    for (int32_t i : ids) {
      const int64_t d = digit(i);
      if (d > b) kept.push_back(i);
      if (d == b) next.push_back(i);
    }
    need -= cum;
    ids.swap(next);
  }
  std::sort(ids.begin(), ids.end(), MoreLikely{z});
  double cum = 0.0;
  for (size_t j = 0; j < ids.size() && cum < need; ++j) {
    cum += measure(ids[j]);
    kept.push_back(ids[j]);
  }
  return kept;
}

// The ids top-p can keep, when every id is a candidate and `spare` is the mass the
// nucleus may leave out, (1 - p) times the total: those weighing at least spare / (2
// vocab), for the lighter ones weigh less than spare / 2 together, so the most likely
// ids reach p of the mass before any of them. Most of a peaked distribution's ids
// are lighter: the selection then sorts out a few thousand ids, not every one.
std::vector<int32_t> likely_enough(std::span<const float> w, double spare) {
  const auto floor = static_cast<float>(spare / (2.0 * static_cast<double>(w.size())));
  std::vector<int32_t> ids;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] >= floor) ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

bool masks(const SamplingParams& p, size_t vocab) {
  return (p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// Up to this many, top-k keeps the ids of one pass that inserts into a short list.
constexpr size_t kShortTopK = 256;

std::vector<int32_t> most_likely(std::span<const float> z, size_t n);

// The ids the masks keep, in no particular order: top-k, then top-p over what top-k
// kept (renormalized), then min-p. Each keeps a most-likely prefix, so the result is
// one too. Sets w to the weights relative to zmax: of every id, or, after a short
// top-k, of the ids it keeps only (the others 0), as nothing else reads them.
std::vector<int32_t> kept_ids(std::span<const float> z, const SamplingParams& p, float zmax, std::vector<float>& w) {
  std::vector<int32_t> ids;
  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < z.size();
  if (top_k && static_cast<size_t>(p.top_k) <= kShortTopK) {
    ids = most_likely(z, static_cast<size_t>(p.top_k));
    w.assign(z.size(), 0.0f);
    const float inv = 1.0f / p.temperature;
    for (int32_t i : ids) w[i] = relative_weight(z[i], zmax, inv);
  } else {
    w = relative_weights(z, zmax, p.temperature);
    ids.resize(z.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    if (top_k) ids = select_top(std::move(ids), z, [](int32_t) { return uint32_t{1}; }, p.top_k);
  }
  if (p.top_p < 1.0f) {
    double norm = 0.0;
    if (ids.size() == w.size()) {
      norm = sum_of(w);
      ids = likely_enough(w, (1.0 - static_cast<double>(p.top_p)) * norm);
    } else {
      for (int32_t i : ids) norm += w[i];
    }
    ids = select_top(std::move(ids), z, [&](int32_t i) { return static_cast<double>(w[i]); }, static_cast<double>(p.top_p) * norm);
  }
  if (p.min_p > 0.0f) {
    // p_i >= min_p * p_max, as w_i >= min_p: w is p / p_max.
    const double floor = p.min_p;
    std::erase_if(ids, [&](int32_t i) { return w[i] < floor; });
  }
  return ids;
}

// The n most likely ids, most likely first (n small: an insertion into a short list).
std::vector<int32_t> most_likely(std::span<const float> z, size_t n) {
  const MoreLikely order{z};
  std::vector<int32_t> best;
  best.reserve(n + 1);
  for (size_t i = 0; i < z.size() && n > 0; ++i) {
    const auto id = static_cast<int32_t>(i);
    if (best.size() == n && !order(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, order), id);
    if (best.size() > n) best.pop_back();
  }
  return best;
}

// The model's log-probabilities of the chosen token and of its top_logprobs most
// likely tokens.
void add_logprobs(std::span<const float> logits, const SamplingParams& p, TokenChoice& c) {
  if (!p.wants_logprobs()) return;
  const float lmax = logits[argmax(logits)];
  const double lse = lmax + std::log(sum_of(relative_weights(logits, lmax, 1.0f)));
  const auto logprob = [&](int32_t t) { return static_cast<float>(static_cast<double>(logits[t]) - lse); };
  c.logprob = logprob(c.token);
  for (int32_t t : most_likely(logits, static_cast<size_t>(p.top_logprobs))) c.top.push_back({t, logprob(t)});
}

}  // namespace

Status check_sampling(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return invalid_argument("sampling: temperature " + num(p.temperature) + " must be a finite value >= 0");
  }
  if (p.top_k < 0) return invalid_argument("sampling: top_k " + std::to_string(p.top_k) + " is negative (0: off)");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return invalid_argument("sampling: top_p " + num(p.top_p) + " is outside (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return invalid_argument("sampling: min_p " + num(p.min_p) + " is outside [0, 1]");
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return invalid_argument("sampling: repetition_penalty " + num(p.repetition_penalty) + " must be finite and > 0 (1: off)");
  }
  if (!std::isfinite(p.presence_penalty)) return invalid_argument("sampling: presence_penalty is not finite");
  if (!std::isfinite(p.frequency_penalty)) return invalid_argument("sampling: frequency_penalty is not finite");
  if (p.top_logprobs < 0 || p.top_logprobs > SamplingParams::kMaxTopLogprobs) {
    return invalid_argument("sampling: top_logprobs " + std::to_string(p.top_logprobs) + " is outside 0 .. " +
                            std::to_string(SamplingParams::kMaxTopLogprobs));
  }
  return ok_status();
}

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kPhiloxM0} * c[0], p1 = uint64_t{kPhiloxM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ key[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kPhiloxW0;
    key[1] += kPhiloxW1;
  }
  return c;
}

double uniform_at(uint64_t seed, uint64_t position) {
  const auto r = philox4x32_10({static_cast<uint32_t>(position), static_cast<uint32_t>(position >> 32), 0, 0},
                               {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = (uint64_t{r[0]} << 21) | (r[1] >> 11);  // 53 bits
  return std::ldexp(static_cast<double>(bits), -53);
}

StatusOr<std::vector<Candidate>> sampling_candidates(std::span<const float> logits, const SamplingParams& params,
                                                     std::span<const int32_t> context, size_t prompt_len) {
  NPURT_RETURN_IF_ERROR(check_sampling(params));
  if (params.temperature == 0.0f) return invalid_argument("sampling: candidates need a temperature > 0");
  NPURT_ASSIGN_OR_RETURN(const std::vector<float> z, penalized(logits, params, context, prompt_len));
  NPURT_ASSIGN_OR_RETURN(const float zmax, finite_largest(z));
  std::vector<float> w;
  std::vector<int32_t> ids = kept_ids(z, params, zmax, w);
  std::sort(ids.begin(), ids.end(), MoreLikely{z});
  std::vector<Candidate> out;
  double total = 0.0;
  for (int32_t i : ids) total += w[i];
  for (int32_t i : ids) out.push_back({i, w[i] / total});
  return out;
}

StatusOr<TokenChoice> choose_token(std::span<const float> logits, const SamplingParams& params,
                                   std::span<const int32_t> context, size_t prompt_len) {
  NPURT_RETURN_IF_ERROR(check_sampling(params));
  NPURT_ASSIGN_OR_RETURN(const std::vector<float> z, penalized(logits, params, context, prompt_len));
  TokenChoice c;
  if (params.temperature == 0.0f) {
    c.token = argmax(z);
    add_logprobs(logits, params, c);
    return c;
  }
  NPURT_ASSIGN_OR_RETURN(const float zmax, finite_largest(z));
  // The kept ids (every id when nothing is masked) walked in id order to where their
  // weights pass u times their sum; the others weigh nothing.
  const double u = uniform_at(params.seed, context.size());
  if (masks(params, z.size())) {
    std::vector<float> w;
    std::vector<int32_t> ids = kept_ids(z, params, zmax, w);
    if (ids.size() > z.size() / 16) {  // many (a flat distribution): zeros beat sorting them
      std::vector<float> kept(w.size(), 0.0f);
      for (int32_t i : ids) kept[i] = w[i];
      c.token = walk_to(u * sum_of(kept), kept, true, {});
    } else {
      std::sort(ids.begin(), ids.end());
      c.token = walk_to(u * sum_at(w, ids), w, false, ids);
    }
  } else {
    const std::vector<float> w = relative_weights(z, zmax, params.temperature);
    c.token = walk_to(u * sum_of(w), w, true, {});
  }
  add_logprobs(logits, params, c);
  return c;
}

}  // namespace npurt::models
