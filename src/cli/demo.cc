// `npurt demo`: the main job until a model runs.
#include <cstdio>

#include "cli/demo_kernels.h"
#include "npurt/runtime/runtime.h"

namespace npurt::cli {

int run_demo(uint32_t cores, bool sanitize, uint32_t seed) {
  hal::DeviceSpec spec{.cores = cores};
  if (sanitize) spec.settings["sanitize"] = "1";
  StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::create("sim", spec);
  if (!runtime.ok()) {
    std::fprintf(stderr, "npurt demo: %s\n", runtime.status().to_string().c_str());
    return 1;
  }
  const auto& info = (*runtime)->device().info();
  std::printf("device: %s, %u cores, %u KiB local memory/core, icache %u sets x %u ways x %u B, "
              "%s%s\n\n",
              info.name.c_str(), info.num_cores, info.local_memory_bytes >> 10, info.icache_sets,
              info.icache_ways, info.icache_line_bytes, info.details.c_str(),
              sanitize ? ", sanitizer on" : "");
  auto results = run_demo_kernels(**runtime, seed);
  if (!results.ok()) {
    std::fprintf(stderr, "npurt demo: %s\n", results.status().to_string().c_str());
    return 1;
  }
  std::printf("%-22s %-26s %10s %10s %12s %8s  %s\n", "kernel", "shape", "rel-L2", "limit", "launch us",
              "code B", "check");
  bool all_ok = true;
  for (const DemoResult& r : *results) {
    const bool ok = r.rel_l2 <= r.tolerance;
    all_ok = all_ok && ok;
    std::printf("%-22s %-26s %10.2e %10.0e %12.1f %8u  %s\n", r.name.c_str(), r.shape.c_str(), r.rel_l2,
                r.tolerance, r.launch_us, r.code_bytes, ok ? "ok" : "FAILED");
  }
  std::printf("\ndevice counters:\n%s", (*runtime)->device().counters().to_string().c_str());
  std::printf("\n%s\n", all_ok ? "all kernels match their host references" : "SOME KERNELS FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace npurt::cli
