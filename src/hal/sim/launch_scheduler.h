// LaunchScheduler: how the simulated NPU runs one kernel launch on its cores.
//
// It owns the cores (local memory, instruction caches), which of them each launch
// holds, and the host threads that execute them. A launch is checked when enqueued,
// and run later on its stream's thread: bound to the image and argument records it
// finds in GM then (the image may have changed since: that is the hazard the cores
// model), given its cores in core order, its blocks run over the host pool, and its
// faults (real or injected), hangs, counters and trace recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hal/sim/core.h"
#include "hal/sim/core_claims.h"
#include "hal/sim/fault_injector.h"
#include "hal/sim/host_pool.h"
#include "hal/sim/sim_counters.h"
#include "hal/sim/sim_memory.h"
#include "npurt/base/status.h"
#include "npurt/hal/device.h"
#include "npurt/hal/ids.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::sim {

// The stream a launch runs on, as far as the launch is concerned.
struct LaunchStream {
  hal::StreamId id;
  // True until the stream's first launch, which invalidates its cores' instruction
  // caches and clears it.
  bool& fresh;
  // This launch's abort flag, which the stream's owner registered for abort_stream to
  // set; the launch sets it too when a block faults.
  std::atomic<bool>& abort;
  // Whether abort_stream was called on the stream.
  const std::atomic<bool>& abort_requested;
};

class LaunchScheduler {
 public:
  LaunchScheduler(const hal::SimOptions& options, SimMemory& memory, SimCounters& counters, FaultInjector& faults);
  LaunchScheduler(const LaunchScheduler&) = delete;
  LaunchScheduler& operator=(const LaunchScheduler&) = delete;

  // The checks Device::launch makes before enqueueing: the grid, the argument count,
  // and that the image header and every buffer lie inside live allocations.
  Status check(const hal::LaunchParams& p);

  // Runs the launch to its end on the calling (stream) thread; `name` gets the
  // kernel's name once known (for the stream's trace).
  Status run(const hal::LaunchParams& p, const LaunchStream& s, std::string& name);

  // Wakes launches waiting for cores, to look at their abort flags again.
  void wake_core_waiters() { core_claims_.wake(); }

 private:
  static uint32_t pool_workers(const hal::SimOptions& o);

  // Binds a launch to the image header and argument records it finds in GM.
  Status bind(const hal::LaunchParams& p, LaunchContext& ctx, std::string& name);

  const hal::SimOptions opts_;
  SimMemory& memory_;
  SimCounters& counters_;
  FaultInjector& faults_;

  std::vector<std::unique_ptr<Core>> cores_;
  CoreClaims core_claims_;
  HostPool pool_;
};

}  // namespace npurt::sim
