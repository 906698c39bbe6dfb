// EngineLoop: a BatchEngine on a thread of its own, for callers on other threads (the
// HTTP handlers of `npurt serve`).
//
//   auto loop = serve::EngineLoop::start(model, tokenizer, {.max_queue = 64});
//   StatusOr<std::shared_ptr<serve::RequestStream>> s = (*loop)->submit(request);
//   while (auto e = (*s)->next(std::chrono::seconds(1))) { ... e->token ... if (e->end) break; }
//   (*loop)->cancel(**s);                     // a client that went away
//
// The thread admits submissions and cancellations between engine steps and steps while
// any request is queued or running; it sleeps otherwise. Each request's tokens reach its
// RequestStream as the engine hands them out, then one end event (the finish reason, or
// the error that failed it). Submissions beyond max_queue waiting requests are refused
// (kResourceExhausted), so a burst cannot grow the queue without bound.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/models/batch_engine.h"

namespace npurt::serve {

// What a request's stream carries: a token, or (end) why it ended.
struct StreamEvent {
  bool end = false;
  int32_t token = 0;
  models::FinishReason reason = models::FinishReason::kLength;
  Status error{};                              // a request that failed, or was cancelled
  std::vector<models::TokenChoice> choices{};  // with the end, when logprobs were asked for
  size_t prompt_tokens = 0;                  // with the end
};

class RequestStream {
 public:
  // The next event, waiting up to `timeout`; nullopt if none came in that time.
  std::optional<StreamEvent> next(std::chrono::milliseconds timeout);

 private:
  friend class EngineLoop;
  void push(StreamEvent e);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  models::RequestId id_ = 0;  // set by the loop's thread when admitted
};

// Figures of the engine, as of its last step.
struct EngineFigures {
  size_t queued = 0, running = 0, waiting = 0;  // waiting: submitted, not yet seen by the thread
  uint32_t kv_blocks_used = 0, kv_blocks_free = 0;
  uint64_t preemptions = 0, prompt_tokens_computed = 0, steps = 0;
};

struct EngineLoopOptions {
  size_t max_queue = 64;  // requests waiting for a slot, at most
};

class EngineLoop {
 public:
  static StatusOr<std::unique_ptr<EngineLoop>> start(std::shared_ptr<models::Gemma3Model> model,
                                                     std::shared_ptr<const models::Tokenizer> tokenizer,
                                                     EngineLoopOptions options = {});
  // Cancels whatever still runs, then joins the thread.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Checks the request (bad ones are refused by name, as BatchEngine::submit does) and
  // queues it; kResourceExhausted when max_queue requests already wait.
  StatusOr<std::shared_ptr<RequestStream>> submit(models::EngineRequest request);
  // Ends the stream's request (queued or running) and frees its blocks; its stream gets
  // an end event with a kAborted error. Nothing if it has ended.
  void cancel(const std::shared_ptr<RequestStream>& stream);
  EngineFigures figures() const;
  const models::Gemma3Model& model() const { return *model_; }

 private:
  EngineLoop(std::shared_ptr<models::Gemma3Model> model, std::unique_ptr<models::BatchEngine> engine,
             EngineLoopOptions options)
      : model_(std::move(model)), engine_(std::move(engine)), options_(options) {}
  void run();
  // On the thread: takes the new submissions and cancellations into the engine.
  void admit(std::unique_lock<std::mutex>& lock);
  // On the thread: an end event to every request that ended in the last step.
  void retire();

  std::shared_ptr<models::Gemma3Model> model_;
  std::unique_ptr<models::BatchEngine> engine_;  // the thread's alone
  EngineLoopOptions options_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::pair<models::EngineRequest, std::shared_ptr<RequestStream>>> inbox_;
  std::vector<std::shared_ptr<RequestStream>> cancels_;
  EngineFigures figures_;
  bool stopping_ = false;
  std::map<models::RequestId, std::shared_ptr<RequestStream>> live_;  // the thread's alone
  std::thread thread_;
};

}  // namespace npurt::serve
