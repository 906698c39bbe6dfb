// `npurt generate`: its arguments and entry point.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npurt/models/gemma3_model.h"
#include "npurt/models/sampler.h"

namespace npurt::cli {

struct GenerateArgs {
  std::string model;  // empty: default_model_path()
  std::string prompt = "The capital of France is";
  int max_tokens = 32;
  std::string device = "sim";  // a driver (hal/driver.h; sim: the simulated NPU) or host (the f32 host oracle)
  uint32_t cores = 8;
  uint32_t prefill_chunk = models::Gemma3Options::kDefaultPrefillChunk;
  std::string kv_cache = "f32";  // the KV cache's element type: f32, f16 or bf16
  int devices = 1;             // simulated NPUs in this process, the model split over them
  int tp = 0;                  // > 0: one device per MPI rank, tp ranks (run under mpirun)
  uint64_t device_memory = 0;  // MiB of global memory per device; 0: sized for its shard
  int64_t collective_timeout_ms = 60'000;  // how long a collective waits for its peers
  // Draft tokens verified per step (prompt lookup; 0: one token per step). Taken on
  // one simulated NPU only (elsewhere the default means 0); speculate_set says it was
  // asked for explicitly. On by default: measured never slower than plain decoding
  // (docs/models.md, "Speculative decoding").
  int speculate = kDefaultSpeculate;
  bool speculate_set = false;
  models::SamplingParams sampling;  // greedy unless told otherwise
  std::vector<std::string> stop;    // stop strings
  static constexpr int kDefaultSpeculate = models::GenerateOptions::kDefaultSpeculate;
};

// $NPURT_MODEL when set, else where `make model` installs the file.
std::string default_model_path();

int run_generate(const GenerateArgs& args);

}  // namespace npurt::cli
