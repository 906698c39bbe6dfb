// FaultInjector: which operations of a simulated NPU fail on purpose (sim_device.h).
//
// A decision depends only on the plan's seed, the site and the operation's number at
// that site, never on a shared random stream, so threads racing to different sites
// do not change each other's faults. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/faults.h"

namespace npurt::sim {

using hal::FaultPlan;
using hal::FaultSite;
using hal::FaultStats;
using hal::InjectedFault;

class FaultInjector {
 public:
  struct Fault {
    uint64_t id = 0;
    FaultSite site = FaultSite::kKernel;
    uint32_t block = 0;        // launch faults: where
    uint64_t instruction = 0;  // ... and after how many instructions of that block
  };

  Status set_plan(FaultPlan plan);
  // Counts one operation at `site` and says whether it fails. `grid` bounds the block
  // of a launch fault. Cheap (one relaxed load) while no plan is set.
  std::optional<Fault> draw(FaultSite site, uint32_t grid = 1);
  // The error for `fault`, logged with `what` (the failed operation).
  Status error(const Fault& fault, StatusCode code, const std::string& what);

  FaultStats stats() const;
  std::vector<InjectedFault> take_log();

 private:
  std::atomic<bool> active_{false};
  mutable std::mutex mu_;
  FaultPlan plan_;             // guarded by mu_
  FaultStats stats_;           // guarded by mu_
  uint64_t next_id_ = 1;       // guarded by mu_; ids stay unique across plans
  std::vector<InjectedFault> log_;  // guarded by mu_
};

}  // namespace npurt::sim
