// Speculative greedy decoding: the verify step gives every token the decode step's
// bits, and generation that verifies drafts yields exactly the plain greedy tokens,
// whatever the drafts (prompt lookup, always wrong, always right, right then wrong).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "models/gemma3_rig.h"
#include "models/real_model.h"
#include "npurt/models/draft.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/sampler.h"
#include "npurt/models/token_model.h"

namespace npurt::models {
namespace {

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return p;
}

// Every position's logits of a token-by-token run of `tokens`.
std::vector<std::vector<float>> step_logits(Gemma3Model& m, const std::vector<int32_t>& tokens) {
  std::vector<std::vector<float>> out;
  EXPECT_TRUE(m.reset().ok());
  for (int32_t t : tokens) {
    EXPECT_TRUE(m.step(t).ok());
    out.push_back(m.logits().value());
  }
  return out;
}

// verify(tokens[p .. p + n)) after steps over tokens[0 .. p): positions whose logits
// or greedy token differ in any bit from the token-by-token run's.
int verify_mismatches(Gemma3Model& m, const std::vector<int32_t>& tokens,
                      const std::vector<std::vector<float>>& want, size_t p, size_t n) {
  EXPECT_TRUE(m.reset().ok());
  for (size_t i = 0; i < p; ++i) EXPECT_TRUE(m.step(tokens[i]).ok());
  const StatusOr<std::vector<int32_t>> greedy = m.verify(std::span(tokens).subspan(p, n));
  EXPECT_TRUE(greedy.ok()) << greedy.status().to_string();
  if (!greedy.ok()) return static_cast<int>(n);
  EXPECT_EQ(m.position(), static_cast<int32_t>(p + n));
  const std::vector<float> logits = m.verify_logits().value();
  const size_t vocab = want[0].size();
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<float>& w = want[p + i];
    const int32_t argmax = static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
    bad += std::memcmp(logits.data() + i * vocab, w.data(), vocab * sizeof(float)) != 0 || (*greedy)[i] != argmax;
  }
  return bad;
}

// With either cache type (the f16 cache rounds each key and value once, on append).
TEST(VerifyStep, EveryTokenGetsTheDecodeStepsBits) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  for (const isa::DType kv : {isa::DType::kF32, isa::DType::kF16}) {
  SCOPED_TRACE(std::string(isa::dtype_name(kv)) + " cache");
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .prefill_chunk = 8, .kv_cache = kv}));
  ASSERT_EQ(rig.model->max_verify_tokens(), 16u);
  const std::vector<int32_t> tokens = random_tokens(40, 300, 4);
  const std::vector<std::vector<float>> want = step_logits(*rig.model, tokens);
  // Every batch size, from the start and past the window of 8 (local layer) and in
  // the middle of the run.
  for (size_t n = 1; n <= 16; ++n) {
    for (size_t at : {size_t{0}, size_t{13}, 24 - n / 2}) {
      EXPECT_EQ(verify_mismatches(*rig.model, tokens, want, at, n), 0) << n << " tokens at position " << at;
    }
  }
  }
}

// Drafts that know the plain continuation (`truth`, after `prompt`).
struct Oracle {
  std::vector<int32_t> prompt, truth;
  int32_t vocab = 300;
  // The true tokens after `context`, as many as asked and known.
  std::vector<int32_t> right(std::span<const int32_t> context, int n) const {
    const size_t done = context.size() - prompt.size();
    const size_t to = std::min(truth.size(), done + static_cast<size_t>(n));
    return done < to ? std::vector<int32_t>(truth.begin() + done, truth.begin() + to) : std::vector<int32_t>{};
  }
  int32_t wrong(int32_t t) const { return (t + 1) % vocab; }
};

enum class Drafts { kLookup, kAlwaysWrong, kAlwaysRight, kRightThenWrong };

const char* drafts_name(Drafts d) {
  switch (d) {
    case Drafts::kLookup: return "prompt lookup";
    case Drafts::kAlwaysWrong: return "always wrong";
    case Drafts::kAlwaysRight: return "always right";
    case Drafts::kRightThenWrong: return "right then wrong";
  }
  return "?";
}

Drafter make_drafter(Drafts kind, const Oracle& o) {
  switch (kind) {
    case Drafts::kLookup: return {};
    case Drafts::kAlwaysWrong:
      return [o](std::span<const int32_t> c, int n) {
        std::vector<int32_t> d = o.right(c, n);
        for (int32_t& t : d) t = o.wrong(t);
        return d;
      };
    case Drafts::kAlwaysRight: return [o](std::span<const int32_t> c, int n) { return o.right(c, n); };
    case Drafts::kRightThenWrong:
      // Right for the first r tokens, then wrong, r = 0, 1, .. n - 1 in turn.
      return [o, calls = std::make_shared<int>(0)](std::span<const int32_t> c, int n) {
        std::vector<int32_t> d = o.right(c, n);
        const size_t r = static_cast<size_t>((*calls)++ % n);
        if (r < d.size()) d[r] = o.wrong(d[r]);
        return d;
      };
  }
  return {};
}

struct Generated {
  std::vector<int32_t> tokens;
  GenerateStats stats;
};

Generated run(TokenModel& m, const std::vector<int32_t>& prompt, int n, GenerateOptions o = {}) {
  Generated r;
  StatusOr<std::vector<int32_t>> out = generate(m, prompt, n, nullptr, {}, &r.stats, o);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (out.ok()) r.tokens = *out;
  return r;
}

// Plain greedy decoding against speculation with each kind of drafts and several
// draft lengths, on a prompt that repeats and on one that does not.
void expect_speculation_exact(Gemma3Model& m, const std::vector<int32_t>& prompt, int32_t vocab, int new_tokens,
                              const std::vector<int>& lengths) {
  const Generated plain = run(m, prompt, new_tokens);
  ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(new_tokens));
  const Oracle o{prompt, plain.tokens, vocab};
  for (Drafts kind : {Drafts::kLookup, Drafts::kAlwaysWrong, Drafts::kAlwaysRight, Drafts::kRightThenWrong}) {
    for (int n : lengths) {
      const Generated s = run(m, prompt, new_tokens, {.speculate = n, .drafter = make_drafter(kind, o)});
      EXPECT_EQ(s.tokens, plain.tokens) << drafts_name(kind) << ", " << n << " drafts";
      const GenerateStats& st = s.stats;
      if (kind == Drafts::kAlwaysWrong) {
        EXPECT_EQ(st.accepted_tokens, 0);
        EXPECT_GT(st.verify_steps, 0);
      }
      if (kind == Drafts::kAlwaysRight) {
        EXPECT_EQ(st.accepted_tokens, st.drafted_tokens);
        if (n > 1) {
          EXPECT_GT(st.tokens_per_pass(), 2.0) << n << " drafts";
        }
      }
      if (kind == Drafts::kRightThenWrong && n > 1) {  // one draft: always wrong
        EXPECT_GT(st.accepted_tokens, 0);
        EXPECT_LT(st.accepted_tokens, st.drafted_tokens);
      }
      EXPECT_EQ(st.generated_tokens, new_tokens);
      std::printf("%-16s %2d drafts: %3d plain + %3d verify steps, %3d of %3d drafts accepted, %.2f tokens/pass\n",
                  drafts_name(kind), n, st.decode_steps, st.verify_steps, st.accepted_tokens, st.drafted_tokens,
                  st.tokens_per_pass());
    }
  }
}

// The same four tokens `times` times: prompt lookup finds its drafts in it.
std::vector<int32_t> repeating_prompt(int times) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < times; ++i) prompt.insert(prompt.end(), {11, 42, 7, 199});
  return prompt;
}

TEST(Speculation, SyntheticTokensAreExactlyPlainGreedy) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .prefill_chunk = 8}));
  for (const std::vector<int32_t>& prompt : {repeating_prompt(6), random_tokens(19, 300, 8)}) {
    expect_speculation_exact(*rig.model, prompt, 300, 64, {1, 4, 15});
  }
}

// Sampling with a seed: each verified token's choice is the one a plain step makes
// (same logits, context and position), so drafts that are always right, always wrong
// or found by prompt lookup leave the text and every log-probability as they are;
// another seed gives another text.
TEST(Speculation, SeededSamplingGivesThePlainSampledText) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .prefill_chunk = 8}));
  const std::vector<int32_t> prompt = repeating_prompt(4);
  const SamplingParams sampling{.temperature = 0.9f, .top_p = 0.97f, .repetition_penalty = 1.05f, .seed = 11, .top_logprobs = 2};
  const Generated plain = run(*rig.model, prompt, 40, {.sampling = sampling});
  ASSERT_EQ(plain.stats.choices.size(), 40u);
  const Oracle o{prompt, plain.tokens};
  for (Drafts kind : {Drafts::kLookup, Drafts::kAlwaysWrong, Drafts::kAlwaysRight}) {
    const Generated s = run(*rig.model, prompt, 40, {.speculate = 7, .drafter = make_drafter(kind, o), .sampling = sampling});
    EXPECT_EQ(s.tokens, plain.tokens) << drafts_name(kind);
    ASSERT_EQ(s.stats.choices.size(), plain.stats.choices.size());
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      EXPECT_EQ(s.stats.choices[i].logprob, plain.stats.choices[i].logprob) << drafts_name(kind) << ", token " << i;
    }
    EXPECT_GT(s.stats.verify_steps, 0) << drafts_name(kind);
    if (kind == Drafts::kAlwaysRight) {
      EXPECT_EQ(s.stats.accepted_tokens, s.stats.drafted_tokens);
    }
  }
  SamplingParams other = sampling;
  other.seed = 12;
  EXPECT_NE(run(*rig.model, prompt, 40, {.sampling = other}).tokens, plain.tokens);
}

TEST(Speculation, BadInputIsRejectedAndTheModelStaysUsable) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 24, .prefill_chunk = 8, .verify_tokens = 8}));
  Gemma3Model& m = *rig.model;
  const std::vector<int32_t> prompt = random_tokens(10, 300, 3);
  // Above the compiled verify step.
  const StatusOr<std::vector<int32_t>> big = generate(m, prompt, 5, nullptr, {}, nullptr, {.speculate = 8, .drafter = {}});
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("at most 8"), std::string::npos) << big.status().to_string();
  EXPECT_EQ(m.verify(random_tokens(9, 300, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.verify(std::vector<int32_t>{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.verify(std::vector<int32_t>{5, 300}).status().code(), StatusCode::kInvalidArgument);
  // Past the KV cache: 20 positions filled, 5 more do not fit 24.
  ASSERT_TRUE(m.prefill(random_tokens(20, 300, 2)).ok());
  const StatusOr<std::vector<int32_t>> past = m.verify(random_tokens(5, 300, 4));
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("24 positions"), std::string::npos) << past.status().to_string();
  EXPECT_EQ(m.position(), 20);
  EXPECT_EQ(m.rewind(21).code(), StatusCode::kInvalidArgument);
  // Still usable: four fit exactly, then a rewind and a step.
  EXPECT_TRUE(m.verify(random_tokens(4, 300, 5)).ok());
  EXPECT_EQ(m.position(), 24);
  ASSERT_OK(m.rewind(22));
  EXPECT_TRUE(m.step(3).ok());
  // Generation near the capacity drafts only what fits, and ends where plain decoding
  // does (the context is full after 24 positions).
  const Generated plain = run(m, prompt, 14);
  const Generated spec = run(m, prompt, 14, {.speculate = 7, .drafter = make_drafter(Drafts::kAlwaysRight, Oracle{prompt, plain.tokens})});
  EXPECT_EQ(spec.tokens, plain.tokens);
  const StatusOr<std::vector<int32_t>> full = generate(m, prompt, 16, nullptr, {}, nullptr, {.speculate = 7, .drafter = {}});
  EXPECT_EQ(full.status().code(), StatusCode::kOutOfRange) << full.status().to_string();
}

// Default options never fail where plain decoding works: a context shorter than the
// verify step (as `npurt generate` sizes it, prompt + max tokens, or a small
// max_context) only shortens the drafts. Counts of new tokens up to past the verify
// step, against the plain tokens.
TEST(Speculation, DefaultOptionsWorkWhenTheContextIsShorterThanTheVerifyStep) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  const GenerateOptions defaults{.speculate = GenerateOptions::kDefaultSpeculate, .drafter = {}};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 3; ++i) prompt.insert(prompt.end(), {11, 42});  // repeats: lookup drafts
  for (uint32_t verify : {uint32_t{GenerateOptions::kDefaultSpeculate + 1}, Gemma3Options::kDefaultVerifyTokens}) {
    for (int n : {1, 2, 5, 9}) {
      Rig rig;
      const uint32_t context = static_cast<uint32_t>(prompt.size() + n);
      ASSERT_OK(rig.load(p.file, {.max_context = context, .prefill_chunk = 8, .verify_tokens = verify}));
      ASSERT_EQ(rig.model->max_verify_tokens(), std::min(verify, context));  // cut by the context but for 9 of 8
      const Generated plain = run(*rig.model, prompt, n);
      const StatusOr<std::vector<int32_t>> spec = generate(*rig.model, prompt, n, nullptr, {}, nullptr, defaults);
      ASSERT_TRUE(spec.ok()) << n << " tokens, verify step of " << verify << ": " << spec.status().to_string();
      EXPECT_EQ(*spec, plain.tokens) << n << " tokens, verify step of " << verify;
      EXPECT_EQ(spec->size(), static_cast<size_t>(n));
    }
  }
}

TEST(PromptLookup, DraftsWhatFollowedTheLatestMatch) {
  const PromptLookup lookup(3, 2);
  const std::vector<int32_t> c{1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 2, 3};
  // The suffix "2 3" last occurred at 6..7, followed by 5 6 2 3.
  EXPECT_EQ(lookup.draft(c, 3), (std::vector<int32_t>{5, 6, 2}));
  EXPECT_EQ(lookup.draft(c, 10), (std::vector<int32_t>{5, 6, 2, 3}));
  EXPECT_TRUE(lookup.draft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(lookup.draft(c, 0).empty());
  // The longest suffix wins: "9 1 2" matches nowhere, "1 2" at 0 and 5.
  const std::vector<int32_t> d{7, 1, 2, 8, 1, 2, 4, 1, 2};
  EXPECT_EQ(lookup.draft(d, 2), (std::vector<int32_t>{4, 1}));
}

TEST(DraftPolicy, PausesAfterMissesAndGrowsAfterHits) {
  DraftPolicy p(8);
  EXPECT_EQ(p.next_length(), 8);
  p.record(8, 0);  // a miss: one plain step
  EXPECT_EQ(p.next_length(), 0);
  EXPECT_EQ(p.next_length(), 8);
  p.record(8, 0);  // a second miss in a row: two
  EXPECT_EQ(p.next_length(), 0);
  EXPECT_EQ(p.next_length(), 0);
  EXPECT_EQ(p.next_length(), 8);
  p.record(8, 2);
  EXPECT_EQ(p.next_length(), 3);
  p.record(3, 3);
  EXPECT_EQ(p.next_length(), 6);
  p.record(6, 6);
  EXPECT_EQ(p.next_length(), 8);
}

TEST(Speculation, RealModelTokensAreExactlyPlainGreedy) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  RealModel real = std::move(open_real_model(path)).value();
  Rig rig(1ull << 30);
  ASSERT_OK(rig.load(real.file, {.max_context = 512}));
  Gemma3Model& m = *rig.model;
  // Verify against steps, bitwise, at 8 and 16 tokens.
  const std::vector<int32_t> text = real.tokenizer.encode("The quick brown fox jumps over the lazy dog. 1, 2, 3,").value();
  std::vector<int32_t> tokens = text;
  while (tokens.size() < 30) tokens.push_back(tokens[tokens.size() % text.size()]);
  const std::vector<std::vector<float>> want = step_logits(m, tokens);
  EXPECT_EQ(verify_mismatches(m, tokens, want, 6, 8), 0);
  EXPECT_EQ(verify_mismatches(m, tokens, want, 13, 16), 0);
  for (const char* prompt : {"1, 2, 3, 4, 5, 6, 7, 8,", "The capital of France is"}) {
    expect_speculation_exact(m, real.tokenizer.encode(prompt).value(), m.config().vocab, 64, {7});
  }
}

}  // namespace
}  // namespace npurt::models
