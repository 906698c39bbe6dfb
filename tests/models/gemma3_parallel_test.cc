// Tensor-parallel Gemma-3 over an in-process device group against the same model on
// one device: the same greedy tokens and logits within rel-L2 kRunsAgree (real_model.h), for decode and for
// batched prefill, on a synthetic model and (with NPURT_MODEL) the real file; and a
// model that does not fit one device but fits several.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "models/gemma3_shard.h"
#include "models/real_model.h"
#include "models/parallel_rig.h"
#include "models/synthetic_gemma3.h"
#include "npurt/base/math.h"
#include "npurt/comm/device_group.h"
#include "npurt/models/gemma3_model.h"

namespace npurt::models {
namespace {

using isa::DType;

const hal::DeviceSpec kSim{.cores = 2, .memory_bytes = 128ull << 20, .settings = {{"host_threads", "1"}}};

std::unique_ptr<Gemma3Model> load_parallel(const GgufFile& file, const std::shared_ptr<comm::DeviceGroup>& group,
                                           Gemma3Options o = {}) {
  std::vector<std::shared_ptr<comm::Communicator>> ranks;
  for (int r = 0; r < group->size(); ++r) ranks.push_back(group->communicator(r));
  auto m = Gemma3Model::load_parallel(file, ranks, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<std::vector<int32_t>> three_prompts(int32_t vocab) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t len : {1u, 5u, 13u}) {
    std::vector<int32_t> p(len);
    for (int32_t& t : p) t = id(rng);
    prompts.push_back(p);
  }
  return prompts;
}

class ParallelGemma3 : public ::testing::TestWithParam<int> {};

TEST_P(ParallelGemma3, SyntheticMatchesOneDeviceFor32Tokens) {
  const int n = GetParam();
  Parsed p = parse(synthetic_gemma3(parallel_model()));
  auto one = Gemma3Model::load_on(p.file, "sim", 2);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto group = comm::DeviceGroup::create("sim", n, kSim);
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  auto many = load_parallel(p.file, *group);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->devices(), n);
  for (const auto& prompt : three_prompts(400)) {
    expect_same_run(greedy(**one, prompt, 32), greedy(*many, prompt, 32),
                    std::to_string(n) + " devices, batched prefill of " + std::to_string(prompt.size()));
  }
  ASSERT_TRUE(many->set_prefill_chunk(0).ok());
  ASSERT_TRUE((*one)->set_prefill_chunk(0).ok());
  const auto prompt = three_prompts(400)[2];
  expect_same_run(greedy(**one, prompt, 8), greedy(*many, prompt, 8), std::to_string(n) + " devices, token by token");
}

INSTANTIATE_TEST_SUITE_P(Devices, ParallelGemma3, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "devices"; });

// Each device holds only its shards: its weight bytes per step are about 1/N of one
// device's (norms and the replicated key/value head excepted).
TEST(ParallelGemma3Memory, EachDeviceHoldsItsShards) {
  Parsed p = parse(synthetic_gemma3(parallel_model()));
  auto one = Gemma3Model::load_on(p.file, "sim", 2);
  ASSERT_TRUE(one.ok());
  for (int n : {2, 4}) {
    auto group = comm::DeviceGroup::create("sim", n, kSim);
    ASSERT_TRUE(group.ok());
    auto many = load_parallel(p.file, *group);
    ASSERT_TRUE(many);
    const double share = static_cast<double>(many->weight_bytes_per_step()) / (*one)->weight_bytes_per_step();
    EXPECT_LT(share, 1.0 / n + 0.15) << n << " devices";
    EXPECT_GT(share, 1.0 / n - 0.01) << n << " devices";
  }
}

TEST(ParallelGemma3Memory, AModelTooBigForOneDeviceFitsOnFour) {
  Parsed p = parse(synthetic_gemma3(parallel_model()));
  Gemma3Options o;
  o.max_context = 128;
  o.prefill_chunk = 16;
  // Enough for a quarter of the model, and less than the whole.
  hal::DeviceSpec small = kSim;
  small.memory_bytes = 2u << 20;
  auto alone = Runtime::create("sim", small);
  ASSERT_TRUE(alone.ok());
  auto failed = Gemma3Model::load(p.file, **alone, o);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(failed.status().message().find("MiB of device memory"), std::string::npos) << failed.status().to_string();
  EXPECT_NE(failed.status().message().find("the device has 2 MiB"), std::string::npos) << failed.status().to_string();
  auto group = comm::DeviceGroup::create("sim", 4, small, {}, {.chunk_bytes = 16 << 10});
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  auto many = load_parallel(p.file, *group, o);
  ASSERT_TRUE(many);
  auto next = many->prefill(std::vector<int32_t>{1, 2, 3});
  ASSERT_TRUE(next.ok()) << next.status().to_string();
}

TEST(ParallelGemma3Errors, AModelThatDoesNotSplitIsRefusedByName) {
  SyntheticGemma3 m = parallel_model();
  m.heads = 2;
  m.head_dim = 128;
  Parsed p = parse(synthetic_gemma3(m));
  auto group = comm::DeviceGroup::create("sim", 4, kSim);
  ASSERT_TRUE(group.ok());
  std::vector<std::shared_ptr<comm::Communicator>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back((*group)->communicator(r));
  auto failed = Gemma3Model::load_parallel(p.file, ranks);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("the query heads (2) cannot be split over 4 devices"), std::string::npos)
      << failed.status().to_string();
}

TEST(ParallelGemma3Real, MatchesOneDeviceOnTheRealFile) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  auto real = open_real_model(path);
  ASSERT_TRUE(real.ok()) << real.status().to_string();
  Gemma3Options o;
  o.max_context = 256;
  o.prefill_chunk = 64;
  auto one = Gemma3Model::load_on(real->file, "sim", 2, o);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  const char* texts[] = {"The capital of France is", "def fibonacci(n):", "Once upon a time"};
  for (int n : {2, 4}) {
    auto sim = gemma3_device_spec(real->file, 2, o, n);
    ASSERT_TRUE(sim.ok());
    sim->settings["host_threads"] = "1";
    auto group = comm::DeviceGroup::create("sim", n, *sim);
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    auto many = load_parallel(real->file, *group, o);
    ASSERT_TRUE(many);
    for (const char* text : texts) {
      auto prompt = real->tokenizer.encode(text);
      ASSERT_TRUE(prompt.ok());
      expect_same_run(greedy(**one, *prompt, 32), greedy(*many, *prompt, 32),
                      std::to_string(n) + " devices, '" + text + "'");
    }
  }
}

}  // namespace
}  // namespace npurt::models
