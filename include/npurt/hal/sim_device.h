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

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "npurt/hal/device.h"

namespace npurt::hal {

struct SimOptions {
  uint32_t num_cores = 8;
  uint64_t global_memory_bytes = 1ull << 30;  // reserved lazily: untouched pages cost nothing
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

// ---- fault injection ----
// The simulated NPU can misbehave on purpose, so that tests and `npurt soak` can show
// the runtime survives it. Off unless a plan is set; a plan is seeded and
// reproducible: whether the n-th operation at a site fails depends only on the seed,
// the site and n (so runs that issue their operations in the same order inject the
// same faults). Every injected fault gets an id, and its error says
// "injected fault #<id>" so a caller can tell which faults reached it.
enum class FaultSite : uint8_t {
  kCopyToDevice,   // an executing host-to-device copy fails; garbage lands in the destination
  kCopyToHost,     // an executing device-to-host copy fails; garbage lands in the host buffer
  kKernel,         // an executing launch faults at a block and instruction; garbage in its outputs
  kKernelHang,     // an executing launch spins at a block and instruction until its stream is aborted
  kCreateStream,   // create_stream returns an error
  kDestroyStream,  // destroy_stream returns an error; the stream stays alive (retry it)
  kRecordEvent,    // record_event returns an error; nothing is enqueued
  kAllocate,       // allocate returns kResourceExhausted
};
inline constexpr size_t kFaultSiteCount = 8;
std::string_view fault_site_name(FaultSite site);

struct ScriptedFault {
  FaultSite site = FaultSite::kKernel;
  uint64_t nth = 1;  // the n-th operation at `site` since the plan was set (from 1)
  // Launch faults only: the block and the instruction count (within that block) at
  // which it faults or hangs. A block the grid does not have means block 0; a block
  // shorter than `instruction` faults at its end.
  uint32_t block = 0;
  uint64_t instruction = 0;
};

struct FaultPlan {
  uint64_t seed = 1;
  // The probability that one operation at each site fails, indexed by FaultSite. Rate
  // faults at launches pick block and instruction from the seed too.
  std::array<double, kFaultSiteCount> rate{};
  std::vector<ScriptedFault> script;

  FaultPlan& with_rate(FaultSite site, double r) {
    rate[static_cast<size_t>(site)] = r;
    return *this;
  }
  FaultPlan& fail(ScriptedFault f) {
    script.push_back(f);
    return *this;
  }
};

struct InjectedFault {
  uint64_t id = 0;
  FaultSite site = FaultSite::kKernel;
  std::string what;  // the operation, as its error names it
};

struct FaultStats {
  std::array<uint64_t, kFaultSiteCount> operations{};  // seen at each site under the plan
  std::array<uint64_t, kFaultSiteCount> injected{};
};

// Replaces the device's plan (an empty FaultPlan turns injection off) and restarts the
// per-site operation counts. kInvalidArgument when `device` is not a simulated NPU, a
// rate is outside [0, 1] or a scripted fault has nth 0.
Status set_sim_faults(Device& device, FaultPlan plan);
StatusOr<FaultStats> sim_fault_stats(const Device& device);
// The faults injected since the last call, oldest first.
StatusOr<std::vector<InjectedFault>> take_sim_fault_log(Device& device);

}  // namespace npurt::hal
