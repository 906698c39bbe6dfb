#include "npurt/models/batch_engine.h"

#include <algorithm>
#include <string>

#include "models/find_entry.h"
#include "npurt/base/math.h"

namespace npurt::models {
namespace {

std::string request_name(RequestId id) { return "batch engine: request " + std::to_string(id); }

}  // namespace

StatusOr<std::unique_ptr<BatchEngine>> BatchEngine::create(std::shared_ptr<Gemma3Model> model,
                                                            std::shared_ptr<const Tokenizer> tokenizer) {
  if (model == nullptr) return invalid_argument("batch engine: no model");
  if (model->max_batch() == 0) {
    return failed_precondition("batch engine: the model was loaded without a batched decode step "
                               "(Gemma3Options::batch_sequences 0)");
  }
  NPURT_ASSIGN_OR_RETURN(KvBlocks kv,
                         KvBlocks::create({.blocks = model->kv_blocks(), .block_positions = model->kv_block_positions()}));
  return std::unique_ptr<BatchEngine>(new BatchEngine(std::move(model), std::move(tokenizer), std::move(kv)));
}

StatusOr<BatchEngine::Request*> BatchEngine::find(RequestId id) { return find_entry(requests_, id, request_name); }

StatusOr<const BatchEngine::Request*> BatchEngine::find(RequestId id) const {
  return find_entry(requests_, id, request_name);
}

Status BatchEngine::check(const EngineRequest& request) const {
  const int32_t vocab = model_->config().vocab;
  if (request.prompt.empty()) return invalid_argument("batch engine: the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab) {
      return invalid_argument("batch engine: prompt token " + std::to_string(i) + " (" +
                              std::to_string(request.prompt[i]) + ") is outside the vocabulary of " +
                              std::to_string(vocab));
    }
  }
  if (request.max_tokens < 1) return invalid_argument("batch engine: max_tokens " + std::to_string(request.max_tokens) + " is below 1");
  // The last chosen token is never fed: the sequence holds prompt + max_tokens - 1.
  const uint64_t positions = request.prompt.size() + static_cast<uint64_t>(request.max_tokens) - 1;
  if (positions > model_->max_context()) {
    return out_of_range("batch engine: a prompt of " + std::to_string(request.prompt.size()) + " tokens and " +
                        std::to_string(request.max_tokens) + " new ones need " + std::to_string(positions) +
                        " positions; the context holds " + std::to_string(model_->max_context()));
  }
  NPURT_RETURN_IF_ERROR(check_sampling(request.sampling));
  for (const std::string& s : request.stop_strings) {
    if (s.empty()) return invalid_argument("batch engine: a stop string is empty");
  }
  if (!request.stop_strings.empty() && tokenizer_ == nullptr) {
    return invalid_argument("batch engine: stop strings need the engine's tokenizer (to read the tokens' text)");
  }
  return ok_status();
}

StatusOr<RequestId> BatchEngine::submit(EngineRequest request, OnToken on_token) {
  NPURT_RETURN_IF_ERROR(check(request));
  const RequestId id = next_id_++;
  Request& r = requests_[id];
  r.stop_text = StopText(tokenizer_.get(), request.stop_strings);
  r.params = std::move(request);
  r.on_token = std::move(on_token);
  queue_.push_back(id);
  return id;
}

void BatchEngine::admit() {
  for (auto it = queue_.begin(); it != queue_.end() && running_.size() < model_->max_batch();) {
    const RequestId id = *it;
    Request& r = requests_.at(id);
    // After a preemption the output so far is recomputed with the prompt.
    r.context = r.params.prompt;
    r.context.insert(r.context.end(), r.output.begin(), r.output.end());
    // Not while the pool could not hold its context beside the running ones: it would
    // only be preempted again (alone it is admitted, and fails if it cannot fit).
    const uint64_t need = ceil_div(r.context.size() + 1, kv_.block_positions());
    if (!running_.empty() && need > kv_.free_blocks()) break;
    if (waits_for_prefix(r)) {
      ++it;
      continue;
    }
    it = queue_.erase(it);
    const StatusOr<uint32_t> shared = kv_.add(id, r.context);
    if (!shared.ok()) {
      r.failure = shared.status();
      r.state = RequestState::kFailed;
      continue;
    }
    r.cached = *shared;
    r.state = RequestState::kRunning;
    running_.push_back(id);
  }
}

bool BatchEngine::waits_for_prefix(const Request& q) const {
  const size_t bp = kv_.block_positions();
  // add() shares full blocks up to the one holding the context's last token.
  const size_t sharable = (q.context.size() - 1) / bp * bp;
  for (RequestId id : running_) {
    const Request& r = requests_.at(id);
    const size_t prompt = r.params.prompt.size();
    if (r.cached >= prompt) continue;  // its prompt's blocks are computed (and cached)
    const size_t n = std::min(sharable, prompt);
    const size_t common = std::mismatch(q.context.begin(), q.context.begin() + n, r.params.prompt.begin()).first -
                          q.context.begin();
    // r publishes a block once it has computed all of it.
    if (common / bp > r.cached / bp) return true;
  }
  return false;
}

void BatchEngine::end(RequestId id, RequestState state) {
  Request& r = requests_.at(id);
  if (r.state == RequestState::kRunning) {
    (void)kv_.remove(id);  // it exists while running
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else if (r.state == RequestState::kQueued) {
    queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  }
  r.state = state;
}

void BatchEngine::preempt_newest() {
  const RequestId id = running_.back();
  (void)kv_.remove(id);
  running_.pop_back();
  requests_.at(id).state = RequestState::kQueued;
  queue_.push_front(id);
  ++preemptions_;
}

bool BatchEngine::in_prompt(const Request& r) const {
  return model_->max_paged_prefill() > 0 && r.cached < r.params.prompt.size();
}

TokenOrigin BatchEngine::origin_at(const Request& r, size_t position) {
  return position < r.params.prompt.size() ? TokenOrigin::kPrompt : TokenOrigin::kGenerated;
}

std::vector<BatchToken> BatchEngine::plan_step(std::vector<RequestId>& ids, std::vector<std::vector<uint32_t>>& tables) {
  for (;;) {
    ids.clear();
    for (RequestId id : running_) {
      if (!in_prompt(requests_.at(id))) ids.push_back(id);
    }
    std::vector<BatchToken> batch;
    tables.assign(ids.size(), {});
    size_t s = 0;
    Status full;
    for (; s < ids.size(); ++s) {
      const Request& r = requests_.at(ids[s]);
      const int32_t token = r.context[r.cached];
      const StatusOr<AppendPlan> plan = kv_.append(ids[s], std::span(&token, 1), origin_at(r, r.cached));
      if (!plan.ok()) {
        full = plan.status();
        break;
      }
      const std::span<const uint32_t> t = *kv_.table(ids[s]);
      tables[s].assign(t.begin(), t.end());
      batch.push_back({token, static_cast<int32_t>(r.cached), tables[s], plan->rows[0]});
    }
    if (full.ok()) return batch;
    // Out of blocks: undo this pass's appends, then make room and plan again.
    for (size_t i = 0; i < s; ++i) (void)kv_.truncate(ids[i], static_cast<uint32_t>(requests_.at(ids[i]).cached));
    if (!make_room(ids[s], full)) return {};
  }
}

bool BatchEngine::make_room(RequestId needs, const Status& full) {
  if (running_.size() > 1) {
    preempt_newest();
    return true;
  }
  Request& alone = requests_.at(needs);
  alone.failure = full.with_context("the pool cannot hold it alone");
  end(needs, RequestState::kFailed);
  return false;
}

void BatchEngine::hand_out(RequestId id, Request& r, size_t upto) {
  for (; r.handed_out < upto; ++r.handed_out) {
    if (r.on_token) r.on_token(id, r.output[r.handed_out]);
  }
}

void BatchEngine::take(RequestId id, Request& r, const TokenChoice& c) {
  const int32_t t = c.token;
  const auto& stops = r.params.stop_tokens;
  if ((tokenizer_ != nullptr && tokenizer_->is_stop(t)) || std::find(stops.begin(), stops.end(), t) != stops.end()) {
    hand_out(id, r, r.output.size());
    r.reason = FinishReason::kStopToken;
    end(id, RequestState::kFinished);
    return;
  }
  r.output.push_back(t);
  r.context.push_back(t);
  if (r.params.sampling.wants_logprobs()) r.choices.push_back(c);
  if (r.stop_text.active() && r.stop_text.add(t)) {
    r.output.resize(r.stop_text.safe_tokens(true));
    r.choices.resize(std::min(r.choices.size(), r.output.size()));
    hand_out(id, r, r.output.size());
    r.reason = FinishReason::kStopString;
    end(id, RequestState::kFinished);
    return;
  }
  const bool last = r.output.size() >= static_cast<size_t>(r.params.max_tokens);
  hand_out(id, r, r.stop_text.active() && !last ? r.stop_text.safe_tokens(false) : r.output.size());
  if (last) {
    r.reason = FinishReason::kLength;
    end(id, RequestState::kFinished);
  }
}

StatusOr<TokenChoice> BatchEngine::choose(const Request& r, int32_t greedy, const std::vector<float>& logits,
                                          size_t slot, size_t slots) const {
  if (r.params.sampling.plain_greedy()) return TokenChoice{.token = greedy};
  const size_t vocab = logits.size() / slots;
  return choose_token(std::span(logits).subspan(slot * vocab, vocab), r.params.sampling, r.context,
                      r.params.prompt.size());
}

StatusOr<size_t> BatchEngine::prefill_chunk(size_t budget) {
  const auto it = std::find_if(running_.begin(), running_.end(), [&](RequestId id) { return in_prompt(requests_.at(id)); });
  if (it == running_.end() || budget == 0) return size_t{0};
  const RequestId id = *it;
  Request& r = requests_.at(id);
  const size_t n = std::min({size_t{model_->max_paged_prefill()}, r.params.prompt.size() - r.cached, budget});
  const std::span<const int32_t> tokens = std::span(r.params.prompt).subspan(r.cached, n);
  StatusOr<AppendPlan> plan = kv_.append(id, tokens, TokenOrigin::kPrompt);
  while (!plan.ok()) {
    if (!make_room(id, plan.status()) || r.state != RequestState::kRunning) return size_t{0};
    plan = kv_.append(id, tokens, TokenOrigin::kPrompt);
  }
  const std::span<const uint32_t> table = *kv_.table(id);
  std::vector<BatchToken> rows;
  for (size_t i = 0; i < n; ++i) rows.push_back({tokens[i], static_cast<int32_t>(r.cached + i), table, plan->rows[i]});
  NPURT_ASSIGN_OR_RETURN(const int32_t next, model_->prefill_paged(rows));
  prompt_tokens_computed_ += n;
  r.cached += n;
  if (r.cached < r.context.size()) return n;  // more prompt, or recomputing its output
  std::vector<float> logits;
  if (!r.params.sampling.plain_greedy()) {
    NPURT_ASSIGN_OR_RETURN(logits, model_->batch_logits());
  }
  NPURT_ASSIGN_OR_RETURN(const TokenChoice c, choose(r, next, logits, 0, 1));
  take(id, r, c);
  return n;
}

StatusOr<size_t> BatchEngine::step() {
  admit();
  const size_t prefilling = std::count_if(running_.begin(), running_.end(), [&](RequestId id) { return in_prompt(requests_.at(id)); });
  // Prompts first, oldest first, up to kPrefillChunksPerStep chunks' worth of tokens.
  for (size_t budget = kPrefillChunksPerStep * size_t{model_->max_paged_prefill()}; budget > 0;) {
    NPURT_ASSIGN_OR_RETURN(const size_t used, prefill_chunk(budget));
    if (used == 0) break;
    budget -= used;
  }
  std::vector<RequestId> ids;
  std::vector<std::vector<uint32_t>> tables;
  const std::vector<BatchToken> batch = plan_step(ids, tables);
  if (batch.empty()) return prefilling;
  NPURT_ASSIGN_OR_RETURN(const std::vector<int32_t> next, model_->decode_batch(batch));
  std::vector<float> logits;
  for (size_t s = 0; s < ids.size(); ++s) {
    Request& r = requests_.at(ids[s]);
    if (r.cached < r.params.prompt.size()) ++prompt_tokens_computed_;
    if (++r.cached < r.context.size()) continue;  // still in its prompt, or recomputing
    if (!r.params.sampling.plain_greedy() && logits.empty()) {
      NPURT_ASSIGN_OR_RETURN(logits, model_->batch_logits());
    }
    NPURT_ASSIGN_OR_RETURN(const TokenChoice c, choose(r, next[s], logits, s, ids.size()));
    take(ids[s], r, c);
  }
  return batch.size() + prefilling;
}

Status BatchEngine::run_until_idle() {
  while (!queue_.empty() || !running_.empty()) NPURT_RETURN_IF_ERROR(step().status());
  return ok_status();
}

Status BatchEngine::cancel(RequestId id) {
  NPURT_ASSIGN_OR_RETURN(Request * r, find(id));
  if (r->state != RequestState::kQueued && r->state != RequestState::kRunning) {
    return failed_precondition(request_name(id) + " has already ended");
  }
  end(id, RequestState::kCancelled);
  return ok_status();
}

StatusOr<RequestState> BatchEngine::state(RequestId id) const {
  NPURT_ASSIGN_OR_RETURN(const Request* r, find(id));
  return r->state;
}

StatusOr<std::vector<int32_t>> BatchEngine::output(RequestId id) const {
  NPURT_ASSIGN_OR_RETURN(const Request* r, find(id));
  return r->output;
}

StatusOr<std::vector<TokenChoice>> BatchEngine::choices(RequestId id) const {
  NPURT_ASSIGN_OR_RETURN(const Request* r, find(id));
  return r->choices;
}

StatusOr<FinishReason> BatchEngine::finish_reason(RequestId id) const {
  NPURT_ASSIGN_OR_RETURN(const Request* r, find(id));
  if (r->state != RequestState::kFinished) return failed_precondition(request_name(id) + " has not finished");
  return r->reason;
}

Status BatchEngine::failure(RequestId id) const {
  NPURT_ASSIGN_OR_RETURN(const Request* r, find(id));
  return r->failure;
}

}  // namespace npurt::models
