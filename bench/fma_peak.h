// The machine's single-core f32 FMA peak, measured once per process with the same
// vector implementation the simulator's tile kernels use: the physical limit that
// tile matrix multiply throughput is reported against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ctime>

#include "hal/sim/tile_kernels.h"

namespace npurt::bench {

// CPU time of the calling thread alone: the process's (std::clock) also counts the
// simulator's host threads, which spin while a device is alive and would halve the peak.
inline double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Best of several timed runs of register-only FMAs. Timed in the thread's CPU time, so
// that time it spends descheduled on a shared machine does not count.
inline double measure_fma_peak_gflops() {
  sim::tile_kernels_fma_probe(1 << 20);  // let the clock and vector units settle
  double best = 0.0;
  for (int run = 0; run < 5; ++run) {
    const double start = thread_cpu_seconds();
    const uint64_t flops = sim::tile_kernels_fma_probe(1 << 22);
    const double seconds = thread_cpu_seconds() - start;
    if (seconds > 0.0) best = std::max(best, static_cast<double>(flops) / seconds * 1e-9);
  }
  return best;
}

inline double fma_peak_gflops() {
  static const double peak = measure_fma_peak_gflops();
  return peak;
}

}  // namespace npurt::bench
