#include "serve/engine_loop.h"

#include <utility>

namespace npurt::serve {

std::optional<StreamEvent> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void RequestStream::push(StreamEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

StatusOr<std::unique_ptr<EngineLoop>> EngineLoop::start(std::shared_ptr<models::Gemma3Model> model,
                                                        std::shared_ptr<const models::Tokenizer> tokenizer,
                                                        EngineLoopOptions options) {
  NPURT_ASSIGN_OR_RETURN(std::unique_ptr<models::BatchEngine> engine,
                         models::BatchEngine::create(model, std::move(tokenizer)));
  std::unique_ptr<EngineLoop> loop(new EngineLoop(std::move(model), std::move(engine), options));
  loop->thread_ = std::thread([l = loop.get()] { l->run(); });
  return loop;
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

StatusOr<std::shared_ptr<RequestStream>> EngineLoop::submit(models::EngineRequest request) {
  NPURT_RETURN_IF_ERROR(engine_->check(request));
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return aborted("the server is shutting down");
    if (figures_.queued + inbox_.size() >= options_.max_queue) {
      return resource_exhausted("the queue holds " + std::to_string(options_.max_queue) +
                                " waiting requests already; retry later");
    }
    inbox_.emplace_back(std::move(request), stream);
    figures_.waiting = inbox_.size();
  }
  wake_.notify_all();
  return stream;
}

void EngineLoop::cancel(const std::shared_ptr<RequestStream>& stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(stream);
  }
  wake_.notify_all();
}

EngineFigures EngineLoop::figures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return figures_;
}

void EngineLoop::admit(std::unique_lock<std::mutex>& lock) {
  auto inbox = std::move(inbox_);
  auto cancels = std::move(cancels_);
  inbox_.clear();
  cancels_.clear();
  figures_.waiting = 0;
  lock.unlock();
  for (auto& [request, stream] : inbox) {
    const size_t prompt = request.prompt.size();
    std::weak_ptr<RequestStream> weak = stream;
    StatusOr<models::RequestId> id = engine_->submit(std::move(request), [weak](models::RequestId, int32_t t) {
      if (auto s = weak.lock()) s->push({.token = t});
    });
    if (!id.ok()) {
      stream->push({.end = true, .error = id.status(), .prompt_tokens = prompt});
      continue;
    }
    stream->id_ = *id;
    live_[*id] = stream;
  }
  for (const auto& stream : cancels) {
    if (stream->id_ == 0 || !live_.contains(stream->id_)) continue;  // ended, or refused
    (void)engine_->cancel(stream->id_);
  }
  lock.lock();
}

void EngineLoop::retire() {
  for (auto it = live_.begin(); it != live_.end();) {
    const models::RequestId id = it->first;
    const models::RequestState state = *engine_->state(id);
    if (state == models::RequestState::kQueued || state == models::RequestState::kRunning) {
      ++it;
      continue;
    }
    StreamEvent end{.end = true};
    if (state == models::RequestState::kFinished) {
      end.reason = *engine_->finish_reason(id);
      end.choices = *engine_->choices(id);
    } else if (state == models::RequestState::kCancelled) {
      end.error = aborted("the request was cancelled");
    } else {
      end.error = engine_->failure(id);
    }
    it->second->push(std::move(end));
    it = live_.erase(it);
  }
}

void EngineLoop::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !live_.empty(); });
    if (stopping_) break;
    admit(lock);
    lock.unlock();
    retire();  // cancellations and refusals
    Status stepped;
    if (engine_->queued() + engine_->running() > 0) stepped = engine_->step().status();
    if (!stepped.ok()) {
      // A device error fails every request in flight; the engine stays usable.
      for (auto& [id, stream] : live_) {
        (void)engine_->cancel(id);
        stream->push({.end = true, .error = stepped});
      }
      live_.clear();
    }
    retire();
    lock.lock();
    figures_.queued = engine_->queued();
    figures_.running = engine_->running();
    figures_.kv_blocks_used = engine_->blocks().held_blocks();
    figures_.kv_blocks_free = engine_->blocks().free_blocks();
    figures_.preemptions = engine_->preemptions();
    figures_.prompt_tokens_computed = engine_->prompt_tokens_computed();
    ++figures_.steps;
  }
  // Submissions the thread never took end too, not only the requests it ran.
  const auto inbox = std::move(inbox_);
  inbox_.clear();
  lock.unlock();
  for (const auto& [request, stream] : inbox) stream->push({.end = true, .error = aborted("the server is shutting down")});
  for (auto& [id, stream] : live_) {
    (void)engine_->cancel(id);
    stream->push({.end = true, .error = aborted("the server is shutting down")});
  }
  live_.clear();
}

}  // namespace npurt::serve
