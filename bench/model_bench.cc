// Gemma-3 decoding on the simulated NPU against its bandwidth floor, measured in the
// same run: each decode step reads every weight once, so tokens/s can be at most
// (DRAM read bandwidth) / (weight bytes per token). Prints model load time, prefill
// and decode tokens/s (medians) and decode as a fraction of that floor.
//
//   npurt_model_bench [--model PATH] [--tokens N] [--reps R] [--cores C]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "memory_peers.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/tokenizer.h"

namespace {

using namespace npurt;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <typename T>
T or_die(StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "model_bench: %s: %s\n", what, v.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

std::unique_ptr<models::SimGemma3> load(const models::GgufFile& file, uint32_t cores, uint32_t context) {
  return or_die(models::SimGemma3::load(file, cores, {.max_context = context}), "load");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::getenv("NPURT_MODEL") ? std::getenv("NPURT_MODEL") : "models/gemma-3-270m-q4_k_m.gguf";
  int tokens = 64, reps = 5, cores = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--cores")) cores = std::atoi(argv[i + 1]);
  }
  if (!std::filesystem::is_regular_file(path)) {
    std::fprintf(stderr, "model_bench: no model at %s (run `make model` or pass --model)\n", path.c_str());
    return 1;
  }
  if (tokens < 2 || reps < 1 || cores < 1) {
    std::fprintf(stderr, "model_bench: --tokens must be >= 2, --reps and --cores >= 1\n");
    return 1;
  }
  models::GgufFile file = or_die(models::GgufFile::open(path), "open");
  models::Tokenizer tok = or_die(models::Tokenizer::from_gguf(file), "tokenizer");
  const std::vector<int32_t> prompt = or_die(
      tok.encode("Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night."),
      "encode");

  std::vector<double> load_s;
  for (int r = 0; r < 3; ++r) {
    const auto t = Clock::now();
    auto sim = load(file, static_cast<uint32_t>(cores), static_cast<uint32_t>(prompt.size() + tokens));
    load_s.push_back(seconds_since(t));
  }
  auto sim = load(file, static_cast<uint32_t>(cores), static_cast<uint32_t>(prompt.size() + tokens));
  models::Gemma3Model& model = sim->model();

  // Decode runs and DRAM reads alternate, so both see the same machine state.
  bench::StreamRead read;
  std::vector<double> prefill_tps, decode_tps, read_gbs;
  for (int r = 0; r < reps; ++r) {
    const auto t = Clock::now();
    volatile uint64_t sink = read.run();
    (void)sink;
    read_gbs.push_back(read.bytes() / seconds_since(t) / 1e9);
    models::GenerateStats st;
    or_die(models::generate(model, prompt, tokens, nullptr, {}, &st), "generate");
    prefill_tps.push_back(st.prompt_tokens / st.prefill_seconds);
    decode_tps.push_back(st.decode_steps / st.decode_seconds);
  }
  const double bytes = static_cast<double>(model.weight_bytes_per_step());
  const double floor_tps = median(read_gbs) * 1e9 / bytes;
  const double decode = median(decode_tps);
  std::printf("Gemma-3 on the simulated NPU (%s, %d cores), %d repetitions, medians\n", path.c_str(), cores, reps);
  std::printf("  weights read per token      %10.1f MB\n", bytes / 1e6);
  std::printf("  launches per token          %10zu\n", model.launches_per_step());
  std::printf("  model load (file->device)   %10.2f s\n", median(load_s));
  std::printf("  prefill (%zu tokens)         %10.1f tokens/s\n", prompt.size(), median(prefill_tps));
  std::printf("  decode (%d tokens)           %10.1f tokens/s\n", tokens - 1, decode);
  std::printf("  DRAM read (4 streams/thread) %9.1f GB/s\n", median(read_gbs));
  std::printf("  bandwidth floor              %9.1f tokens/s\n", floor_tps);
  std::printf("  decode / floor               %9.2f   (target >= 0.60)\n", decode / floor_tps);
  return 0;
}
