// Fault injection: a device misbehaves on purpose, so that tests and `npurt soak` can
// show the layers above survive it. A driver offers it where its devices can
// (DriverCapabilities::fault_injection; the simulated NPU does): Device::set_fault_plan,
// fault_stats and take_fault_log, which other devices answer with kUnimplemented.
//
// Off unless a plan is set; a plan is seeded and reproducible: whether the n-th
// operation at a site fails depends only on the seed, the site and n (so runs that
// issue their operations in the same order inject the same faults). Every injected
// fault gets an id, and its error says "injected fault #<id>" so a caller can tell
// which faults reached it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace npurt::hal {

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

}  // namespace npurt::hal
