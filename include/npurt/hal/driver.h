// Drivers: device kinds found by name, and devices made from what their user needs.
//
//   StatusOr<std::shared_ptr<hal::Device>> dev = hal::create_device("sim", {.cores = 8});
//   auto rt = Runtime::create("sim", {.cores = 8, .memory_bytes = 512ull << 20});
//
// A Driver names one kind of device ("sim": the simulated NPU, npurt's embedded
// default), says what its devices can do (DriverCapabilities), and makes devices from
// a DeviceSpec: the resources a user needs (cores, bytes of global memory), which every
// driver understands, and settings particular to the driver, by name. The registry
// holds the drivers built into npurt and any a program registers (a test's, a
// plugin's); everything above the HAL (runtime, comm, models, the CLI, Python) reaches
// devices through it and includes no driver's own header.
//
// Adding a driver: implement hal::Device (device.h) for the hardware, a Driver whose
// create_device() makes one from a DeviceSpec (rejecting settings it does not know by
// name), and call register_driver() before the first device of that kind is made.
// Nothing above the HAL changes; `npurt generate --device NAME` and Python's
// `Device(driver=NAME)` find it by its name (docs/architecture.md, "Drivers").
//
// Threading: every function here is thread-safe; drivers are immutable once registered.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"

namespace npurt::hal {

// What a user needs of a device.
struct DeviceSpec {
  uint32_t cores = 0;         // compute cores; 0: the driver's default
  uint64_t memory_bytes = 0;  // global memory; 0: the driver's default
  // Settings of one driver by name (Driver::settings()); a name the driver does not
  // know, or a value it cannot parse, is kInvalidArgument naming it.
  std::map<std::string, std::string, std::less<>> settings = {};
};

struct DriverCapabilities {
  // Device memory is host memory the process can address (a collective may hand it
  // to MPI directly instead of staging it).
  bool host_addressable_memory = false;
  // Device::set_fault_plan and the rest of faults.h work on its devices.
  bool fault_injection = false;
  // Its devices report stale instruction fetches and reads of never-written memory as
  // kHazard errors (a setting turns it on).
  bool hazard_detection = false;
};

struct DriverSetting {
  std::string name;
  std::string meaning;  // what it sets, its values and its default
};

class Driver {
 public:
  virtual ~Driver() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  virtual DriverCapabilities capabilities() const = 0;
  virtual std::vector<DriverSetting> settings() const = 0;
  // A device of this kind for `spec`; errors name the field or setting at fault.
  virtual StatusOr<std::shared_ptr<Device>> create_device(const DeviceSpec& spec) const = 0;
};

// Adds `driver` to the registry; kInvalidArgument when its name is taken.
Status register_driver(std::shared_ptr<const Driver> driver);
// The driver named `name`; kNotFound naming the drivers there are.
StatusOr<std::shared_ptr<const Driver>> find_driver(std::string_view name);
// Every registered driver's name, sorted.
std::vector<std::string> driver_names();
// find_driver(driver), then its create_device(spec).
StatusOr<std::shared_ptr<Device>> create_device(std::string_view driver, const DeviceSpec& spec = {});

}  // namespace npurt::hal
