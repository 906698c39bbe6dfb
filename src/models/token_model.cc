#include "npurt/models/token_model.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace npurt::models {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

StatusOr<int32_t> TokenModel::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("prefill: no tokens");
  int32_t next = 0;
  for (int32_t tok : tokens) {
    NPURT_ASSIGN_OR_RETURN(next, step(tok));
  }
  return next;
}

StatusOr<std::vector<int32_t>> TokenModel::verify(std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("verify: no tokens");
  std::vector<int32_t> out;
  for (int32_t tok : tokens) {
    NPURT_ASSIGN_OR_RETURN(int32_t next, step(tok));
    out.push_back(next);
  }
  return out;
}

Status TokenModel::rewind(int32_t position) {
  if (position == this->position()) return Status();
  return unimplemented("rewind: this model cannot drop context (to position " + std::to_string(position) + " from " +
                       std::to_string(this->position()) + ")");
}

namespace {

// The drafts of one step: at most what is left to generate after the next token, the
// verify step's capacity less that token, and the context left.
int draft_budget(const TokenModel& model, int policy_length, int left, int32_t context_left) {
  const int verify = static_cast<int>(model.max_verify_tokens());
  return std::max(0, std::min({policy_length, left, verify - 1, static_cast<int>(context_left) - 1}));
}

}  // namespace

StatusOr<std::vector<int32_t>> generate(TokenModel& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                                        const Tokenizer* stop, const std::function<void(int32_t)>& on_token,
                                        GenerateStats* stats, const GenerateOptions& options) {
  if (prompt.empty()) return invalid_argument("generate: the prompt is empty");
  if (max_new_tokens < 0) {
    return invalid_argument("generate: max_new_tokens " + std::to_string(max_new_tokens) + " is negative");
  }
  if (options.speculate < 0) {
    return invalid_argument("generate: speculate " + std::to_string(options.speculate) + " is negative");
  }
  // A verify step shorter than the context is a limit of what was compiled: asking
  // for more drafts than it holds is a mistake to name. One cut short by the context
  // (a short prompt and few tokens to generate) is not: no step could draft past the
  // context anyway, so the drafts simply stop there (draft_budget).
  const int verify = static_cast<int>(model.max_verify_tokens());
  const bool verify_limits = verify < model.context_capacity();
  if (options.speculate > 0 && options.speculate + 1 > verify && verify_limits) {
    return invalid_argument("generate: speculate " + std::to_string(options.speculate) +
                            " drafts need a verify step of " + std::to_string(options.speculate + 1) +
                            " tokens; the model's takes at most " + std::to_string(model.max_verify_tokens()));
  }
  GenerateStats local;
  GenerateStats& st = stats != nullptr ? *stats : local;
  st = GenerateStats{};
  NPURT_RETURN_IF_ERROR(model.reset());
  auto t0 = std::chrono::steady_clock::now();
  NPURT_ASSIGN_OR_RETURN(int32_t next, model.prefill(prompt));
  st.prompt_tokens = static_cast<int>(prompt.size());
  st.prefill_seconds = seconds_since(t0);

  const Drafter drafter = options.drafter ? options.drafter : PromptLookup().drafter();
  DraftPolicy policy(options.speculate);
  std::vector<int32_t> context = prompt, out;
  // Takes `token` as generated; false once decoding ends (a stop token, or enough).
  const auto emit = [&](int32_t token) {
    if (stop != nullptr && stop->is_stop(token)) return false;
    out.push_back(token);
    context.push_back(token);
    if (on_token) on_token(token);
    return static_cast<int>(out.size()) < max_new_tokens;
  };
  t0 = std::chrono::steady_clock::now();
  bool more = max_new_tokens > 0;
  while (more && emit(next)) {
    const int left = max_new_tokens - static_cast<int>(out.size());
    const int32_t context_left = model.context_capacity() - model.position();
    const int budget = options.speculate > 0 ? draft_budget(model, policy.next_length(), left - 1, context_left) : 0;
    std::vector<int32_t> drafts = budget > 0 ? drafter(context, budget) : std::vector<int32_t>{};
    if (drafts.size() > static_cast<size_t>(budget)) drafts.resize(static_cast<size_t>(budget));
    const auto t_step = std::chrono::steady_clock::now();
    if (drafts.empty()) {
      NPURT_ASSIGN_OR_RETURN(next, model.step(next));
      ++st.decode_steps;
      policy.record_plain(seconds_since(t_step));
      continue;
    }
    // The fed-back token and the drafts in one pass; greedy[i] follows input i.
    const int32_t at = model.position();
    std::vector<int32_t> inputs{next};
    inputs.insert(inputs.end(), drafts.begin(), drafts.end());
    NPURT_ASSIGN_OR_RETURN(const std::vector<int32_t> greedy, model.verify(inputs));
    size_t accepted = 0;
    while (accepted < drafts.size() && drafts[accepted] == greedy[accepted]) ++accepted;
    ++st.verify_steps;
    st.drafted_tokens += static_cast<int>(drafts.size());
    st.accepted_tokens += static_cast<int>(accepted);
    policy.record(static_cast<int>(drafts.size()), static_cast<int>(accepted), seconds_since(t_step));
    // The cache keeps the fed-back token and the accepted drafts.
    NPURT_RETURN_IF_ERROR(model.rewind(at + 1 + static_cast<int32_t>(accepted)));
    for (size_t i = 0; i < accepted && more; ++i) more = emit(drafts[i]);
    next = greedy[accepted];
  }
  st.generated_tokens = static_cast<int>(out.size());
  st.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace npurt::models
