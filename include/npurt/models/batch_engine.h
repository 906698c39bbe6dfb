// BatchEngine: many requests decoded together, continuously batched over a model's
// batched decode step and paged KV cache.
//
//   auto engine = models::BatchEngine::create(model);   // a shared_ptr, loaded with batch_sequences
//   auto id = engine->submit({.prompt = ids, .max_tokens = 32},
//                            [](models::RequestId id, int32_t token) { ... });
//   engine->run_until_idle();                            // or step() from a serving loop
//   engine->output(*id);                                 // the request's tokens
//
// Each step() admits queued requests while the compiled batch has room, runs one
// decode_batch() over every running request (a prompt token, or the last chosen one)
// and retires the requests that finished. Prompts go in one token per step, except
// the blocks KvBlocks finds cached (a shared prefix is not computed again). When the
// pool runs out of blocks, the most recently admitted request is preempted: its blocks
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
#include <vector>

#include "npurt/base/status.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/kv_blocks.h"
#include "npurt/models/sampler.h"
#include "npurt/models/token_model.h"

namespace npurt::models {

using RequestId = uint64_t;

struct EngineRequest {
  std::vector<int32_t> prompt;  // non-empty, within the vocabulary
  int max_tokens = 16;          // >= 1
  SamplingParams sampling{};    // greedy unless told otherwise
  std::vector<int32_t> stop_tokens{};  // end the request (not returned)
};

enum class RequestState : uint8_t { kQueued, kRunning, kFinished, kCancelled, kFailed };

class BatchEngine {
 public:
  // Sees each token of a request as soon as it is chosen.
  using OnToken = std::function<void(RequestId, int32_t)>;

  // Over `model`'s batched decode step (Gemma3Options::batch_sequences > 0) and a
  // KvBlocks over its pool; the engine keeps the model alive. The model's decode_batch()
  // is the engine's alone while it lives (its step(), verify() and prefill() are not
  // touched: they use the one-sequence cache).
  static StatusOr<std::unique_ptr<BatchEngine>> create(std::shared_ptr<Gemma3Model> model);

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
  StatusOr<FinishReason> finish_reason(RequestId id) const;
  // Why a failed request failed (ok for one that did not; not found for an unknown id).
  Status failure(RequestId id) const;

  size_t queued() const { return queue_.size(); }
  size_t running() const { return running_.size(); }
  const KvBlocks& blocks() const { return kv_; }
  // Requests preempted so far (each one recomputed when readmitted).
  uint64_t preemptions() const { return preemptions_; }

 private:
  struct Request {
    EngineRequest params;
    OnToken on_token;
    RequestState state = RequestState::kQueued;
    std::vector<int32_t> output;
    FinishReason reason = FinishReason::kLength;
    Status failure;
    // While running: the tokens its sequence holds (prompt, then output) and how many
    // of them are in the cache.
    std::vector<int32_t> context;
    size_t cached = 0;
  };

  BatchEngine(std::shared_ptr<Gemma3Model> model, KvBlocks kv) : model_(std::move(model)), kv_(std::move(kv)) {}
  StatusOr<Request*> find(RequestId id);
  StatusOr<const Request*> find(RequestId id) const;
  void admit();
  void preempt_newest();
  void end(RequestId id, RequestState state);
  // The step's entries for every running request, preempting (or failing a request
  // that cannot fit alone) until the pool holds them all.
  std::vector<BatchToken> plan_step(std::vector<std::vector<uint32_t>>& tables);
  // Takes request `id`'s token `t`: a stop token ends it, any other is output.
  void take(RequestId id, Request& r, int32_t t);

  std::shared_ptr<Gemma3Model> model_;
  KvBlocks kv_;
  std::map<RequestId, Request> requests_;
  std::deque<RequestId> queue_;
  std::vector<RequestId> running_;  // in admission order
  RequestId next_id_ = 1;
  uint64_t preemptions_ = 0;
};

}  // namespace npurt::models
