// `npurt batch`: many prompts decoded together by the batching engine, one JSON line
// per prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npurt/models/sampler.h"

namespace npurt::cli {

struct BatchArgs {
  std::string model;    // empty: default_model_path()
  std::string prompts;  // a file of one prompt a line; "-": standard input
  int parallel = 8;     // sequences decoded together (the compiled batch)
  int max_tokens = 32;
  std::string device = "sim";  // a device driver by name (hal/driver.h)
  uint32_t cores = 8;
  uint32_t prefill_chunk = 64;  // prompt tokens per paged prefill call; 0: one per decode step
  models::SamplingParams sampling;  // greedy unless told otherwise; every prompt alike
  std::vector<std::string> stop;    // stop strings
};

int run_batch(const BatchArgs& args);

}  // namespace npurt::cli
