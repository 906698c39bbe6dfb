// DeviceGroup: several devices driven by one process, with an in-process communicator
// per device.
//
//   auto group = comm::DeviceGroup::create("sim", 4, {.cores = 2});
//   for (int r = 0; r < 4; ++r) (*group)->runtime(r).memory()...;
//   (*group)->communicator(r)->all_reduce(stream_r, view_r, isa::DType::kF32);
//
// Each device has its own global memory, cores and streams (a Runtime). Collectives
// move bytes between devices as peer copies on the devices' streams (hal/device.h:
// copy_to_peer) and sum on the devices (an elementwise kernel, ranks added in rank
// order, so every device ends with the same bits). Ranks meet on their streams'
// threads, never on the calling thread: one host thread may enqueue rank 0's
// collective, then rank 1's.
//
// A group keeps its runtimes alive; its communicators keep the group alive.
#pragma once

#include <memory>
#include <vector>

#include "npurt/comm/communicator.h"
#include "npurt/runtime/runtime.h"

namespace npurt::comm {

namespace group_detail {
struct GroupState;
}

class DeviceGroup {
 public:
  // A group over `runtimes` (at least one; every pair of devices must reach each
  // other: hal::Device::can_access_peer).
  static StatusOr<std::shared_ptr<DeviceGroup>> create(std::vector<std::shared_ptr<Runtime>> runtimes,
                                                       CommOptions options = {});
  // `devices` devices the driver named `driver` makes for `spec` (hal/driver.h), each
  // in a runtime of its own.
  static StatusOr<std::shared_ptr<DeviceGroup>> create(std::string_view driver, int devices,
                                                       const hal::DeviceSpec& spec = {}, RuntimeOptions runtime = {},
                                                       CommOptions options = {});

  int size() const;
  Runtime& runtime(int rank) const;
  const std::shared_ptr<Runtime>& shared_runtime(int rank) const;
  std::shared_ptr<Communicator> communicator(int rank) const;
  // Closes every runtime (Runtime::close); collectives fail afterwards.
  void close();
  // Hazard::kCollectivesSkipOrdering (base/hazards.h) is the wrong policy tests use:
  // collectives stop waiting for the work already on their stream (a peer copy reads
  // the bytes before the kernel that writes them ran).

 private:
  explicit DeviceGroup(std::shared_ptr<group_detail::GroupState> state);
  std::shared_ptr<group_detail::GroupState> state_;
  std::vector<std::shared_ptr<Communicator>> communicators_;
};

}  // namespace npurt::comm
