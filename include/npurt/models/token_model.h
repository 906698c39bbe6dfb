// TokenModel: a language model run one token at a time with greedy selection, and
// the decoding loop shared by every backend (the device model, the host oracle).
//
//   GenerateStats stats;
//   auto tokens = models::generate(model, prompt_ids, 32, &tokenizer,
//                                  [&](int32_t t) { std::cout << tokenizer.token_text(t); }, &stats);
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/models/draft.h"
#include "npurt/models/sampler.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {

class TokenModel {
 public:
  virtual ~TokenModel() = default;
  // Runs `token` at position() (appending it to the context) and returns the id of
  // the largest logit (ties: the lowest id).
  virtual StatusOr<int32_t> step(int32_t token) = 0;
  // Runs `tokens` (non-empty) in order and returns the greedy successor of the last;
  // models with batched prefill override this. The default steps token by token.
  virtual StatusOr<int32_t> prefill(std::span<const int32_t> tokens);
  // Runs `tokens` (non-empty) from position() on and returns the greedy successor of
  // each, exactly as that many step() calls would; models with a batched verify step
  // override it (one call reads the weights once). The default steps token by token.
  virtual StatusOr<std::vector<int32_t>> verify(std::span<const int32_t> tokens);
  // The most tokens one verify() call takes (0: verify() steps token by token).
  virtual uint32_t max_verify_tokens() const { return 0; }
  // Moves the next step back to `position` (0 .. position()), dropping the context
  // from there on. The default supports only the current position.
  virtual Status rewind(int32_t position);
  // Empties the context: the next step is at position 0.
  virtual Status reset() = 0;
  virtual int32_t position() const = 0;
  // Positions the context holds at most (step() past it fails).
  virtual int32_t context_capacity() const { return INT32_MAX; }
  // The logits (vocab floats) of the token the last step() or prefill() returned the
  // successor of: what sampling chooses from. The default has none.
  virtual StatusOr<std::vector<float>> logits() const;
  // The logits of every token of the last verify() call (n x vocab floats). The
  // default has none (so generate() does not speculate while sampling).
  virtual StatusOr<std::vector<float>> verify_logits() const;
};

// Why generate() stopped.
enum class FinishReason {
  kLength,      // max_new_tokens tokens
  kStopToken,   // the tokenizer's stop token or one of GenerateOptions::stop_tokens
  kStopString,  // the text reached one of GenerateOptions::stop_strings
};
const char* finish_reason_name(FinishReason r);  // "length", "stop_token", "stop_string"

struct GenerateStats {
  int prompt_tokens = 0;
  double prefill_seconds = 0;  // every prompt token's step: the time to the first token
  int generated_tokens = 0;
  double decode_seconds = 0;   // the steps of generated tokens that were fed back
  int decode_steps = 0;        // plain steps (one token each)
  // Speculation: verify steps, the tokens they checked as drafts and how many of those
  // were right (each verify step also yields one token of its own).
  int verify_steps = 0;
  int drafted_tokens = 0;
  int accepted_tokens = 0;
  FinishReason finish_reason = FinishReason::kLength;
  // One per returned token when the choices read the logits (sampling, penalties or
  // top_logprobs): the chosen token's log-probability and the most likely tokens'.
  std::vector<TokenChoice> choices{};
  // Tokens the decoding passes produced (each plain step one, each verify step one
  // and its accepted drafts): what decode tokens/s counts.
  int decoded_tokens() const { return decode_steps + verify_steps + accepted_tokens; }
  // Tokens per pass over the weights (1 without speculation).
  double tokens_per_pass() const {
    const int passes = decode_steps + verify_steps;
    return passes > 0 ? static_cast<double>(decoded_tokens()) / passes : 0.0;
  }
  double tokens_per_verify_step() const {
    return verify_steps > 0 ? static_cast<double>(verify_steps + accepted_tokens) / verify_steps : 0.0;
  }
  double acceptance_rate() const {
    return drafted_tokens > 0 ? static_cast<double>(accepted_tokens) / drafted_tokens : 0.0;
  }
};

struct GenerateOptions {
  // Speculative decoding: the most tokens drafted per verify step (0: one token per
  // step). At most the model's max_verify_tokens() - 1, unless the verify step is as
  // long as the context (then drafts just stop at the context's end). The output is the
  // same either way, token for token; only the speed differs.
  int speculate = 0;
  Drafter drafter{};  // empty: PromptLookup
  // How each token is chosen (greedy by default). Sampled text depends only on the
  // prompt, these parameters and the seed: speculation and batching leave it as it is.
  SamplingParams sampling{};
  // Token ids that end decoding (not returned), besides the tokenizer's stop token.
  std::vector<int32_t> stop_tokens{};
  // Texts that end decoding once the output's text (the tokenizer's token_text of each
  // token) contains one; needs the tokenizer. The token in which the match starts and
  // every later one are not returned, and on_token sees a token only once no stop
  // string can start in it.
  std::vector<std::string> stop_strings{};
  // What `npurt generate` and the Python package draft unless told otherwise.
  static constexpr int kDefaultSpeculate = 7;
};

// Decoding: resets `model`, runs `prompt` (model.prefill), then chooses a token up to
// `max_new_tokens` times (options.sampling: greedy unless told otherwise), feeding each
// back except the last. With `stop`, a stop token ends decoding and is not returned.
// `on_token` sees each new token as soon as it is chosen (with stop strings: once it
// is safe from them). Returns the new tokens.
//
// With options.speculate N > 0, a step may instead verify the fed-back token and up to
// N drafted ones in one model.verify() call, keep the drafts that equal the greedy
// tokens, take the model's own token after the last of them, and rewind the rest;
// DraftPolicy decides how many to draft. Verification gives each token the bits a
// plain step gives it, so the tokens are exactly those of plain greedy decoding; when
// sampling, each verified token's choice is the one a plain step would make (it is a
// function of its logits, context and position), so drafts are checked against it and
// the text is that of plain sampling too.
StatusOr<std::vector<int32_t>> generate(TokenModel& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                                        const Tokenizer* stop = nullptr,
                                        const std::function<void(int32_t)>& on_token = {},
                                        GenerateStats* stats = nullptr, const GenerateOptions& options = {});

}  // namespace npurt::models
