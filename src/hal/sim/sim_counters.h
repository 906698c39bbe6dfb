// SimCounters: the simulated NPU's counters (hal::Counters), one set per device.
//
// The device's memory, stream queues and launch scheduler each count their own work
// here; one mutex keeps every update (often several fields at once) whole, so
// Device::counters() never sees half of one.
#pragma once

#include <mutex>
#include <string>

#include "hal/sim/fault_injector.h"
#include "npurt/base/status.h"
#include "npurt/hal/counters.h"

namespace npurt::sim {

class SimCounters {
 public:
  // Applies `f` to the counters, under the mutex.
  template <typename F>
  void bump(F f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(counters_);
  }

  hal::Counters snapshot() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  mutable std::mutex mu_;
  hal::Counters counters_;  // guarded by mu_
};

// An injected fault's error, counted.
inline Status injected_error(SimCounters& counters, FaultInjector& faults, const FaultInjector::Fault& f,
                             StatusCode code, const std::string& what) {
  counters.bump([](hal::Counters& c) { ++c.faults_injected; });
  return faults.error(f, code, what);
}

}  // namespace npurt::sim
