// Gemma-3's batched decode step over a paged KV cache: sequences at their own
// positions in one pass, each bitwise what it gets alone, close to the one-sequence
// decode step and the host oracle; bad calls named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "hal/sim/matvec_kernels.h"
#include "models/gemma3_rig.h"
#include "npurt/base/math.h"
#include "models/real_model.h"
#include "npurt/models/host_oracle.h"
#include "npurt/models/kv_blocks.h"

namespace npurt::models {
namespace {

// Sequences decoded through decode_batch(): each feeds its prompt, then its greedy
// tokens, one token per call; `together` runs every live sequence in each call (slot
// order rotated call by call), otherwise each sequence runs alone. Records each
// sequence's logits (bits) and the token fed at each position.
struct Decoded {
  std::map<int, std::vector<std::vector<uint32_t>>> logits;
  std::map<int, std::vector<std::vector<float>>> values;
  std::map<int, std::vector<int32_t>> fed;
  std::string error;
};

Decoded run_sequences(Gemma3Model& m, const std::vector<std::vector<int32_t>>& prompts, int greedy, bool together) {
  Decoded r;
  KvBlocks kv = *KvBlocks::create({.blocks = m.kv_blocks(), .block_positions = m.kv_block_positions()});
  struct Live {
    int id;
    std::vector<int32_t> feed;  // tokens still to feed (the prompt, then each greedy one)
    int greedy_left;
  };
  std::vector<Live> live;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!kv.add(i, prompts[i]).ok()) r.error = "add";
    live.push_back({static_cast<int>(i), prompts[i], greedy});
  }
  auto step = [&](std::vector<Live*> slots) {
    std::vector<BatchToken> batch;
    std::vector<std::vector<uint32_t>> tables(slots.size());
    for (size_t s = 0; s < slots.size(); ++s) {
      Live& l = *slots[s];
      const int32_t token = l.feed.front();
      const int32_t position = static_cast<int32_t>(*kv.length(l.id));
      const StatusOr<AppendPlan> plan = kv.append(l.id, std::span(&token, 1));
      if (!plan.ok()) r.error = plan.status().to_string();
      const auto t = *kv.table(l.id);
      tables[s].assign(t.begin(), t.end());
      batch.push_back({token, position, tables[s], plan->rows[0]});
    }
    const StatusOr<std::vector<int32_t>> next = m.decode_batch(batch);
    if (!next.ok()) {
      r.error = next.status().to_string();
      return;
    }
    const std::vector<float> all = *m.batch_logits();
    const size_t vocab = all.size() / slots.size();
    for (size_t s = 0; s < slots.size(); ++s) {
      Live& l = *slots[s];
      const std::span<const float> mine(all.data() + s * vocab, vocab);
      r.logits[l.id].push_back(bits(mine));
      r.values[l.id].emplace_back(mine.begin(), mine.end());
      r.fed[l.id].push_back(l.feed.front());
      l.feed.erase(l.feed.begin());
      if (l.feed.empty() && l.greedy_left-- > 0) l.feed.push_back((*next)[s]);
    }
  };
  for (size_t call = 0; r.error.empty(); ++call) {
    std::vector<Live*> slots;
    for (Live& l : live) {
      if (!l.feed.empty()) slots.push_back(&l);
    }
    if (slots.empty()) break;
    if (together) {
      std::rotate(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(call % slots.size()), slots.end());
      step(slots);
    } else {
      for (Live* l : slots) step({l});
    }
  }
  return r;
}

// `prompts` and `greedy` tokens each through decode_batch(), together (slots rotating,
// lengths apart) and alone, on models loaded with `o` on devices of `gm_bytes`: every
// sequence gets the same bits at every position either way, the greedy tokens are the
// host oracle's choices, and the logits are within `tolerance` (rel-L2) of the
// oracle's and of the one-sequence decode step's. Then the control: GEMVs that sum a
// batch in another order than one vector make the bits differ, and the check sees it.
void expect_batch_invariant_and_exact(const GgufFile& file, const Gemma3Options& o, uint64_t gm_bytes,
                                      const std::vector<std::vector<int32_t>>& prompts, int greedy, double tolerance,
                                      Decoded* out = nullptr) {
  Rig rig(gm_bytes);
  ASSERT_OK(rig.load(file, o));
  ASSERT_EQ(rig.model->max_batch(), o.batch_sequences);
  const Decoded together = run_sequences(*rig.model, prompts, greedy, true);
  ASSERT_EQ(together.error, "");
  if (out != nullptr) *out = together;
  Decoded alone;
  {
    Rig alone_rig(gm_bytes);
    ASSERT_OK(alone_rig.load(file, o));
    alone = run_sequences(*alone_rig.model, prompts, greedy, false);
    ASSERT_EQ(alone.error, "");
  }
  HostOracle oracle = std::move(HostOracle::load(file)).value();
  double worst_oracle = 0, worst_step = 0;
  for (int id = 0; id < static_cast<int>(prompts.size()); ++id) {
    ASSERT_EQ(together.fed.at(id), alone.fed.at(id)) << "sequence " << id;
    ASSERT_EQ(together.logits.at(id).size(), prompts[id].size() + greedy);
    int differ = 0;
    for (size_t i = 0; i < together.logits.at(id).size(); ++i) differ += together.logits.at(id)[i] != alone.logits.at(id)[i];
    EXPECT_EQ(differ, 0) << "sequence " << id << ": positions whose logits differ in a batch and alone";
    // The oracle and the one-sequence decode step over the same tokens.
    ASSERT_OK(oracle.reset());
    ASSERT_OK(rig.model->reset());
    const std::vector<int32_t>& fed = together.fed.at(id);
    for (size_t i = 0; i < fed.size(); ++i) {
      const std::span<const float> want = *oracle.step(fed[i]);
      ASSERT_TRUE(rig.model->step(fed[i]).ok());
      const std::vector<float> single = *rig.model->logits();
      const std::vector<float>& got = together.values.at(id)[i];
      worst_oracle = std::max(worst_oracle, rel_l2(got, want));
      worst_step = std::max(worst_step, rel_l2(got, single));
      if (i + 1 >= prompts[id].size() && i + 1 < fed.size()) {
        // The next token fed is the batch's greedy choice: the oracle's too.
        EXPECT_EQ(fed[i + 1], std::max_element(want.begin(), want.end()) - want.begin()) << "sequence " << id << " position " << i;
      }
    }
  }
  std::printf("batched decode: worst logits rel-L2 %.2e against the host oracle, %.2e against the one-sequence step\n",
              worst_oracle, worst_step);
  EXPECT_LE(worst_oracle, tolerance);
  EXPECT_LE(worst_step, tolerance);

  sim::matvec_set_batch_reorder_for_test(true);
  Decoded reordered;
  {
    Rig reordered_rig(gm_bytes);
    const Status loaded = reordered_rig.load(file, o);
    if (loaded.ok()) reordered = run_sequences(*reordered_rig.model, prompts, greedy, true);
    sim::matvec_set_batch_reorder_for_test(false);
    ASSERT_OK(loaded);
  }
  ASSERT_EQ(reordered.error, "");
  int differ = 0;
  for (int id = 0; id < static_cast<int>(prompts.size()); ++id) {
    const size_t n = std::min(reordered.logits.at(id).size(), alone.logits.at(id).size());
    for (size_t i = 0; i < n; ++i) differ += reordered.logits.at(id)[i] != alone.logits.at(id)[i];
  }
  EXPECT_GT(differ, 0) << "a batch-dependent GEMV went unseen";
}

// Prompts of 5, 11 and 2 tokens and 14 greedy tokens each, past the local layer's
// window of 8 and across blocks of 4 positions.
TEST(BatchDecode, EachSequenceGetsItsOwnBitsInAnyBatchAndMatchesTheOracle) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  expect_batch_invariant_and_exact(p.file, {.max_context = 0, .batch_sequences = 4, .kv_block_positions = 4},
                                   256ull << 20, {random_prompt(5, 1), random_prompt(11, 2), random_prompt(2, 3)},
                                   14, 1e-5);
}

// The real file: three prompts and 8 greedy tokens each (the first is "The capital of
// France is", whose continuation starts " the").
TEST(BatchDecode, RealModelSequencesGetTheirOwnBitsAndTheOraclesTokens) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  RealModel real = std::move(open_real_model(path)).value();
  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"The capital of France is", "Once upon a time", "1, 2, 3, 4,"}) {
    prompts.push_back(*real.tokenizer.encode(text));
  }
  const Gemma3Options o{.max_context = 64, .prefill_chunk = 0, .verify_tokens = 0, .batch_sequences = 4};
  const uint64_t gm = gemma3_device_spec(real.file, 8, o)->memory_bytes;
  Decoded together;
  expect_batch_invariant_and_exact(real.file, o, gm, prompts, 8, kRunsAgree, &together);
  ASSERT_GT(together.fed[0].size(), prompts[0].size());
  EXPECT_EQ(real.tokenizer.token_text(together.fed[0][prompts[0].size()]), " the");
}

TEST(BatchDecode, BadCallsAreNamedAndTheModelStaysUsable) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  Rig none;
  ASSERT_OK(none.load(p.file));
  const std::vector<uint32_t> table{0};
  EXPECT_EQ(none.model->decode_batch(std::vector<BatchToken>{{1, 0, table, 0}}).status().code(),
            StatusCode::kFailedPrecondition);

  Rig rig;
  ASSERT_OK(rig.load(p.file, {.max_context = 0, .batch_sequences = 2, .kv_block_positions = 4}));
  const auto message = [&](std::vector<BatchToken> b) { return rig.model->decode_batch(b).status().message(); };
  const std::vector<uint32_t> two{3, 5};
  EXPECT_NE(message({}).find("decode_batch of 0 sequences"), std::string::npos);
  EXPECT_NE(message({{1, 0, table, 0}, {1, 0, table, 0}, {1, 0, table, 0}}).find("takes 1 .. 2"), std::string::npos);
  EXPECT_NE(message({{300, 0, table, 0}}).find("token 300"), std::string::npos);
  EXPECT_NE(message({{1, 128, table, 0}}).find("position 128"), std::string::npos);
  EXPECT_NE(message({{1, 4, table, 0}}).find("needs 2"), std::string::npos);
  EXPECT_NE(message({{1, 5, two, 12}}).find("row 12"), std::string::npos);  // position 5 is row 5 * 4 + 1
  const StatusOr<std::vector<int32_t>> ok = rig.model->decode_batch(std::vector<BatchToken>{{1, 5, two, 21}});
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(rig.model->batch_logits()->size(), 300u);
}

}  // namespace
}  // namespace npurt::models
