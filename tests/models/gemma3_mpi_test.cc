// Tensor-parallel Gemma-3 over MPI (run under mpirun, one simulated NPU per rank)
// against the same model on one device, which every rank also runs: the same greedy
// tokens for 32 steps on three prompts and logits within rel-L2 kRunsAgree (real_model.h), through batched
// prefill and decode; on the synthetic model and (with NPURT_MODEL) the real file.
#include <gtest/gtest.h>
#include <mpi.h>

#include <random>

#include "models/real_model.h"
#include "comm/mpi_gtest.h"
#include "models/parallel_rig.h"
#include "models/synthetic_gemma3.h"
#include "npurt/base/math.h"
#include "npurt/comm/mpi.h"
#include "npurt/models/gemma3_model.h"

namespace npurt::models {
namespace {

using isa::DType;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The model split over the job's ranks, one device each.
std::unique_ptr<Gemma3Model> load_over_mpi(const GgufFile& file, const Gemma3Options& o) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto sim = gemma3_device_spec(file, 2, o, size);
  EXPECT_TRUE(sim.ok());
  sim->settings["host_threads"] = "1";
  auto runtime = Runtime::create("sim", *sim);
  EXPECT_TRUE(runtime.ok());
  auto c = comm::MpiCommunicator::create(*runtime);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto m = Gemma3Model::load_parallel(file, {*c}, o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

void expect_same(const GreedyRun& one, const GreedyRun& many, const std::string& what) {
  expect_same_run(one, many, "over MPI, " + what, world_rank() == 0);
}

TEST(Gemma3OverMpi, SyntheticMatchesOneDeviceFor32Tokens) {
  const std::vector<uint8_t> bytes = synthetic_gemma3(parallel_model());
  auto file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok());
  Gemma3Options o;
  o.prefill_chunk = 16;
  auto one = Gemma3Model::load_on(*file, "sim", 2, o);
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
  auto one = Gemma3Model::load_on(real->file, "sim", 2, o);
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

int main(int argc, char** argv) { return npurt::testing::run_tests_on_every_rank(argc, argv); }
