#include "npurt/models/draft.h"

#include <algorithm>

namespace npurt::models {

std::vector<int32_t> PromptLookup::draft(std::span<const int32_t> context, int max_tokens) const {
  const int64_t len = static_cast<int64_t>(context.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_ngram_, len - 1); n >= std::max(min_ngram_, 1); --n) {
    const std::span<const int32_t> suffix = context.subspan(static_cast<size_t>(len - n));
    // The most recent earlier occurrence: recent text predicts the next tokens best.
    for (int64_t at = len - n - 1; at >= 0; --at) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + at)) continue;
      const int64_t from = at + n, to = std::min<int64_t>(from + max_tokens, len);
      return {context.begin() + from, context.begin() + to};
    }
  }
  return {};
}

namespace {

// Exponential moving average; the first sample is taken as it is.
void blend(double& avg, double sample, double weight = 0.25) { avg = avg == 0 ? sample : avg + weight * (sample - avg); }

}  // namespace

int DraftPolicy::best_length(int most, double p, double cost_per_draft) {
  int best = 0;
  double best_gain = 1.0;  // a plain step: one token for one step's cost
  double expected = 1.0, pk = 1.0;
  for (int d = 1; d <= most; ++d) {
    pk *= p;
    expected += pk;  // 1 + p + .. + p^d tokens
    const double gain = expected / (1.0 + cost_per_draft * d);
    if (gain > best_gain) {
      best_gain = gain;
      best = d;
    }
  }
  return best;
}

int DraftPolicy::next_length() {
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  if (step_s_ <= 0 || per_draft_s_ <= 0) return length_;  // nothing measured yet
  // Probing with one draft keeps p known even when longer drafts do not pay.
  return std::max(1, best_length(length_, p_, per_draft_s_ / step_s_));
}

void DraftPolicy::record_plain(double seconds) {
  if (seconds > 0) blend(step_s_, seconds);
}

void DraftPolicy::record(int drafted, int accepted, double seconds) {
  if (drafted <= 0) return;
  blend(p_, static_cast<double>(accepted) / drafted);
  if (seconds > 0 && step_s_ > 0) blend(per_draft_s_, std::max(seconds - step_s_, 0.0) / drafted);
  if (accepted == 0) {
    misses_ = std::min(misses_ + 1, 5);
    pause_ = 1 << (misses_ - 1);  // 1, 2, 4, 8, 16 plain steps
    return;
  }
  misses_ = 0;
  length_ = accepted == drafted ? std::min(max_, 2 * drafted) : std::min(max_, accepted + 1);
}

}  // namespace npurt::models
