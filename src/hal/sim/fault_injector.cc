#include "hal/sim/fault_injector.h"

#include <algorithm>

namespace npurt::hal {

}  // namespace npurt::hal

namespace npurt::sim {
namespace {

using hal::kFaultSiteCount;
using hal::ScriptedFault;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double unit(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

bool plan_is_empty(const FaultPlan& p) {
  return p.script.empty() && std::all_of(p.rate.begin(), p.rate.end(), [](double r) { return r == 0; });
}

}  // namespace

Status FaultInjector::set_plan(FaultPlan plan) {
  for (size_t i = 0; i < kFaultSiteCount; ++i) {
    if (!(plan.rate[i] >= 0 && plan.rate[i] <= 1)) {
      return invalid_argument("fault rate for '" + std::string(hal::fault_site_name(static_cast<FaultSite>(i))) +
                              "' must be in [0, 1], got " + std::to_string(plan.rate[i]));
    }
  }
  for (const ScriptedFault& f : plan.script) {
    if (static_cast<size_t>(f.site) >= kFaultSiteCount) return invalid_argument("scripted fault: unknown site");
    if (f.nth == 0) return invalid_argument("scripted fault: operations are counted from 1, got nth 0");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const bool active = !plan_is_empty(plan);
  plan_ = std::move(plan);
  stats_.operations.fill(0);
  stats_.injected.fill(0);
  active_.store(active, std::memory_order_release);
  return ok_status();
}

std::optional<FaultInjector::Fault> FaultInjector::draw(FaultSite site, uint32_t grid) {
  if (!active_.load(std::memory_order_acquire)) return std::nullopt;
  const auto i = static_cast<size_t>(site);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t n = ++stats_.operations[i];
  Fault f{0, site, 0, 0};
  bool fails = false;
  for (const ScriptedFault& s : plan_.script) {
    if (s.site != site || s.nth != n) continue;
    fails = true;
    f.block = s.block < grid ? s.block : 0;
    f.instruction = s.instruction;
    break;
  }
  if (!fails && plan_.rate[i] > 0) {
    const uint64_t h = mix(plan_.seed ^ mix(i * 0x100000001b3ull ^ mix(n)));
    fails = unit(h) < plan_.rate[i];
    f.block = static_cast<uint32_t>(mix(h) % std::max(grid, 1u));
    f.instruction = mix(h + 1) % 256;
  }
  if (!fails) return std::nullopt;
  f.id = next_id_++;
  ++stats_.injected[i];
  return f;
}

Status FaultInjector::error(const Fault& fault, StatusCode code, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back({fault.id, fault.site, what});
  }
  return Status(code, "injected fault #" + std::to_string(fault.id) + ": " + what);
}

FaultStats FaultInjector::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::vector<InjectedFault> FaultInjector::take_log() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InjectedFault> out;
  out.swap(log_);
  return out;
}

}  // namespace npurt::sim
