// BatchEngine: many requests decoded together, continuously batched over a model's
// batched decode step and paged KV cache.
//
//   auto engine = models::BatchEngine::create(model);   // a shared_ptr, loaded with batch_sequences
//   auto id = engine->submit({.prompt = ids, .max_tokens = 32},
//                            [](models::RequestId id, int32_t token) { ... });
//   engine->run_until_idle();                            // or step() from a serving loop
//   engine->output(*id);                                 // the request's tokens
//
// Each step() admits queued requests while the compiled batch has room, runs the
// unfinished prompts, oldest first, through the model's paged prefill chunk (calls of up
// to Gemma3Options::prefill_chunk tokens of matrix work, kPrefillChunksPerStep chunks'
// worth per step; without one, prompts go one token per decode step), then one
// decode_batch() over every running request past its prompt, and retires the requests
// that finished. So a long new prompt costs the running requests a few chunks per
// step, not a stall. The blocks KvBlocks finds cached are not computed again (a shared
// prefix of prompt tokens), and a queued request whose prompt shares full blocks with a
// prompt still being computed waits for them instead of computing them a second time
// (n samples of one prompt, many clients with one system prompt); requests behind it
// are admitted meanwhile. When the pool runs out of blocks, the most recently admitted request is preempted: its blocks
// are released and it waits at the head of the queue with what it has produced, to be
// recomputed when readmitted.
//
// A request's tokens depend only on its prompt and parameters: the batched step gives
// each sequence the bits it gets alone, and sampling is keyed by the seed and the
// position (models/sampler.h), so neither the other requests, nor preemption, nor
// the order of admission change them.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/kv_blocks.h"
#include "npurt/models/sampler.h"
#include "npurt/models/stop_text.h"
#include "npurt/models/token_model.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {

using RequestId = uint64_t;

struct EngineRequest {
  std::vector<int32_t> prompt;  // non-empty, within the vocabulary
  int max_tokens = 16;          // >= 1
  SamplingParams sampling{};    // greedy unless told otherwise
  std::vector<int32_t> stop_tokens{};  // end the request (not returned)
  // End the request where its text first holds one (the text before it is returned);
  // needs the engine's tokenizer.
  std::vector<std::string> stop_strings{};
};

enum class RequestState : uint8_t { kQueued, kRunning, kFinished, kCancelled, kFailed };

class BatchEngine {
 public:
  // Sees each token of a request as soon as it is chosen (with stop strings, once no
  // stop string can start in its text).
  using OnToken = std::function<void(RequestId, int32_t)>;

  // Over `model`'s batched decode step (Gemma3Options::batch_sequences > 0) and a
  // KvBlocks over its pool; the engine keeps the model alive. The model's decode_batch()
  // is the engine's alone while it lives (its step(), verify() and prefill() are not
  // touched: they use the one-sequence cache).
  // With a `tokenizer`, its stop tokens (end of text, end of turn) end a request too,
  // and requests may have stop strings.
  static StatusOr<std::unique_ptr<BatchEngine>> create(std::shared_ptr<Gemma3Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer = nullptr);

  // An error naming what is wrong with `request` (as submit() would refuse it); reads
  // only what does not change while the engine lives, so any thread may call it.
  Status check(const EngineRequest& request) const;
  // Queues a request; its tokens go to `on_token` as they come.
  StatusOr<RequestId> submit(EngineRequest request, OnToken on_token = {});
  // Ends a queued or running request; its blocks are released at once.
  Status cancel(RequestId id);
  // One pass over the weights for every running request; returns how many ran (0:
  // nothing queued or running).
  StatusOr<size_t> step();
  // step() until nothing is queued or running.
  Status run_until_idle();

  StatusOr<RequestState> state(RequestId id) const;
  // The tokens chosen so far (all of them once finished), and why it finished.
  StatusOr<std::vector<int32_t>> output(RequestId id) const;
  // With SamplingParams::logprobs or top_logprobs: each output token's choice (its
  // log-probability and the most likely alternatives).
  StatusOr<std::vector<TokenChoice>> choices(RequestId id) const;
  StatusOr<FinishReason> finish_reason(RequestId id) const;
  // Why a failed request failed (ok for one that did not; not found for an unknown id).
  Status failure(RequestId id) const;

  // Prompt tokens a step prefills at most, in chunks of the model's prefill_chunk: a
  // burst of new requests gets its first tokens sooner, for one longer step of the
  // running ones.
  static constexpr size_t kPrefillChunksPerStep = 4;

  size_t queued() const { return queue_.size(); }
  size_t running() const { return running_.size(); }
  const KvBlocks& blocks() const { return kv_; }
  // Requests preempted so far (each one recomputed when readmitted).
  uint64_t preemptions() const { return preemptions_; }
  // Prompt tokens computed so far (those found cached are not).
  uint64_t prompt_tokens_computed() const { return prompt_tokens_computed_; }

 private:
  struct Request {
    EngineRequest params;
    OnToken on_token;
    RequestState state = RequestState::kQueued;
    std::vector<int32_t> output;
    std::vector<TokenChoice> choices;  // with logprobs
    StopText stop_text{nullptr, {}};
    size_t handed_out = 0;  // output tokens on_token has seen
    FinishReason reason = FinishReason::kLength;
    Status failure;
    // While running: the tokens its sequence holds (prompt, then output) and how many
    // of them are in the cache.
    std::vector<int32_t> context;
    size_t cached = 0;
  };

  BatchEngine(std::shared_ptr<Gemma3Model> model, std::shared_ptr<const Tokenizer> tokenizer, KvBlocks kv)
      : model_(std::move(model)), tokenizer_(std::move(tokenizer)), kv_(std::move(kv)) {}
  StatusOr<Request*> find(RequestId id);
  StatusOr<const Request*> find(RequestId id) const;
  void admit();
  void preempt_newest();
  void end(RequestId id, RequestState state);
  // Whether queued `q` would share full blocks of prompt that a running request has
  // yet to compute: it is admitted once they are cached.
  bool waits_for_prefix(const Request& q) const;
  // The decode step's entries (`ids`: their requests, in slot order) for every running
  // request past its prompt, preempting (or failing a request that cannot fit alone)
  // until the pool holds them all.
  std::vector<BatchToken> plan_step(std::vector<RequestId>& ids, std::vector<std::vector<uint32_t>>& tables);
  // One paged prefill call of at most `budget` tokens for the oldest running request
  // still in its prompt; the tokens it took (0: none waits, or no room).
  StatusOr<size_t> prefill_chunk(size_t budget);
  // The pool cannot take what `needs` appends: preempts the newest request, or fails
  // `needs` when it runs alone (false: nothing more to try).
  bool make_room(RequestId needs, const Status& full);
  // Whether r's prompt still goes through the paged prefill chunk (the model has one).
  bool in_prompt(const Request& r) const;
  static TokenOrigin origin_at(const Request& r, size_t position);
  // r's next token: `greedy` (the device's argmax), or sampled from row `slot` of
  // `logits` (`slots` rows).
  StatusOr<TokenChoice> choose(const Request& r, int32_t greedy, const std::vector<float>& logits, size_t slot,
                               size_t slots) const;
  // Takes request `id`'s choice `c`: a stop token ends it, any other is output.
  void take(RequestId id, Request& r, const TokenChoice& c);
  // Hands r's output up to `upto` to its on_token.
  static void hand_out(RequestId id, Request& r, size_t upto);

  std::shared_ptr<Gemma3Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;  // may be null
  KvBlocks kv_;
  std::map<RequestId, Request> requests_;
  std::deque<RequestId> queue_;
  std::vector<RequestId> running_;  // in admission order
  RequestId next_id_ = 1;
  uint64_t preemptions_ = 0;
  uint64_t prompt_tokens_computed_ = 0;
};

}  // namespace npurt::models
