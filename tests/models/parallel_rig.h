// What the tensor-parallel Gemma-3 tests share: a synthetic model that splits over 2 and
// 4 devices, a greedy run that keeps every step's logits, and the comparison of a run
// over several devices with the same run on one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "models/real_model.h"
#include "models/synthetic_gemma3.h"
#include "npurt/base/math.h"
#include "npurt/models/gemma3_model.h"

namespace npurt::models {

// Four query heads over one KV head (replicated on 2 and 4 devices); the projections
// that are cut by columns use 32-element blocks, the others K-quant blocks.
inline SyntheticGemma3 parallel_model() {
  using enum isa::DType;
  return {.layers = 2, .hidden = 256, .ffn = 1024, .heads = 4, .kv_heads = 1, .head_dim = 64, .vocab = 400,
          .sliding_window = 8, .context = 128, .global_period = 2,
          .dtype = matrix_dtypes(kQ8_0, kQ6_K, {{kQ4_K, kQ5_0, kF16, kQ8_0, kQ5_K, kBF16, kQ6_K},
                                                {kF32, kQ8_0, kQ4_0, kQ5_0, kQ4_0, kQ4_K, kQ4_K}})};
}

// Greedy tokens and every step's logits.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string error;
};

// The prompt by prefill (batched unless the chunk is 0), then `n` greedy steps.
inline GreedyRun greedy(Gemma3Model& m, const std::vector<int32_t>& prompt, int n) {
  GreedyRun r;
  auto fail = [&](const Status& s) {
    r.error = s.to_string();
    return r;
  };
  if (Status s = m.reset(); !s.ok()) return fail(s);
  StatusOr<int32_t> next = m.prefill(prompt);
  for (int i = 0; i < n; ++i) {
    if (!next.ok()) return fail(next.status());
    auto logits = m.logits();  // over MPI, a collective every rank takes part in
    if (!logits.ok()) return fail(logits.status());
    r.tokens.push_back(*next);
    r.logits.push_back(std::move(logits).value());
    if (i + 1 < n) next = m.step(*next);
  }
  return r;
}

// The same tokens, and logits within rel-L2 kRunsAgree at every step; prints the worst
// when `speak`.
inline void expect_same_run(const GreedyRun& one, const GreedyRun& many, const std::string& what, bool speak = true) {
  ASSERT_TRUE(one.error.empty()) << one.error;
  ASSERT_TRUE(many.error.empty()) << many.error;
  EXPECT_EQ(many.tokens, one.tokens) << what;
  double worst = 0;
  for (size_t i = 0; i < one.logits.size() && i < many.logits.size(); ++i) {
    worst = std::max(worst, rel_l2(many.logits[i], one.logits[i]));
  }
  EXPECT_LE(worst, kRunsAgree) << what;
  if (speak) std::printf("  %s: %zu tokens equal, worst logits rel-L2 %.2e\n", what.c_str(), one.tokens.size(), worst);
}

}  // namespace npurt::models
