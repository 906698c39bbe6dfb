// The simulated NPU: npurt's embedded default device.
//
// A deterministic in-process model that behaves like hardware where the hazards
// live (see docs/architecture.md, "The simulated NPU"):
//   * global memory is a private address space reachable only through the Device
//     interface's copy commands; the allocator recycles freed blocks best fit, most
//     recently freed first;
//   * N logical cores, each with local memory and an instruction cache of the given
//     geometry, executed by a pool of host threads;
//   * streams are FIFO queues drained asynchronously by their own host thread;
//   * the only instruction-cache invalidation is the first launch on a freshly
//     created stream (for the cores that launch uses);
//   * sanitizer mode (fixed at creation) reports stale instruction fetches and reads
//     of never-written GM as kHazard kernel errors; bounds checks are always on.
#pragma once

#include <cstdint>
#include <memory>

#include "npurt/hal/device.h"

namespace npurt::hal {

struct SimOptions {
  uint32_t num_cores = 8;
  uint64_t global_memory_bytes = 1ull << 30;  // reserved lazily; an allocation commits its pages
  uint32_t local_memory_bytes = 256u << 10;   // per core
  uint32_t icache_line_bytes = 64;            // power of two, multiple of 16
  uint32_t icache_sets = 64;                  // power of two
  uint32_t icache_ways = 4;
  uint32_t host_threads = 0;  // threads executing cores; 0 = hardware concurrency
  bool sanitize = false;
};

// Validates the options (each bad field is named) and creates the device. It is shared:
// every object that uses it (hal/handles.h, the memory context, the code registry,
// streams) keeps it alive.
StatusOr<std::shared_ptr<Device>> create_sim_device(const SimOptions& options = {});

}  // namespace npurt::hal
