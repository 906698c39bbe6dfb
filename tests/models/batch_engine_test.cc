// BatchEngine: requests continuously batched over the batched decode step give what
// each gets alone, through queueing, prefix sharing, preemption and cancellation.
#include "npurt/models/batch_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "models/gemma3_rig.h"
#include "npurt/models/host_oracle.h"

namespace npurt::models {
namespace {

// `chunk` > 0: prompts go through the paged prefill chunk of that many rows.
std::shared_ptr<Gemma3Model> load_batched(const GgufFile& file, uint32_t sequences, uint32_t blocks,
                                          std::shared_ptr<Runtime>& runtime, uint32_t chunk = 0) {
  runtime = Runtime::create("sim", {.memory_bytes = 256ull << 20}).value();
  return std::shared_ptr<Gemma3Model>(Gemma3Model::load(file, *runtime,
                                                        {.max_context = 0, .prefill_chunk = chunk, .verify_tokens = 0,
                                                         .batch_sequences = sequences, .kv_blocks = blocks,
                                                         .kv_block_positions = 4})
                                          .value());
}

// Six requests: prompts of 1 .. 13 tokens (two sharing an 8-token prefix, so the
// second finds its blocks cached), 5 .. 12 new tokens, two of them sampled.
std::vector<EngineRequest> requests() {
  std::mt19937 rng(17);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % 300);
    return t;
  };
  const std::vector<int32_t> shared = tokens(8);
  std::vector<EngineRequest> r(6);
  r[0].prompt = tokens(5);
  r[0].max_tokens = 12;
  r[1].prompt = shared;
  r[1].prompt.push_back(3);
  r[1].max_tokens = 9;
  r[2].prompt = tokens(1);
  r[2].max_tokens = 7;
  r[2].sampling = {.temperature = 0.9f, .top_k = 20, .seed = 4};
  r[3].prompt = shared;
  r[3].prompt.insert(r[3].prompt.end(), {9, 9, 9, 9, 9});
  r[3].max_tokens = 10;
  r[4].prompt = tokens(13);
  r[4].max_tokens = 5;
  r[4].sampling = {.temperature = 1.2f, .top_p = 0.9f, .seed = 11};
  r[5].prompt = tokens(3);
  r[5].max_tokens = 8;
  return r;
}

struct Outcome {
  std::vector<std::vector<int32_t>> outputs, streamed;
  uint64_t preemptions = 0;
  uint64_t prompt_tokens_computed = 0;
};

// All requests submitted at once to an engine of `sequences` slots over `blocks`
// blocks (or, with `alone`, each on its own after the previous one finished).
Outcome run(const GgufFile& file, uint32_t sequences, uint32_t blocks, bool alone, uint32_t chunk = 0) {
  std::shared_ptr<Runtime> runtime;
  auto engine = BatchEngine::create(load_batched(file, sequences, blocks, runtime, chunk)).value();
  const std::vector<EngineRequest> rs = requests();
  Outcome o;
  o.streamed.resize(rs.size());
  std::vector<RequestId> ids;
  for (size_t i = 0; i < rs.size(); ++i) {
    ids.push_back(engine->submit(rs[i], [&o, i](RequestId, int32_t t) { o.streamed[i].push_back(t); }).value());
    if (alone) {
      EXPECT_TRUE(engine->run_until_idle().ok());
    }
  }
  EXPECT_TRUE(engine->run_until_idle().ok());
  for (RequestId id : ids) {
    EXPECT_EQ(engine->state(id).value(), RequestState::kFinished) << "request " << id << ": " << engine->failure(id).to_string();
    o.outputs.push_back(engine->output(id).value());
  }
  EXPECT_EQ(engine->blocks().held_blocks(), 0u);  // every finished request released its blocks
  o.preemptions = engine->preemptions();
  o.prompt_tokens_computed = engine->prompt_tokens_computed();
  return o;
}

// Greedy requests: each token is the host oracle's argmax after what came before.
void expect_oracle_tokens(const GgufFile& file, const Outcome& o) {
  const std::vector<EngineRequest> rs = requests();
  HostOracle oracle = std::move(HostOracle::load(file)).value();
  for (size_t i : {0u, 1u, 3u, 5u}) {
    ASSERT_TRUE(oracle.reset().ok());
    std::span<const float> logits;
    for (int32_t t : rs[i].prompt) logits = *oracle.step(t);
    for (int32_t t : o.outputs[i]) {
      EXPECT_EQ(t, std::max_element(logits.begin(), logits.end()) - logits.begin()) << "request " << i;
      logits = *oracle.step(t);
    }
  }
}

TEST(BatchEngine, EveryRequestGetsWhatItGetsAloneAndGreedyOnesTheOraclesTokens) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  const Outcome alone = run(p.file, 3, 0, true);
  const Outcome together = run(p.file, 3, 0, false);
  EXPECT_EQ(together.outputs, alone.outputs);
  EXPECT_EQ(together.streamed, together.outputs);
  const std::vector<EngineRequest> rs = requests();
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(alone.outputs[i].size(), static_cast<size_t>(rs[i].max_tokens));
  expect_oracle_tokens(p.file, together);
  // The sampled ones are not all the greedy choice (so the seeds were used).
  EXPECT_NE(together.outputs[2], together.outputs[0]);
}

// A pool of 8 blocks (32 positions) for 3 slots whose requests need up to 22
// positions each: the newest is preempted and recomputed, with the same outputs.
TEST(BatchEngine, PreemptionWhenThePoolIsFullChangesNoOutput) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  const Outcome alone = run(p.file, 3, 0, true);
  const Outcome tight = run(p.file, 3, 8, false);
  EXPECT_GT(tight.preemptions, 0u);
  EXPECT_EQ(tight.outputs, alone.outputs);
  std::printf("preemptions with 8 blocks: %llu\n", static_cast<unsigned long long>(tight.preemptions));
}

// Prompts through the paged prefill chunk (3 rows, so the 13-token prompt takes five
// chunks while others decode): alone, together and preempted, the same outputs, and
// the greedy ones the oracle's.
TEST(BatchEngine, ChunkedPrefillBetweenDecodeStepsChangesNoOutput) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  const Outcome alone = run(p.file, 3, 0, true, 3);
  const Outcome together = run(p.file, 3, 0, false, 3);
  const Outcome tight = run(p.file, 3, 8, false, 3);
  EXPECT_EQ(together.outputs, alone.outputs);
  EXPECT_EQ(together.streamed, together.outputs);
  EXPECT_GT(tight.preemptions, 0u);
  EXPECT_EQ(tight.outputs, alone.outputs);
  expect_oracle_tokens(p.file, together);
  // Every prompt token but the shared prefix's cached ones, computed once (the
  // second request with the 8-token prefix finds its two blocks of 4 cached).
  uint64_t prompts = 0;
  for (const EngineRequest& r : requests()) prompts += r.prompt.size();
  EXPECT_EQ(alone.prompt_tokens_computed, prompts - 8);
  std::printf("chunked prefill: %llu prompt tokens computed of %llu; %llu preemptions with 8 blocks\n",
              static_cast<unsigned long long>(together.prompt_tokens_computed),
              static_cast<unsigned long long>(prompts), static_cast<unsigned long long>(tight.preemptions));
}

// A second request sharing a long prompt prefix computes only its suffix and gives
// what it gives on an engine that has seen nothing; with the sharing broken (the
// other request's prefix differs in its first token), it computes it all.
TEST(BatchEngine, ASharedPrefixIsComputedOnceAndChangesNoOutput) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  std::mt19937 rng(3);
  std::vector<int32_t> prefix(90);
  for (int32_t& t : prefix) t = static_cast<int32_t>(rng() % 300);
  EngineRequest first{.prompt = prefix, .max_tokens = 6}, second{.prompt = prefix, .max_tokens = 6};
  first.prompt.insert(first.prompt.end(), {5, 6, 7});
  second.prompt.insert(second.prompt.end(), {8, 9});
  second.sampling = {.temperature = 0.8f, .seed = 9};
  const auto second_after = [&](const EngineRequest& before, uint64_t& computed) {
    std::shared_ptr<Runtime> runtime;
    auto engine = BatchEngine::create(load_batched(p.file, 2, 0, runtime, 16)).value();
    EXPECT_TRUE(engine->submit(before).ok());
    EXPECT_TRUE(engine->run_until_idle().ok());
    const uint64_t start = engine->prompt_tokens_computed();
    const RequestId id = engine->submit(second).value();
    EXPECT_TRUE(engine->run_until_idle().ok());
    computed = engine->prompt_tokens_computed() - start;
    return engine->output(id).value();
  };
  uint64_t shared = 0, unshared = 0;
  EngineRequest other = first;
  other.prompt[0] = (other.prompt[0] + 1) % 300;
  const std::vector<int32_t> with_sharing = second_after(first, shared);
  const std::vector<int32_t> without = second_after(other, unshared);
  EXPECT_EQ(with_sharing, without);
  EXPECT_EQ(shared, second.prompt.size() - 88);  // 22 blocks of 4 positions found
  EXPECT_EQ(unshared, second.prompt.size());
  std::printf("shared prefix: the second request computed %llu of its %zu prompt tokens (%llu unshared)\n",
              static_cast<unsigned long long>(shared), second.prompt.size(), static_cast<unsigned long long>(unshared));

  // A prompt that repeats another request's prompt and output finds only the blocks of
  // prompt tokens: the generated ones were computed by the decode step, in another
  // order than the prefill chunk would compute them as prompt.
  std::shared_ptr<Runtime> runtime;
  auto engine = BatchEngine::create(load_batched(p.file, 2, 0, runtime, 16)).value();
  const EngineRequest before{.prompt = std::vector<int32_t>(prefix.begin(), prefix.begin() + 30), .max_tokens = 20};
  const RequestId b = engine->submit(before).value();
  ASSERT_TRUE(engine->run_until_idle().ok());
  EngineRequest repeat{.prompt = before.prompt, .max_tokens = 2};
  const std::vector<int32_t> said = engine->output(b).value();
  repeat.prompt.insert(repeat.prompt.end(), said.begin(), said.end());
  repeat.prompt.push_back(3);
  const uint64_t start = engine->prompt_tokens_computed();
  ASSERT_TRUE(engine->submit(repeat).ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  EXPECT_EQ(engine->prompt_tokens_computed() - start, repeat.prompt.size() - 28);  // 7 blocks of prompt tokens
}

// Four requests with one 40-token prefix (10 blocks of 4) submitted at once, with
// and without a prefill chunk: the first computes it, the others wait for its blocks
// and compute only their 3-token suffixes; each gets what it gets alone.
TEST(BatchEngine, RequestsSubmittedTogetherComputeTheirSharedPrefixOnce) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  std::mt19937 rng(5);
  std::vector<int32_t> prefix(40);
  for (int32_t& t : prefix) t = static_cast<int32_t>(rng() % 300);
  std::vector<EngineRequest> rs(4);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].prompt = prefix;
    for (int j = 0; j < 3; ++j) rs[i].prompt.push_back(static_cast<int32_t>(rng() % 300));
    rs[i].max_tokens = 5;
    if (i % 2 == 1) rs[i].sampling = {.temperature = 0.9f, .seed = 7 + i};
  }
  for (uint32_t chunk : {0u, 16u}) {
    std::vector<std::vector<int32_t>> alone;
    for (const EngineRequest& r : rs) {
      std::shared_ptr<Runtime> runtime;
      auto engine = BatchEngine::create(load_batched(p.file, 4, 0, runtime, chunk)).value();
      const RequestId id = engine->submit(r).value();
      ASSERT_TRUE(engine->run_until_idle().ok());
      alone.push_back(engine->output(id).value());
    }
    std::shared_ptr<Runtime> runtime;
    auto engine = BatchEngine::create(load_batched(p.file, 4, 0, runtime, chunk)).value();
    std::vector<RequestId> ids;
    for (const EngineRequest& r : rs) ids.push_back(engine->submit(r).value());
    ASSERT_TRUE(engine->run_until_idle().ok());
    for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(engine->output(ids[i]).value(), alone[i]) << "request " << i;
    EXPECT_EQ(engine->prompt_tokens_computed(), 43u + 3 * 3) << "chunk " << chunk;
    EXPECT_EQ(engine->blocks().held_blocks(), 0u);
    std::printf("chunk %u: %llu prompt tokens computed for 4 prompts of 43 sharing 40\n", chunk,
                static_cast<unsigned long long>(engine->prompt_tokens_computed()));
  }
}

TEST(BatchEngine, CancelReleasesBlocksAndBadRequestsAreNamed) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  std::shared_ptr<Runtime> runtime;
  auto engine = BatchEngine::create(load_batched(p.file, 2, 0, runtime)).value();
  const std::vector<EngineRequest> rs = requests();
  const RequestId a = engine->submit(rs[0]).value(), b = engine->submit(rs[5]).value();
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(engine->step().ok());
  ASSERT_EQ(engine->state(a).value(), RequestState::kRunning);
  const uint32_t held = engine->blocks().held_blocks();
  ASSERT_TRUE(engine->cancel(a).ok());
  EXPECT_LT(engine->blocks().held_blocks(), held);
  EXPECT_EQ(engine->state(a).value(), RequestState::kCancelled);
  EXPECT_EQ(engine->cancel(a).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->run_until_idle().ok());
  EXPECT_EQ(engine->state(b).value(), RequestState::kFinished);
  EXPECT_EQ(engine->blocks().held_blocks(), 0u);

  const auto named = [&](EngineRequest r, const char* what) {
    const StatusOr<RequestId> id = engine->submit(std::move(r));
    ASSERT_FALSE(id.ok()) << what;
    EXPECT_NE(id.status().message().find(what), std::string::npos) << id.status().to_string();
  };
  named({}, "prompt is empty");
  named({.prompt = {1, 300}}, "prompt token 1 (300)");
  named({.prompt = {1}, .max_tokens = 0}, "max_tokens 0");
  named({.prompt = std::vector<int32_t>(100, 1), .max_tokens = 40}, "context holds 128");
  named({.prompt = {1}, .sampling = {.top_p = 0.0f}}, "top_p");
  EXPECT_EQ(engine->state(999).status().code(), StatusCode::kNotFound);

  std::shared_ptr<Runtime> plain_runtime = Runtime::create("sim", {.memory_bytes = 256ull << 20}).value();
  std::shared_ptr<Gemma3Model> plain(Gemma3Model::load(p.file, *plain_runtime).value());
  EXPECT_EQ(BatchEngine::create(plain).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace npurt::models
