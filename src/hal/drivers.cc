// The driver registry (driver.h): the built-in drivers, then any registered at run time.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "hal/sim/sim_driver.h"
#include "npurt/hal/driver.h"

namespace npurt::hal {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<const Driver>> drivers;
};

Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry;  // never destroyed: devices may outlive static destruction
    made->drivers.push_back(sim_driver());
    return made;
  }();
  return *r;
}

std::vector<std::string> sorted_names_locked(const Registry& r) {
  std::vector<std::string> names;
  for (const auto& d : r.drivers) names.emplace_back(d->name());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

Status register_driver(std::shared_ptr<const Driver> driver) {
  if (driver == nullptr || driver->name().empty()) return invalid_argument("register_driver: a driver without a name");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& d : r.drivers) {
    if (d->name() == driver->name()) {
      return invalid_argument("register_driver: a driver named '" + std::string(driver->name()) + "' exists");
    }
  }
  r.drivers.push_back(std::move(driver));
  return ok_status();
}

StatusOr<std::shared_ptr<const Driver>> find_driver(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& d : r.drivers) {
    if (d->name() == name) return d;
  }
  std::string known;
  for (const std::string& n : sorted_names_locked(r)) known += (known.empty() ? "" : ", ") + n;
  return not_found("no device driver named '" + std::string(name) + "' (there are: " + known + ")");
}

std::vector<std::string> driver_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return sorted_names_locked(r);
}

StatusOr<std::shared_ptr<Device>> create_device(std::string_view driver, const DeviceSpec& spec) {
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<const Driver> d, find_driver(driver));
  return d->create_device(spec);
}

}  // namespace npurt::hal
