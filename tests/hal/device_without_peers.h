// The peer operations of hal::Device for a device that belongs to no group, shared by
// the test and benchmark devices that implement the rest of the interface.
#pragma once

#include <memory>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"

namespace npurt::testing {

class DeviceWithoutPeers : public hal::Device {
 public:
  bool can_access_peer(const hal::Device&) const override { return false; }
  Status copy_to_peer(hal::StreamId, std::shared_ptr<hal::Device>, hal::DeviceAddr, hal::DeviceAddr,
                      uint64_t) override {
    return no_peers();
  }
  Status wait_peer_event(hal::StreamId, hal::Device&, hal::EventId) override { return no_peers(); }

 private:
  Status no_peers() const { return unimplemented(info().name + " has no peers"); }
};

}  // namespace npurt::testing
