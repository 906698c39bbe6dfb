#include "npurt/base/hazards.h"

#include <atomic>

namespace npurt {
namespace {

std::atomic<uint32_t> g_on{0};  // bit i: Hazard i

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

std::string_view hazard_name(Hazard h) {
  switch (h) {
    case Hazard::kUnprimedStreams: return "unprimed streams";
    case Hazard::kNaiveStreamReuse: return "naive stream reuse";
    case Hazard::kNaiveCoherence: return "naive coherence";
    case Hazard::kUnorderedConflicts: return "unordered conflicts";
    case Hazard::kNoResendOfFailedUploads: return "no resend of failed uploads";
    case Hazard::kLaunchesDropTheirCode: return "launches drop their code";
    case Hazard::kNoStepBarriers: return "no step barriers";
    case Hazard::kPrefillIgnoresWindow: return "prefill ignores window";
    case Hazard::kWritesSharedKvBlocks: return "writes shared KV blocks";
    case Hazard::kCollectivesSkipOrdering: return "collectives skip ordering";
    case Hazard::kReusesAbandonedMpiMemory: return "reuses abandoned MPI memory";
  }
  return "unknown hazard";
}

}  // namespace npurt
