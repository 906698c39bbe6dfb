// The machine's single-core f32 FMA peak, measured once per process with the same
// vector implementation the simulator's tile kernels use: the physical limit that
// tile matrix multiply throughput is reported against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ctime>

#include "hal/sim/tile_kernels.h"

namespace npurt::bench {

// Best of several timed runs of register-only FMAs. Timed in CPU time, so that time
// the process spends descheduled on a shared machine does not count.
inline double measure_fma_peak_gflops() {
  sim::tile_kernels_fma_probe(1 << 20);  // let the clock and vector units settle
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    const std::clock_t start = std::clock();
    const uint64_t flops = sim::tile_kernels_fma_probe(1 << 22);
    const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
    if (seconds > 0.0) best = std::max(best, static_cast<double>(flops) / seconds * 1e-9);
  }
  return best;
}

inline double fma_peak_gflops() {
  static const double peak = measure_fma_peak_gflops();
  return peak;
}

}  // namespace npurt::bench
