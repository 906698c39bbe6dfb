// Choosing the next token from a step's logits: greedy, or sampled with temperature,
// top-k, top-p and min-p, after repetition, presence and frequency penalties; with the
// log-probabilities of the chosen token and of the most likely ones.
//
//   SamplingParams p{.temperature = 0.8f, .top_p = 0.95f, .seed = 42};
//   NPURT_RETURN_IF_ERROR(check_sampling(p));
//   StatusOr<TokenChoice> c = choose_token(logits, p, context, prompt_len);
//
// The choice is a pure function of the logits, the parameters, the context and the
// context's length (the position the token takes): the random number comes from a
// counter-based generator (Philox4x32-10) keyed by the seed and counted by that
// position, never from a shared stream. So the same prompt, parameters and seed give
// the same text alone, in any batch, and with or without speculative drafts.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "npurt/base/status.h"

namespace npurt::models {

struct SamplingParams {
  // 0: greedy (the largest logit after penalties; ties: the lowest id). Otherwise the
  // logits are divided by it before the softmax.
  float temperature = 0.0f;
  int top_k = 0;         // keep the k most likely tokens; 0: all
  float top_p = 1.0f;    // keep the fewest most likely tokens whose mass reaches p; (0, 1]
  float min_p = 0.0f;    // keep tokens at least min_p times as likely as the best; [0, 1]
  // > 1 discourages every token of the context (prompt and output): a positive logit
  // is divided by it, a negative one multiplied. 1: off.
  float repetition_penalty = 1.0f;
  // Subtracted from the logit of every token the output has so far: once (presence)
  // and once per occurrence (frequency). 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  // The chosen token's log-probability with each choice (an extra pass over the
  // logits), and those of the top_logprobs most likely tokens (0 .. kMaxTopLogprobs;
  // more than 0 implies logprobs).
  bool logprobs = false;
  int top_logprobs = 0;
  static constexpr int kMaxTopLogprobs = 20;

  bool wants_logprobs() const { return logprobs || top_logprobs > 0; }
  // Whether the choice is the plain argmax of the logits: the device's own argmax
  // then serves, and no logits need to be read back.
  bool plain_greedy() const {
    return temperature == 0.0f && repetition_penalty == 1.0f && presence_penalty == 0.0f && frequency_penalty == 0.0f &&
           !wants_logprobs();
  }
};

// An error naming the first parameter out of its range.
Status check_sampling(const SamplingParams& params);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct TokenChoice {
  int32_t token = 0;
  // Of the model's own distribution (the softmax of the logits as they came, before
  // penalties, temperature and masks), so they describe the model, not the settings.
  // NaN unless params.wants_logprobs().
  float logprob = NAN;
  std::vector<TokenLogprob> top{};  // params.top_logprobs entries, most likely first
};

// The next token after `context` (the prompt and the output so far; its first
// `prompt_len` tokens are the prompt) from `logits` (one per vocabulary id). The
// token takes position context.size(), which counts the random number. A logit that
// is NaN is an error naming its id.
StatusOr<TokenChoice> choose_token(std::span<const float> logits, const SamplingParams& params,
                                   std::span<const int32_t> context, size_t prompt_len);

// The tokens a sampled choice draws from, with their probabilities (summing to 1),
// most likely first (ties: the lower id): what the masks keep of the penalized
// logits at the temperature. Requires temperature > 0. For tests and tools.
struct Candidate {
  int32_t token = 0;
  double prob = 0.0;
};
StatusOr<std::vector<Candidate>> sampling_candidates(std::span<const float> logits, const SamplingParams& params,
                                                     std::span<const int32_t> context, size_t prompt_len);

// Philox4x32-10 (Salmon et al., SC'11): 4 random words for a 128-bit counter and a
// 64-bit key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
// A uniform double in [0, 1) with 53 random bits for (seed, position).
double uniform_at(uint64_t seed, uint64_t position);

}  // namespace npurt::models
