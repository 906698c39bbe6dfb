// Owning handles for what a Device hands out: a global-memory block, a stream, an
// event. Each keeps its device alive (the device is shared) and gives its object back
// when it goes, so no handle has to be destroyed before anything else.
//
// Move-only. A moved-from or default-constructed handle is empty and releases nothing.
// release() gives the object back now and returns the device's answer (a destructor
// can only drop it); afterwards the handle is empty.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"

namespace npurt::hal {

namespace handles_detail {

// The common part: a device and one id, released by Release::apply.
template <typename Release>
class Owned {
 public:
  using IdType = typename Release::IdType;
  Owned() = default;
  Owned(std::shared_ptr<Device> device, IdType id) : device_(std::move(device)), id_(id) {}
  ~Owned() { release().ignore(); }
  Owned(Owned&& other) noexcept
      : device_(std::move(other.device_)), id_(std::exchange(other.id_, IdType{})) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      release().ignore();
      device_ = std::move(other.device_);
      id_ = std::exchange(other.id_, IdType{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  bool valid() const { return static_cast<bool>(id_); }
  explicit operator bool() const { return valid(); }
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& shared_device() const { return device_; }

  Status release() {
    if (!id_) return ok_status();
    Status s = Release::apply(*device_, std::exchange(id_, IdType{}));
    device_.reset();
    return s;
  }

 protected:
  IdType id() const { return id_; }

 private:
  std::shared_ptr<Device> device_;
  IdType id_{};
};

struct FreeBlock {
  using IdType = DeviceAddr;
  static Status apply(Device& d, DeviceAddr addr) { return d.free(addr); }
};
struct StreamCalls {
  using IdType = StreamId;
  static StatusOr<StreamId> create(Device& d) { return d.create_stream(); }
  static Status apply(Device& d, StreamId id) { return d.destroy_stream(id); }
};
struct EventCalls {
  using IdType = EventId;
  static StatusOr<EventId> create(Device& d) { return d.create_event(); }
  static Status apply(Device& d, EventId id) { return d.destroy_event(id); }
};

// A handle to an object the device makes from nothing but an id (a stream, an event).
template <typename Calls>
class Created : public Owned<Calls> {
 public:
  Created() = default;
  static StatusOr<Created> create(std::shared_ptr<Device> device) {
    NPURT_ASSIGN_OR_RETURN(typename Calls::IdType id, Calls::create(*device));
    return Created(std::move(device), id);
  }
  typename Calls::IdType id() const { return Owned<Calls>::id(); }

 private:
  Created(std::shared_ptr<Device> device, typename Calls::IdType id) : Owned<Calls>(std::move(device), id) {}
};

}  // namespace handles_detail

// A block of global memory, freed when the handle goes.
class DeviceBlock : public handles_detail::Owned<handles_detail::FreeBlock> {
 public:
  DeviceBlock() = default;
  static StatusOr<DeviceBlock> allocate(std::shared_ptr<Device> device, uint64_t bytes,
                                        uint64_t alignment = 256) {
    NPURT_ASSIGN_OR_RETURN(DeviceAddr addr, device->allocate(bytes, alignment));
    return DeviceBlock(std::move(device), addr, bytes);
  }
  DeviceAddr addr() const { return id(); }
  uint64_t bytes() const { return valid() ? bytes_ : 0; }

 private:
  DeviceBlock(std::shared_ptr<Device> device, DeviceAddr addr, uint64_t bytes)
      : Owned(std::move(device), addr), bytes_(bytes) {}
  uint64_t bytes_ = 0;
};

// A stream, destroyed (after its queued commands) when the handle goes.
using Stream = handles_detail::Created<handles_detail::StreamCalls>;

// An event, destroyed when the handle goes.
using Event = handles_detail::Created<handles_detail::EventCalls>;

}  // namespace npurt::hal
