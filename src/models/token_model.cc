#include "npurt/models/token_model.h"

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

StatusOr<std::vector<int32_t>> generate(TokenModel& model, const std::vector<int32_t>& prompt, int max_new_tokens,
                                        const Tokenizer* stop, const std::function<void(int32_t)>& on_token,
                                        GenerateStats* stats) {
  if (prompt.empty()) return invalid_argument("generate: the prompt is empty");
  if (max_new_tokens < 0) {
    return invalid_argument(                  "generate: max_new_tokens " + std::to_string(max_new_tokens) + " is negative");
  }
  GenerateStats local;
  GenerateStats& st = stats != nullptr ? *stats : local;
  st = GenerateStats{};
  NPURT_RETURN_IF_ERROR(model.reset());
  auto t0 = std::chrono::steady_clock::now();
  NPURT_ASSIGN_OR_RETURN(int32_t next, model.prefill(prompt));
  st.prompt_tokens = static_cast<int>(prompt.size());
  st.prefill_seconds = seconds_since(t0);

  std::vector<int32_t> out;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < max_new_tokens; ++i) {
    if (stop != nullptr && stop->is_stop(next)) break;
    out.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == max_new_tokens) break;  // the last token needs no forward pass
    NPURT_ASSIGN_OR_RETURN(next, model.step(next));
    ++st.decode_steps;
  }
  st.generated_tokens = static_cast<int>(out.size());
  st.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace npurt::models
