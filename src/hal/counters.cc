#include "npurt/hal/counters.h"

#include <sstream>

namespace npurt::hal {

// The field list once, for subtraction and printing alike.
#define NPURT_COUNTER_FIELDS(X)                                                            \
  X(h2d_bytes) X(h2d_transfers) X(d2h_bytes) X(d2h_transfers) X(d2d_bytes) X(d2d_transfers) \
  X(peer_bytes) X(peer_transfers) X(host_functions) X(host_blocked_waits) X(lent_thread_commands) \
  X(launches) X(blocks) X(streams_created) X(streams_destroyed) X(events_created)              \
  X(events_destroyed) X(allocations) X(frees) X(allocated_bytes) X(freed_bytes) X(code_uploads)             \
  X(code_upload_bytes) X(icache_hits) X(icache_misses) X(icache_invalidations)              \
  X(kernel_faults) X(hazard_stale_fetch) X(hazard_uninit_read) X(streams_aborted) X(resets)     \
  X(faults_injected)

Counters Counters::operator-(const Counters& o) const {
  Counters r;
#define X(f) r.f = f - o.f;
  NPURT_COUNTER_FIELDS(X)
#undef X
  return r;
}

std::string Counters::to_string() const {
  std::ostringstream os;
#define X(f) os << #f << " " << f << "\n";
  NPURT_COUNTER_FIELDS(X)
#undef X
  return os.str();
}

}  // namespace npurt::hal
