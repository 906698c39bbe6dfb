// Deliberately wrong behaviours, all in one place.
//
// npurt keeps each of these so that a test can show that the check it relies on fails
// when the protection is taken away (a hazard test that cannot fail proves nothing).
// Nothing but tests turns them on. They are process-wide and off by default; the code
// that owns a protection asks hazard_on() where it decides (a memory context when it is
// made, the rest when they act), so a test turns one on with ScopedHazard before it
// makes or runs what it checks.
#pragma once

#include <cstdint>

namespace npurt {

// One bit each (hazards.cc): at most 32, new ones last.
enum class Hazard : uint32_t {
  // exec: fresh streams are not primed over every core, so cores a stream's first
  // launch does not use may run cached lines of freed code at a recycled address.
  kUnprimedStreams,
  // exec: a pool reuses a slot's stream when its last run ran the same image, not
  // only when nothing was published since the stream was made.
  kNaiveStreamReuse,
  // memory: residency and read-back flags per buffer instead of exact per-range
  // coherence, as the production runtimes whose stale-data bugs npurt prevents
  // (memory_context.h says what they miss).
  kNaiveCoherence,
  // memory: transfers and launches do not wait for conflicting work on other streams.
  kUnorderedConflicts,
  // memory: bytes whose upload belonged to work that failed count as on the device.
  kNoResendOfFailedUploads,
  // memory: a launch does not hold its code, which may then be freed while queued.
  kLaunchesDropTheirCode,
  // graph: fused steps get no barrier between them.
  kNoStepBarriers,
  // models: the prefill attention ignores the sliding window.
  kPrefillIgnoresWindow,
  // models: appending to the KV cache writes into blocks other sequences share.
  kWritesSharedKvBlocks,
  // comm: collectives stop waiting for the work already on their ranks' streams.
  kCollectivesSkipOrdering,
  // comm: device memory MPI may still write after a timeout is freed and reused.
  kReusesAbandonedMpiMemory,
  // hal: a thread waiting in stream_synchronize runs the stream's next queued host
  // function or copy even while an earlier command of the stream still executes.
  kWaitersIgnoreStreamOrder,
};

// Whether `h` is on (a relaxed atomic read).
bool hazard_on(Hazard h);
void set_hazard(Hazard h, bool on);

// Turns `h` on (or sets it to `on`) for its lifetime, then restores what it was.
class ScopedHazard {
 public:
  explicit ScopedHazard(Hazard h, bool on = true) : h_(h), was_(hazard_on(h)) { set_hazard(h, on); }
  ~ScopedHazard() { set_hazard(h_, was_); }
  ScopedHazard(const ScopedHazard&) = delete;
  ScopedHazard& operator=(const ScopedHazard&) = delete;

 private:
  Hazard h_;
  bool was_;
};

}  // namespace npurt
