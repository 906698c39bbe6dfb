#include "npurt/hal/device.h"

#include <cstring>

namespace npurt::hal {

KernelArg KernelArg::scalar_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return {true, DeviceAddr{}, 0, bits};
}

std::string_view fault_site_name(FaultSite site) {
  switch (site) {
    case FaultSite::kCopyToDevice: return "copy to device";
    case FaultSite::kCopyToHost: return "copy to host";
    case FaultSite::kKernel: return "kernel fault";
    case FaultSite::kKernelHang: return "kernel hang";
    case FaultSite::kCreateStream: return "create stream";
    case FaultSite::kDestroyStream: return "destroy stream";
    case FaultSite::kRecordEvent: return "record event";
    case FaultSite::kAllocate: return "allocate";
  }
  return "unknown fault site";
}

namespace {
Status no_faults(const Device& device) {
  return unimplemented("fault injection: device '" + device.info().name + "' does not inject faults");
}
}  // namespace

StatusOr<uint8_t*> Device::host_address(DeviceAddr, uint64_t, bool) {
  return unimplemented("host_address: the memory of device '" + info().name + "' is not host-addressable");
}

StatusOr<uint64_t> Device::stream_position(StreamId) {
  return unimplemented("stream_position: device '" + info().name + "' does not count its streams' commands");
}
StatusOr<bool> Device::run_next_command(StreamId, const std::function<bool(uint64_t)>&) { return false; }

Status Device::set_fault_plan(FaultPlan) { return no_faults(*this); }
StatusOr<FaultStats> Device::fault_stats() const { return no_faults(*this); }
StatusOr<std::vector<InjectedFault>> Device::take_fault_log() { return no_faults(*this); }

}  // namespace npurt::hal
