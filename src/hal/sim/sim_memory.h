// SimMemory: the simulated NPU's global memory (GM) and who owns which bytes of it.
//
// It owns the host mapping that stands for GM (and, in sanitizer mode, its shadow of
// written bits), and the allocator that hands out device addresses. Everything that
// checks or changes which bytes are live (allocate, free, range checks) goes through
// its one mutex, since the allocator is not thread-safe; the bytes themselves are read
// and written without it, through gm(), by the stream commands and cores that the
// HAL's ordering rules (device.h) keep apart.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

#include "hal/sim/allocator.h"
#include "hal/sim/core.h"
#include "hal/sim/fault_injector.h"
#include "hal/sim/sim_counters.h"
#include "npurt/base/status.h"
#include "npurt/hal/ids.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/image.h"

namespace npurt::sim {

class SimMemory {
 public:
  // Reserves host address space for a device's GM (and its sanitizer shadow, with
  // options.sanitize). The result is handed to a SimMemory, which unmaps it.
  static StatusOr<GlobalMemory> reserve(const hal::SimOptions& options);

  // Takes over `gm` (from reserve).
  SimMemory(const GlobalMemory& gm, SimCounters& counters, FaultInjector& faults);
  ~SimMemory();
  SimMemory(const SimMemory&) = delete;
  SimMemory& operator=(const SimMemory&) = delete;

  // Device::allocate, free, upload_code and host_address.
  StatusOr<hal::DeviceAddr> allocate(uint64_t bytes, uint64_t alignment);
  Status free(hal::DeviceAddr addr);
  Status upload_code(hal::DeviceAddr dst, const isa::Image& image);
  StatusOr<uint8_t*> host_address(hal::DeviceAddr addr, uint64_t bytes, bool writes);

  // kOutOfRange, naming `what`, unless [addr, +bytes) lies inside one live allocation.
  Status check_range(hal::DeviceAddr addr, uint64_t bytes, std::string_view what);
  // The live block containing [addr, +bytes), if any.
  std::optional<GmAllocator::Block> live_block_containing(hal::DeviceAddr addr, uint64_t bytes);

  // GM as the cores and copies see it.
  const GlobalMemory& gm() const { return gm_; }

 private:
  const GlobalMemory gm_;
  SimCounters& counters_;
  FaultInjector& faults_;

  std::mutex mu_;
  GmAllocator alloc_;  // guarded by mu_
};

}  // namespace npurt::sim
