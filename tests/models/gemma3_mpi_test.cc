// Tensor-parallel Gemma-3 over MPI (run under mpirun, one simulated NPU per rank)
// against the same model on one device, which every rank also runs: the same greedy
// tokens for 32 steps on three prompts and logits within rel-L2 1e-5, through batched
// prefill and decode; on the synthetic model and (with NPURT_MODEL) the real file.
#include <gtest/gtest.h>
#include <mpi.h>

#include <random>

#include "models/real_model.h"
#include "models/synthetic_gemma3.h"
#include "npurt/base/math.h"
#include "npurt/comm/mpi.h"
#include "npurt/models/gemma3_model.h"

namespace npurt::models {
namespace {

using isa::DType;

// As in gemma3_parallel_test.cc: four query heads over one KV head, column-cut
// projections in 32-element blocks.
SyntheticGemma3 parallel_model() {
  SyntheticGemma3 m;
  m.hidden = 256;
  m.ffn = 1024;
  m.heads = 4;
  m.kv_heads = 1;
  m.head_dim = 64;
  m.vocab = 400;
  m.sliding_window = 8;
  m.global_period = 2;
  m.context = 128;
  auto t = [](int l, const char* what) { return gemma3_block_tensor(l, what); };
  m.dtype = {{"token_embd.weight", DType::kQ8_0}, {"output.weight", DType::kQ6_K},
             {t(0, "attn_q"), DType::kQ4_K},     {t(0, "attn_output"), DType::kQ8_0},
             {t(0, "ffn_down"), DType::kQ6_K},   {t(1, "attn_output"), DType::kQ5_0},
             {t(1, "ffn_gate"), DType::kQ4_0},   {t(1, "ffn_down"), DType::kQ4_K}};
  return m;
}

struct Run {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::string error;
};

Run greedy(Gemma3Model& m, const std::vector<int32_t>& prompt, int n) {
  Run r;
  auto fail = [&](const Status& s) {
    r.error = s.to_string();
    return r;
  };
  if (Status s = m.reset(); !s.ok()) return fail(s);
  StatusOr<int32_t> next = m.prefill(prompt);
  for (int i = 0; i < n; ++i) {
    if (!next.ok()) return fail(next.status());
    auto logits = m.logits();  // a collective over the ranks
    if (!logits.ok()) return fail(logits.status());
    r.tokens.push_back(*next);
    r.logits.push_back(std::move(logits).value());
    if (i + 1 < n) next = m.step(*next);
  }
  return r;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The model split over the job's ranks, one device each.
std::unique_ptr<Gemma3Model> load_over_mpi(const GgufFile& file, const Gemma3Options& o) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto sim = gemma3_sim_options(file, 2, o, size);
  EXPECT_TRUE(sim.ok());
  sim->host_threads = 1;
  auto runtime = Runtime::create_sim(*sim);
  EXPECT_TRUE(runtime.ok());
  auto c = comm::MpiCommunicator::create(*runtime);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto m = Gemma3Model::load_parallel(file, {*c}, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

void expect_same(const Run& one, const Run& many, const std::string& what) {
  ASSERT_TRUE(one.error.empty()) << one.error;
  ASSERT_TRUE(many.error.empty()) << many.error;
  EXPECT_EQ(many.tokens, one.tokens) << what;
  double worst = 0;
  for (size_t i = 0; i < one.logits.size() && i < many.logits.size(); ++i) {
    worst = std::max(worst, rel_l2(many.logits[i], one.logits[i]));
  }
  EXPECT_LE(worst, 1e-5) << what;
  if (world_rank() == 0) {
    std::printf("  over MPI, %s: %zu tokens equal, worst logits rel-L2 %.2e\n", what.c_str(), one.tokens.size(), worst);
  }
}

TEST(Gemma3OverMpi, SyntheticMatchesOneDeviceFor32Tokens) {
  const std::vector<uint8_t> bytes = synthetic_gemma3(parallel_model());
  auto file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok());
  Gemma3Options o;
  o.prefill_chunk = 16;
  auto one = Gemma3Model::load_sim(*file, 2, o);
  ASSERT_TRUE(one.ok());
  auto many = load_over_mpi(*file, o);
  ASSERT_TRUE(many);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> id(0, 399);
  for (size_t len : {1u, 7u, 20u}) {
    std::vector<int32_t> prompt(len);
    for (int32_t& t : prompt) t = id(rng);
    expect_same(greedy(**one, prompt, 32), greedy(*many, prompt, 32), "synthetic, prompt of " + std::to_string(len));
  }
}

TEST(Gemma3OverMpi, RealFileMatchesOneDeviceFor32Tokens) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  auto real = open_real_model(path);
  ASSERT_TRUE(real.ok());
  Gemma3Options o;
  o.max_context = 128;
  o.prefill_chunk = 32;
  auto one = Gemma3Model::load_sim(real->file, 2, o);
  ASSERT_TRUE(one.ok());
  auto many = load_over_mpi(real->file, o);
  ASSERT_TRUE(many);
  for (const char* text : {"The capital of France is", "def fibonacci(n):", "Once upon a time"}) {
    auto prompt = real->tokenizer.encode(text);
    ASSERT_TRUE(prompt.ok());
    expect_same(greedy(**one, *prompt, 32), greedy(*many, *prompt, 32), std::string("'") + text + "'");
  }
}

}  // namespace
}  // namespace npurt::models

// Every rank runs the same tests and returns nonzero when any rank failed.
int main(int argc, char** argv) {
  auto session = npurt::comm::mpi_init(argc, argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().to_string().c_str());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failed;
}
