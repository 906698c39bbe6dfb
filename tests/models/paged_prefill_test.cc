// Gemma-3's paged prefill chunk: a prompt run as matrix work into the paged pool gives
// the same bits however it is cut into calls, the host oracle's logits, and caches the
// batched decode step reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "models/gemma3_rig.h"
#include "npurt/base/math.h"
#include "npurt/models/host_oracle.h"
#include "npurt/models/kv_blocks.h"

namespace npurt::models {
namespace {

// The logits after the prompt and after each of `greedy` tokens decoded from it.
struct PrefillRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;  // the greedy ones
  std::string error;
};

// `prompt` cut into calls of `cuts` rows (prefill_paged; an empty `cuts` feeds it one
// token per decode_batch() call instead), then `greedy` tokens through decode_batch().
// Another sequence holds the pool's first blocks, so the prompt's rows are not the
// first ones.
PrefillRun run(Gemma3Model& m, const std::vector<int32_t>& prompt, const std::vector<size_t>& cuts, int greedy) {
  PrefillRun r;
  KvBlocks kv = *KvBlocks::create({.blocks = m.kv_blocks(), .block_positions = m.kv_block_positions()});
  const std::vector<int32_t> other{7, 7, 7, 7, 7};
  (void)kv.add(99, other);
  (void)kv.append(99, other);
  (void)kv.add(1, prompt);
  auto rows_for = [&](std::span<const int32_t> tokens, std::vector<uint32_t>& table) -> std::vector<BatchToken> {
    const auto start = static_cast<int32_t>(*kv.length(1));
    const StatusOr<AppendPlan> plan = kv.append(1, tokens);
    if (!plan.ok()) r.error = plan.status().to_string();
    const auto t = *kv.table(1);
    table.assign(t.begin(), t.end());
    std::vector<BatchToken> rows;
    for (size_t i = 0; i < tokens.size(); ++i) {
      rows.push_back({tokens[i], start + static_cast<int32_t>(i), table, plan->rows[i]});
    }
    return rows;
  };
  std::vector<uint32_t> table;
  int32_t next = -1;
  if (cuts.empty()) {
    for (int32_t t : prompt) {
      const StatusOr<std::vector<int32_t>> n = m.decode_batch(rows_for(std::span(&t, 1), table));
      if (!n.ok()) r.error = n.status().to_string();
      if (!r.error.empty()) return r;
      next = (*n)[0];
    }
  } else {
    size_t at = 0;
    for (size_t cut : cuts) {
      const StatusOr<int32_t> n = m.prefill_paged(rows_for(std::span(prompt).subspan(at, cut), table));
      if (!n.ok()) r.error = n.status().to_string();
      if (!r.error.empty()) return r;
      next = *n;
      at += cut;
    }
    if (at != prompt.size()) r.error = "the cuts do not cover the prompt";
  }
  r.logits.push_back(*m.batch_logits());
  for (int i = 0; i < greedy && r.error.empty(); ++i) {
    r.tokens.push_back(next);
    const StatusOr<std::vector<int32_t>> n = m.decode_batch(rows_for(std::span(&next, 1), table));
    if (!n.ok()) {
      r.error = n.status().to_string();
      break;
    }
    next = (*n)[0];
    r.logits.push_back(*m.batch_logits());
  }
  return r;
}

// A 19-token prompt (past the local layers' window of 8, over blocks of 4 positions)
// cut three ways into calls of up to 8 rows, then 10 greedy tokens: the same bits
// every way; the oracle's logits and tokens. Then the control: the same prompt fed
// token by token through the decode step's kernels, which sum in another order, is
// seen to differ in its bits.
TEST(PagedPrefill, EveryCutGivesTheSameBitsAndTheOraclesLogits) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .prefill_chunk = 8, .batch_sequences = 2, .kv_block_positions = 4}));
  ASSERT_EQ(rig.model->max_paged_prefill(), 8u);
  const std::vector<int32_t> prompt = random_prompt(19, 5);
  const int greedy = 10;
  const PrefillRun whole = run(*rig.model, prompt, {8, 8, 3}, greedy);
  ASSERT_EQ(whole.error, "");
  for (const std::vector<size_t>& cuts : std::vector<std::vector<size_t>>{{5, 7, 7}, std::vector<size_t>(19, 1)}) {
    const PrefillRun other = run(*rig.model, prompt, cuts, greedy);
    ASSERT_EQ(other.error, "");
    EXPECT_EQ(other.tokens, whole.tokens);
    int differ = 0;
    for (size_t i = 0; i < whole.logits.size(); ++i) differ += bits(other.logits[i]) != bits(whole.logits[i]);
    EXPECT_EQ(differ, 0) << "logits that differ with cuts of " << cuts[0] << ", " << cuts[1] << ", ...";
  }

  HostOracle oracle = std::move(HostOracle::load(p.file)).value();
  std::vector<int32_t> fed = prompt;
  fed.insert(fed.end(), whole.tokens.begin(), whole.tokens.end());
  std::span<const float> want;
  double worst = 0;
  for (size_t i = 0; i < fed.size(); ++i) {
    want = *oracle.step(fed[i]);
    if (i + 1 < prompt.size()) continue;
    const std::vector<float>& got = whole.logits[i + 1 - prompt.size()];
    worst = std::max(worst, rel_l2(got, want));
    if (i + 1 < fed.size()) {
      EXPECT_EQ(fed[i + 1], std::max_element(want.begin(), want.end()) - want.begin()) << "position " << i;
    }
  }
  std::printf("paged prefill then batched decode: worst logits rel-L2 %.2e against the host oracle\n", worst);
  EXPECT_LE(worst, 1e-5);

  const PrefillRun by_decode = run(*rig.model, prompt, {}, greedy);
  ASSERT_EQ(by_decode.error, "");
  int differ = 0;
  for (size_t i = 0; i < whole.logits.size(); ++i) differ += bits(by_decode.logits[i]) != bits(whole.logits[i]);
  EXPECT_GT(differ, 0) << "kernels summing in another order went unseen";
}

TEST(PagedPrefill, BadCallsAreNamed) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  const std::vector<uint32_t> table{0};
  Rig none;
  ASSERT_OK(none.load(p.file, {.max_context = 0, .prefill_chunk = 0, .batch_sequences = 2}));
  EXPECT_EQ(none.model->prefill_paged(std::vector<BatchToken>{{1, 0, table, 0}}).status().code(),
            StatusCode::kFailedPrecondition);
  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .prefill_chunk = 2, .batch_sequences = 2, .kv_block_positions = 4}));
  const auto message = [&](std::vector<BatchToken> b) { return rig.model->prefill_paged(b).status().message(); };
  EXPECT_NE(message({}).find("prefill_paged of 0 rows"), std::string::npos);
  EXPECT_NE(message({{1, 0, table, 0}, {1, 1, table, 1}, {1, 2, table, 2}}).find("takes 1 .. 2"), std::string::npos);
  EXPECT_NE(message({{1, 0, table, 0}, {300, 1, table, 1}}).find("row 1: token 300"), std::string::npos);
  const StatusOr<int32_t> ok = rig.model->prefill_paged(std::vector<BatchToken>{{1, 0, table, 0}, {2, 1, table, 1}});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(rig.model->batch_logits()->size(), 300u);
}

}  // namespace
}  // namespace npurt::models
