// The kernels `npurt demo` compiles, each with its host reference. They double as
// smoke tests of the whole stack (builder, verifier, upload, launch, read back).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npurt/runtime/runtime.h"

namespace npurt::cli {

struct DemoResult {
  std::string name;
  std::string shape;
  double rel_l2 = 0;     // ||out - ref|| / ||ref||
  double tolerance = 0;  // what this kernel must meet
  double launch_us = 0;  // median submit -> complete, warm
  uint32_t code_bytes = 0;
};

// Runs every demo kernel on `device`; the first error aborts the demo.
StatusOr<std::vector<DemoResult>> run_demo_kernels(Runtime& runtime, uint32_t seed);

}  // namespace npurt::cli
