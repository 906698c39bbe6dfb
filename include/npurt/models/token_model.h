// TokenModel: a language model run one token at a time with greedy selection, and
// the decoding loop shared by every backend (the device model, the host oracle).
//
//   GenerateStats stats;
//   auto tokens = models::generate(model, prompt_ids, 32, &tokenizer,
//                                  [&](int32_t t) { std::cout << tokenizer.token_text(t); }, &stats);
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "npurt/base/status.h"
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
  // Empties the context: the next step is at position 0.
  virtual Status reset() = 0;
  virtual int32_t position() const = 0;
};

struct GenerateStats {
  int prompt_tokens = 0;
  double prefill_seconds = 0;  // every prompt token's step: the time to the first token
  int generated_tokens = 0;
  double decode_seconds = 0;   // the steps of generated tokens that were fed back
  int decode_steps = 0;
};

// Greedy decoding: resets `model`, runs `prompt` token by token, then takes the
// greedy token up to `max_new_tokens` times, feeding each back except the last. With
// `stop`, a stop token ends decoding and is not returned. `on_token` sees each new
// token as soon as it is chosen. Returns the new tokens.
StatusOr<std::vector<int32_t>> generate(TokenModel& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                                        const Tokenizer* stop = nullptr,
                                        const std::function<void(int32_t)>& on_token = {},
                                        GenerateStats* stats = nullptr);

}  // namespace npurt::models
