// Device counters: the evidence for "no redundant transfers" and "no needless stream
// churn". Monotonic since device creation; take two snapshots and subtract.
#pragma once

#include <cstdint>
#include <string>

namespace npurt::hal {

struct Counters {
  uint64_t h2d_bytes = 0, h2d_transfers = 0;
  uint64_t d2h_bytes = 0, d2h_transfers = 0;
  uint64_t d2d_bytes = 0, d2d_transfers = 0;
  uint64_t peer_bytes = 0, peer_transfers = 0;  // copy_to_peer, counted by the sender
  uint64_t host_functions = 0;
  // event_synchronize / stream_synchronize calls that found the work unfinished and
  // blocked the host (a wait on finished work is not counted).
  uint64_t host_blocked_waits = 0;
  uint64_t lent_thread_commands = 0;  // run on a thread lent by Device::run_next_command
  uint64_t launches = 0;
  uint64_t blocks = 0;
  uint64_t streams_created = 0, streams_destroyed = 0;
  uint64_t events_created = 0, events_destroyed = 0;
  uint64_t allocations = 0, frees = 0;
  uint64_t allocated_bytes = 0, freed_bytes = 0;  // as allocated (alignment padding excluded)
  uint64_t code_uploads = 0, code_upload_bytes = 0;
  uint64_t icache_hits = 0, icache_misses = 0, icache_invalidations = 0;
  uint64_t kernel_faults = 0;
  uint64_t hazard_stale_fetch = 0;
  uint64_t hazard_uninit_read = 0;
  uint64_t streams_aborted = 0;  // abort_stream, and every stream of each reset
  uint64_t resets = 0;
  uint64_t faults_injected = 0;  // simulated NPU's fault injection (sim_device.h)

  Counters operator-(const Counters& o) const;
  // One "name value" pair per line.
  std::string to_string() const;
};

}  // namespace npurt::hal
