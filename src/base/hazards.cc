#include "npurt/base/hazards.h"

#include <atomic>

namespace npurt {
namespace {

std::atomic<uint32_t> g_on{0};  // bit i: Hazard i

// Every hazard is one bit of g_on.
static_assert(static_cast<uint32_t>(Hazard::kWaitersIgnoreStreamOrder) < 32, "more hazards than bits");

uint32_t bit(Hazard h) { return 1u << static_cast<uint32_t>(h); }

}  // namespace

bool hazard_on(Hazard h) { return (g_on.load(std::memory_order_relaxed) & bit(h)) != 0; }

void set_hazard(Hazard h, bool on) {
  if (on) {
    g_on.fetch_or(bit(h), std::memory_order_relaxed);
  } else {
    g_on.fetch_and(~bit(h), std::memory_order_relaxed);
  }
}

}  // namespace npurt
