// Choosing tokens from logits: the counter-based generator, the masks and penalties
// against a plain reference, sampled frequencies against the softmax, and generate()'s
// stop tokens and stop strings over a scripted model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "models/synthetic_vocab.h"
#include "npurt/models/sampler.h"
#include "npurt/models/token_model.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {
namespace {

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> l(n);
  for (float& v : l) v = d(rng);
  return l;
}

// Random Philox words would pass any test of their own making: the published vectors
// (Random123's kat_vectors) pin the algorithm.
TEST(Philox, MatchesTheKnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}), (W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  for (uint64_t pos : {0ull, 1ull, 1ull << 40}) {
    const double u = uniform_at(7, pos);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, uniform_at(7, pos));
    EXPECT_NE(u, uniform_at(8, pos));
  }
}

TEST(Sampling, BadParametersAreNamed) {
  const std::vector<std::pair<SamplingParams, std::string>> bad = {
      {{.temperature = -0.5f}, "temperature"},
      {{.temperature = NAN}, "temperature"},
      {{.top_k = -1}, "top_k"},
      {{.top_p = 0.0f}, "top_p"},
      {{.top_p = 1.5f}, "top_p"},
      {{.min_p = -0.1f}, "min_p"},
      {{.min_p = 2.0f}, "min_p"},
      {{.repetition_penalty = 0.0f}, "repetition_penalty"},
      {{.presence_penalty = INFINITY}, "presence_penalty"},
      {{.frequency_penalty = NAN}, "frequency_penalty"},
      {{.top_logprobs = 21}, "top_logprobs"},
  };
  const std::vector<float> logits = random_logits(50, 1);
  for (const auto& [p, name] : bad) {
    const Status s = check_sampling(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(s.message().find(name), std::string::npos) << s.to_string();
    EXPECT_EQ(choose_token(logits, p, {}, 0).status().code(), StatusCode::kInvalidArgument) << name;
  }
  EXPECT_TRUE(check_sampling({}).ok());
  std::vector<float> nan = logits;
  nan[17] = NAN;
  const Status s = choose_token(nan, {.temperature = 1.0f}, {}, 0).status();
  EXPECT_NE(s.message().find("token 17"), std::string::npos) << s.to_string();
  const std::vector<float> none(8, -INFINITY);
  EXPECT_EQ(choose_token(none, {.temperature = 1.0f}, {}, 0).status().code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> outside{3, 50};
  const Status c = choose_token(logits, {.repetition_penalty = 1.2f}, outside, 1).status();
  EXPECT_NE(c.message().find("token 50"), std::string::npos) << c.to_string();
}

TEST(Sampling, GreedyIsTheArgmaxOfThePenalizedLogits) {
  const std::vector<float> l{1.0f, 5.0f, 4.9f, 5.0f, -2.0f};
  EXPECT_EQ(choose_token(l, {}, {}, 0)->token, 1);  // ties: the lower id
  const std::vector<int32_t> ctx{1, 3};
  // 5 / 2 = 2.5 for both 1 and 3: 4.9 wins.
  EXPECT_EQ(choose_token(l, {.repetition_penalty = 2.0f}, ctx, 2)->token, 2);
  // Presence counts the output only: in the prompt, 1 and 3 keep 5.
  EXPECT_EQ(choose_token(l, {.presence_penalty = 0.2f}, ctx, 2)->token, 1);
  EXPECT_EQ(choose_token(l, {.presence_penalty = 0.2f}, ctx, 0)->token, 2);
  // Frequency: 1 twice in the output (4.88), 3 once (4.94), 2 not at all (4.9).
  const std::vector<int32_t> twice{1, 1, 3};
  EXPECT_EQ(choose_token(l, {.frequency_penalty = 0.06f}, twice, 0)->token, 3);
}

// The reference: every id sorted, the masks applied one after the other in double.
std::vector<Candidate> reference_candidates(std::vector<float> z, const SamplingParams& p,
                                            const std::vector<int32_t>& ctx, size_t prompt_len) {
  if (p.repetition_penalty != 1.0f) {
    std::vector<bool> seen(z.size());
    for (int32_t t : ctx) seen[t] = true;
    for (size_t i = 0; i < z.size(); ++i) {
      if (seen[i]) z[i] = z[i] > 0 ? z[i] / p.repetition_penalty : z[i] * p.repetition_penalty;
    }
  }
  std::vector<int> count(z.size());
  for (size_t i = prompt_len; i < ctx.size(); ++i) ++count[ctx[i]];
  for (size_t i = 0; i < z.size(); ++i) {
    if (count[i] > 0) z[i] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(count[i]);
  }
  std::vector<int32_t> ids(z.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  const double zmax = z[ids[0]];
  std::vector<Candidate> c;
  for (int32_t i : ids) c.push_back({i, std::exp((static_cast<double>(z[i]) - zmax) / p.temperature)});
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    double norm = 0, cum = 0;
    for (const Candidate& x : c) norm += x.prob;
    size_t n = 0;
    while (n < c.size() && cum < static_cast<double>(p.top_p) * norm) cum += c[n++].prob;
    c.resize(n);
  }
  if (p.min_p > 0.0f) {
    size_t n = 0;  // weights relative to the best: p_i / p_max
    while (n < c.size() && c[n].prob >= static_cast<double>(p.min_p)) ++n;
    c.resize(n);
  }
  double total = 0;
  for (const Candidate& x : c) total += x.prob;
  for (Candidate& x : c) x.prob /= total;
  return c;
}

// Exact masks: the same ids in the same order, and the same probabilities, for each
// mask alone and together, with ties among the logits, and the penalties applied.
TEST(Sampling, MasksAndPenaltiesKeepWhatTheReferenceKeeps) {
  std::vector<float> l = random_logits(5000, 2);
  for (size_t i = 0; i < 200; ++i) l[i + 1000] = l[i];  // ties
  std::vector<int32_t> ctx;
  std::mt19937 rng(3);
  for (int i = 0; i < 60; ++i) ctx.push_back(static_cast<int32_t>(rng() % 5000));
  const std::vector<SamplingParams> cases = {
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 40},
      {.temperature = 1.3f, .top_p = 0.9f},
      {.temperature = 1.0f, .top_p = 0.999f},  // past the first sorted prefix
      {.temperature = 0.8f, .min_p = 0.05f},
      {.temperature = 1.0f, .top_k = 300, .top_p = 0.8f, .min_p = 0.01f},
      {.temperature = 0.9f, .top_k = 1},
      {.temperature = 1.0f, .top_p = 0.5f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f, .frequency_penalty = 0.25f},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const StatusOr<std::vector<Candidate>> got = sampling_candidates(l, cases[k], ctx, 20);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    const std::vector<Candidate> want = reference_candidates(l, cases[k], ctx, 20);
    ASSERT_EQ(got->size(), want.size()) << "case " << k;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ((*got)[i].token, want[i].token) << "case " << k << ", rank " << i;
      // The sampler's exp is good to 2e-7 of a weight; the reference's is std::exp.
      ASSERT_NEAR((*got)[i].prob, want[i].prob, 1e-12 + 1e-6 * want[i].prob) << "case " << k << ", rank " << i;
    }
  }
}

// Pearson's statistic of `counts` against `probs` over n draws.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double x = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * n;
    x += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x;
}

std::vector<double> softmax(const std::vector<float>& l, double t) {
  std::vector<double> p(l.size());
  const double m = *std::max_element(l.begin(), l.end());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - m) / t);
  for (double& v : p) v /= s;
  return p;
}

// Draws at positions 0 .. n - 1 (a context of that length each) and counts them.
std::vector<int> draw(const std::vector<float>& l, const SamplingParams& p, int n) {
  std::vector<int32_t> ctx(static_cast<size_t>(n), 0);
  std::vector<int> counts(l.size());
  for (int i = 0; i < n; ++i) ++counts[choose_token(l, p, std::span(ctx).first(static_cast<size_t>(i)), 0)->token];
  return counts;
}

// 20000 draws over 10 tokens: the statistic stays under the 0.999 quantile of
// chi-square with 9 degrees of freedom (27.88) against the tempered softmax, and is
// far over it against the untempered one, so the check can tell the two apart.
TEST(Sampling, FrequenciesFollowTheSoftmax) {
  const std::vector<float> l{0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.3f, -0.2f, 1.5f, 0.8f, -2.0f};
  constexpr int kDraws = 20000;
  constexpr double kChi2Df9 = 27.88;
  const std::vector<int> counts = draw(l, {.temperature = 0.7f, .seed = 5}, kDraws);
  const double fit = chi_square(counts, softmax(l, 0.7), kDraws);
  const double wrong = chi_square(counts, softmax(l, 1.0), kDraws);
  std::printf("chi-square, 9 df: %.2f against the softmax at 0.7, %.1f against it at 1.0\n", fit, wrong);
  EXPECT_LT(fit, kChi2Df9);
  EXPECT_GT(wrong, 10 * kChi2Df9);
  // Top-k 3: only the three best, in the renormalized proportions (2 df: 13.82).
  const std::vector<int> top = draw(l, {.temperature = 1.0f, .top_k = 3, .seed = 6}, kDraws);
  std::vector<double> p3 = softmax(l, 1.0);
  const double keep = p3[4] + p3[7] + p3[2];
  std::vector<int> kept_counts;
  std::vector<double> kept_probs;
  for (int i : {4, 7, 2}) {
    kept_counts.push_back(top[static_cast<size_t>(i)]);
    kept_probs.push_back(p3[static_cast<size_t>(i)] / keep);
  }
  EXPECT_EQ(std::accumulate(kept_counts.begin(), kept_counts.end(), 0), kDraws);
  EXPECT_LT(chi_square(kept_counts, kept_probs, kDraws), 13.82);
}

TEST(Sampling, TheSameSeedAndPositionGiveTheSameToken) {
  const std::vector<float> l = random_logits(262144, 9, 1.0f);
  const SamplingParams p{.temperature = 1.0f, .top_p = 0.95f, .seed = 123, .top_logprobs = 5};
  std::vector<int32_t> ctx(40, 7);
  const TokenChoice a = *choose_token(l, p, ctx, 10);
  const TokenChoice b = *choose_token(l, p, ctx, 10);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.logprob, b.logprob);
  // Over 32 positions two seeds disagree somewhere (the distribution is nearly flat).
  int differ = 0;
  SamplingParams q = p;
  q.seed = 124;
  for (size_t n = 0; n < 32; ++n) {
    differ += choose_token(l, p, std::span(ctx).first(n % 40), 0)->token != choose_token(l, q, std::span(ctx).first(n % 40), 0)->token;
  }
  EXPECT_GT(differ, 0);
  // Log-probabilities of the model's distribution, most likely first.
  const std::vector<double> sm = softmax(l, 1.0);
  ASSERT_EQ(a.top.size(), 5u);
  EXPECT_NEAR(a.logprob, std::log(sm[static_cast<size_t>(a.token)]), 1e-4);
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_NEAR(a.top[i].logprob, std::log(sm[static_cast<size_t>(a.top[i].token)]), 1e-4);
    if (i > 0) {
      EXPECT_GE(a.top[i - 1].logprob, a.top[i].logprob);
    }
  }
  EXPECT_EQ(a.top[0].token, static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
}

// ---- generate() with stop tokens and stop strings ----------------------------------

// A model whose successor of every token is the next one of a script, with logits
// that peak there.
class ScriptedModel final : public TokenModel {
 public:
  ScriptedModel(std::vector<int32_t> script, size_t vocab) : script_(std::move(script)), vocab_(vocab) {}
  StatusOr<int32_t> step(int32_t) override { return script_[static_cast<size_t>(++pos_) % script_.size()]; }
  Status reset() override {
    pos_ = 0;
    return ok_status();
  }
  int32_t position() const override { return pos_; }
  StatusOr<std::vector<float>> logits() const override {
    std::vector<float> l(vocab_, 0.0f);
    l[static_cast<size_t>(script_[static_cast<size_t>(pos_) % script_.size()])] = 20.0f;
    return l;
  }

 private:
  std::vector<int32_t> script_;
  size_t vocab_;
  int32_t pos_ = 0;
};

struct StopRig {
  StopRig() {
    v.add_word_pieces();
    tok = std::make_unique<Tokenizer>(Tokenizer::from_vocab(v.tokens, v.scores, v.types, {}).value());
    for (const std::string w : {"the", "capital", "of", "France", "is"}) {
      words.push_back(static_cast<int32_t>(std::find(v.tokens.begin(), v.tokens.end(), kSpaceMarker + w) - v.tokens.begin()));
    }
  }
  SyntheticVocab v;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> words;  // " the", " capital", " of", " France", " is"
};

struct StopRun {
  std::vector<int32_t> tokens, seen;
  GenerateStats stats;
};

StopRun run_stops(StopRig& r, GenerateOptions o, int n = 5) {
  ScriptedModel m(r.words, r.v.tokens.size());
  StopRun out;
  StatusOr<std::vector<int32_t>> t =
      generate(m, {r.words[0]}, n, r.tok.get(), [&](int32_t x) { out.seen.push_back(x); }, &out.stats, o);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  if (t.ok()) out.tokens = *t;
  return out;
}

TEST(GenerateStops, StopStringsCutBeforeTheTokenTheyStartIn) {
  StopRig r;
  const std::vector<int32_t>& w = r.words;
  // The script continues " the" with " capital of France is the".
  const StopRun plain = run_stops(r, {});
  EXPECT_EQ(plain.tokens, (std::vector<int32_t>{w[1], w[2], w[3], w[4], w[0]}));
  EXPECT_EQ(plain.stats.finish_reason, FinishReason::kLength);
  // "of Fr" starts inside " of": " capital" is all that is left.
  const StopRun inside = run_stops(r, {.stop_strings = {"of Fr"}});
  EXPECT_EQ(inside.tokens, (std::vector<int32_t>{w[1]}));
  EXPECT_EQ(inside.seen, inside.tokens);
  EXPECT_EQ(inside.stats.finish_reason, FinishReason::kStopString);
  // Across tokens, and the earliest of two.
  const StopRun across = run_stops(r, {.stop_strings = {"is the", "tal of"}});
  EXPECT_EQ(across.tokens, std::vector<int32_t>{});
  EXPECT_EQ(across.seen, std::vector<int32_t>{});
  // Never matched: every token, each handed out.
  const StopRun never = run_stops(r, {.stop_strings = {"Paris"}});
  EXPECT_EQ(never.tokens, plain.tokens);
  EXPECT_EQ(never.seen, plain.tokens);
  EXPECT_EQ(never.stats.finish_reason, FinishReason::kLength);
  // A stop token ends decoding and is not returned.
  const StopRun token = run_stops(r, {.stop_tokens = {w[3]}});
  EXPECT_EQ(token.tokens, (std::vector<int32_t>{w[1], w[2]}));
  EXPECT_EQ(token.stats.finish_reason, FinishReason::kStopToken);
  // The sampled path (reading the logits) agrees, with log-probabilities per token.
  const StopRun sampled = run_stops(r, {.sampling = {.temperature = 0.5f, .seed = 1, .top_logprobs = 2}});
  EXPECT_EQ(sampled.tokens, plain.tokens);
  ASSERT_EQ(sampled.stats.choices.size(), plain.tokens.size());
  EXPECT_GT(sampled.stats.choices[0].logprob, -1e-3f);
  EXPECT_EQ(sampled.stats.choices[0].top.size(), 2u);
}

TEST(GenerateStops, BadOptionsAreNamed) {
  StopRig r;
  ScriptedModel m(r.words, r.v.tokens.size());
  const auto fails = [&](GenerateOptions o, const Tokenizer* t, const std::string& what) {
    const Status s = generate(m, {r.words[0]}, 4, t, {}, nullptr, o).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.to_string();
  };
  fails({.sampling = {.temperature = -1.0f}}, r.tok.get(), "temperature");
  fails({.stop_strings = {""}}, r.tok.get(), "stop string is empty");
  fails({.stop_strings = {"x"}}, nullptr, "need the tokenizer");
  // A model without logits cannot sample.
  class Plain final : public TokenModel {
   public:
    StatusOr<int32_t> step(int32_t t) override { return t; }
    Status reset() override { return ok_status(); }
    int32_t position() const override { return 0; }
  } plain;
  EXPECT_EQ(generate(plain, {1}, 2, nullptr, {}, nullptr, {.sampling = {.temperature = 1.0f}}).status().code(),
            StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace npurt::models
