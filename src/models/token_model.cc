#include "npurt/models/token_model.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "npurt/models/stop_text.h"

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

StatusOr<std::vector<float>> TokenModel::logits() const {
  return unimplemented("logits: this model does not keep its logits");
}

StatusOr<std::vector<float>> TokenModel::verify_logits() const {
  return unimplemented("verify_logits: this model does not keep its verify step's logits");
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopString: return "stop_string";
  }
  return "unknown";
}

Status TokenModel::rewind(int32_t position) {
  if (position == this->position()) return ok_status();
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
  NPURT_RETURN_IF_ERROR(check_sampling(options.sampling));
  for (const std::string& s : options.stop_strings) {
    if (s.empty()) return invalid_argument("generate: a stop string is empty");
  }
  if (!options.stop_strings.empty() && stop == nullptr) {
    return invalid_argument("generate: stop strings need the tokenizer (to read the tokens' text)");
  }
  GenerateStats local;
  GenerateStats& st = stats != nullptr ? *stats : local;
  st = GenerateStats{};
  const SamplingParams& sampling = options.sampling;
  const bool read_logits = !sampling.plain_greedy();
  std::vector<int32_t> context = prompt, out;
  // The choice after `ctx` from `logits` (read back only when not plain greedy).
  const auto choose = [&](std::span<const float> logits, std::span<const int32_t> ctx) {
    return choose_token(logits, sampling, ctx, prompt.size());
  };
  NPURT_RETURN_IF_ERROR(model.reset());
  auto t0 = std::chrono::steady_clock::now();
  TokenChoice next;
  NPURT_ASSIGN_OR_RETURN(next.token, model.prefill(prompt));
  if (read_logits) {
    NPURT_ASSIGN_OR_RETURN(const std::vector<float> logits, model.logits());
    NPURT_ASSIGN_OR_RETURN(next, choose(logits, context));
  }
  st.prompt_tokens = static_cast<int>(prompt.size());
  st.prefill_seconds = seconds_since(t0);

  const Drafter drafter = options.drafter ? options.drafter : PromptLookup().drafter();
  DraftPolicy policy(options.speculate);
  StopText stop_text(stop, options.stop_strings);
  std::vector<TokenChoice> choices;
  size_t handed_out = 0;  // tokens on_token has seen
  const auto hand_out = [&](size_t upto) {
    for (; handed_out < upto; ++handed_out) {
      if (on_token) on_token(out[handed_out]);
    }
  };
  // Takes `c` as generated; false once decoding ends (a stop, or enough).
  const auto emit = [&](const TokenChoice& c) {
    const int32_t token = c.token;
    if ((stop != nullptr && stop->is_stop(token)) ||
        std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end()) {
      st.finish_reason = FinishReason::kStopToken;
      return false;
    }
    out.push_back(token);
    context.push_back(token);
    if (read_logits) choices.push_back(c);
    if (!stop_text.active()) {
      hand_out(out.size());
    } else if (stop_text.add(token)) {
      out.resize(stop_text.safe_tokens(true));
      st.finish_reason = FinishReason::kStopString;
      return false;
    } else {
      hand_out(stop_text.safe_tokens(false));
    }
    if (static_cast<int>(out.size()) < max_new_tokens) return true;
    st.finish_reason = FinishReason::kLength;
    return false;
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
      NPURT_ASSIGN_OR_RETURN(next.token, model.step(next.token));
      if (read_logits) {
        NPURT_ASSIGN_OR_RETURN(const std::vector<float> logits, model.logits());
        NPURT_ASSIGN_OR_RETURN(next, choose(logits, context));
      }
      ++st.decode_steps;
      policy.record_plain(seconds_since(t_step));
      continue;
    }
    // The fed-back token and the drafts in one pass; chosen[i] follows input i.
    const int32_t at = model.position();
    std::vector<int32_t> inputs{next.token};
    inputs.insert(inputs.end(), drafts.begin(), drafts.end());
    NPURT_ASSIGN_OR_RETURN(const std::vector<int32_t> greedy, model.verify(inputs));
    std::vector<TokenChoice> chosen(greedy.size());
    for (size_t i = 0; i < greedy.size(); ++i) chosen[i].token = greedy[i];
    size_t accepted = 0;
    if (read_logits) {
      NPURT_ASSIGN_OR_RETURN(const std::vector<float> all, model.verify_logits());
      const size_t vocab = all.size() / inputs.size();
      std::vector<int32_t> ctx = context;
      // Choice i follows the context and the first i drafts; it is only needed while
      // every draft before it was right.
      for (size_t i = 0;; ++i) {
        NPURT_ASSIGN_OR_RETURN(chosen[i], choose(std::span<const float>(all).subspan(i * vocab, vocab), ctx));
        if (i == drafts.size() || drafts[i] != chosen[i].token) break;
        ctx.push_back(drafts[i]);
        ++accepted;
      }
    } else {
      while (accepted < drafts.size() && drafts[accepted] == greedy[accepted]) ++accepted;
    }
    ++st.verify_steps;
    st.drafted_tokens += static_cast<int>(drafts.size());
    st.accepted_tokens += static_cast<int>(accepted);
    policy.record(static_cast<int>(drafts.size()), static_cast<int>(accepted), seconds_since(t_step));
    // The cache keeps the fed-back token and the accepted drafts.
    NPURT_RETURN_IF_ERROR(model.rewind(at + 1 + static_cast<int32_t>(accepted)));
    for (size_t i = 0; i < accepted && more; ++i) more = emit(chosen[i]);
    next = chosen[accepted];
  }
  hand_out(out.size());
  if (read_logits) {
    choices.resize(out.size());
    st.choices = std::move(choices);
  }
  st.generated_tokens = static_cast<int>(out.size());
  st.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace npurt::models
