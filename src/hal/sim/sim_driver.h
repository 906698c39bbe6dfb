// The simulated NPU as a driver ("sim"): DeviceSpec to SimOptions, and the device.
#pragma once

#include <memory>

#include "npurt/hal/driver.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::hal {

std::shared_ptr<const Driver> sim_driver();
// The SimOptions a spec asks for (its settings parsed; unknown names are errors).
StatusOr<SimOptions> sim_options(const DeviceSpec& spec);

}  // namespace npurt::hal
