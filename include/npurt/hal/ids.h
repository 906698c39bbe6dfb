// The values a Device hands out, each its own type: a stream id is not an event id,
// and neither is a device address or a byte count, so passing one where another
// belongs does not compile.
//
// Zero is never a valid value of any of them (a default-constructed one is "none").
// value() gives the raw number, for a driver's tables and for messages.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "npurt/base/math.h"

namespace npurt::hal {

// An opaque id of one kind of device object (a stream, an event).
template <typename Tag>
class Id {
 public:
  constexpr Id() = default;
  constexpr explicit Id(uint64_t value) : value_(value) {}

  constexpr uint64_t value() const { return value_; }
  constexpr explicit operator bool() const { return value_ != 0; }
  friend constexpr auto operator<=>(Id, Id) = default;

 private:
  uint64_t value_ = 0;
};

using StreamId = Id<struct StreamTag>;
using EventId = Id<struct EventTag>;

// A byte address in a device's global memory. An address plus a byte count is an
// address; the difference of two addresses is a byte count.
class DeviceAddr : public Id<struct AddrTag> {
 public:
  using Id::Id;

  friend constexpr DeviceAddr operator+(DeviceAddr a, uint64_t bytes) { return DeviceAddr(a.value() + bytes); }
  friend constexpr uint64_t operator-(DeviceAddr a, DeviceAddr b) { return a.value() - b.value(); }
  constexpr DeviceAddr& operator+=(uint64_t bytes) { return *this = *this + bytes; }
};

inline std::string to_string(DeviceAddr a) { return std::to_string(a.value()); }
template <typename Tag>
std::string to_string(Id<Tag> id) {
  return std::to_string(id.value());
}
// For messages and test failures: an id's number, an address in hex.
inline std::ostream& operator<<(std::ostream& os, DeviceAddr a) { return os << hex(a.value()); }
template <typename Tag>
std::ostream& operator<<(std::ostream& os, Id<Tag> id) {
  return os << id.value();
}

}  // namespace npurt::hal

namespace npurt {
inline std::string hex(hal::DeviceAddr a, int min_digits = 1) { return hex(a.value(), min_digits); }
}  // namespace npurt

template <typename Tag>
struct std::hash<npurt::hal::Id<Tag>> {
  size_t operator()(npurt::hal::Id<Tag> id) const noexcept { return std::hash<uint64_t>{}(id.value()); }
};
template <>
struct std::hash<npurt::hal::DeviceAddr> {
  size_t operator()(npurt::hal::DeviceAddr a) const noexcept { return std::hash<uint64_t>{}(a.value()); }
};
