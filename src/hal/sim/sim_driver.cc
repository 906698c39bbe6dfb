#include "hal/sim/sim_driver.h"

#include <charconv>
#include <string>

namespace npurt::hal {
namespace {

// One setting: its name, what it means, and where its value goes.
struct SimSetting {
  const char* name;
  const char* meaning;
  uint32_t SimOptions::*u32 = nullptr;
  bool SimOptions::*flag = nullptr;
};

const SimSetting kSettings[] = {
    {"host_threads", "host threads executing the cores (0: one per hardware thread; default 0)", &SimOptions::host_threads},
    {"local_memory_bytes", "local memory per core (default 262144)", &SimOptions::local_memory_bytes},
    {"icache_line_bytes", "instruction cache line, a power of two and multiple of 16 (default 64)",
     &SimOptions::icache_line_bytes},
    {"icache_sets", "instruction cache sets, a power of two (default 64)", &SimOptions::icache_sets},
    {"icache_ways", "instruction cache ways, 1 to 64 (default 4)", &SimOptions::icache_ways},
    {"sanitize", "1: report stale instruction fetches and reads of never-written memory as hazards (default 0)",
     nullptr, &SimOptions::sanitize},
};

Status set(SimOptions& o, const SimSetting& s, const std::string& value) {
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || (s.flag != nullptr && v > 1)) {
    return invalid_argument(std::string("sim driver: setting '") + s.name + "': '" + value + "' is not " +
                            (s.flag != nullptr ? "0 or 1" : "a non-negative 32-bit integer"));
  }
  if (s.flag != nullptr) {
    o.*s.flag = v == 1;
  } else {
    o.*s.u32 = v;
  }
  return ok_status();
}

class SimDriver final : public Driver {
 public:
  std::string_view name() const override { return "sim"; }
  std::string_view description() const override {
    return "the simulated NPU: cores with local memory and instruction caches, run by host threads";
  }
  DriverCapabilities capabilities() const override {
    return {.host_addressable_memory = true, .fault_injection = true, .hazard_detection = true};
  }
  std::vector<DriverSetting> settings() const override {
    std::vector<DriverSetting> out;
    for (const SimSetting& s : kSettings) out.push_back({s.name, s.meaning});
    return out;
  }
  StatusOr<std::shared_ptr<Device>> create_device(const DeviceSpec& spec) const override {
    NPURT_ASSIGN_OR_RETURN(const SimOptions o, sim_options(spec));
    return create_sim_device(o);
  }
};

}  // namespace

std::shared_ptr<const Driver> sim_driver() {
  static const auto driver = std::make_shared<const SimDriver>();
  return driver;
}

StatusOr<SimOptions> sim_options(const DeviceSpec& spec) {
  SimOptions o;
  if (spec.cores != 0) o.num_cores = spec.cores;
  if (spec.memory_bytes != 0) o.global_memory_bytes = spec.memory_bytes;
  for (const auto& [name, value] : spec.settings) {
    const SimSetting* found = nullptr;
    for (const SimSetting& s : kSettings) {
      if (name == s.name) found = &s;
    }
    if (found == nullptr) {
      std::string known;
      for (const SimSetting& s : kSettings) known += std::string(known.empty() ? "" : ", ") + s.name;
      return invalid_argument("sim driver: no setting '" + name + "' (it has " + known + ")");
    }
    NPURT_RETURN_IF_ERROR(set(o, *found, value));
  }
  return o;
}

}  // namespace npurt::hal
