// StreamSlots: which stream each pipeline slot launches on, and when that stream must
// be replaced.
//
// Why streams get replaced at all: device cores cache instructions by GM address and
// nothing invalidates those caches except the first launch on a freshly created
// stream. Code blocks are freed and recycled, so a publication (the CodeRegistry
// uploading a new image) can put new bytes at an address that some core still holds
// in its cache. Hence the rule this class enforces (no stale code):
//
//   a stream may be reused only if no code has been published since it was created.
//
// Creating a stream per run would satisfy that rule too, but each create + destroy
// costs hundreds of microseconds and a few percent of device time; "no needless stream
// churn" asks for zero creates in steady state. StreamSlots keeps one
// stream per pipeline slot and replaces it exactly when the rule demands.
//
// The rules, as enforced by ReusePolicy::kPublicationAware:
//   1. begin() reuses the slot's stream iff the stream's last run was *retired* with
//      RunOutcome::kComplete by the executor, and the stream was created at the
//      publication epoch that begin() is given. A progress thread observing completion
//      (mark_polled_complete) proves nothing and never enables reuse.
//   2. A stream failing rule 1 is stale. It is destroyed and replaced by the next
//      begin() on its slot: never earlier, because a run may still own it, and never
//      eagerly for slots that are not launched again.
//   3. retire() with any other outcome (failed, timed out, abandoned) destroys the
//      run's stream: nothing proves the stream drained cleanly.
//   4. A destroy that fails keeps the handle, marked pending destruction (stale). It
//      is retried by the next begin() on that slot and by retry_pending_destroys().
//      While it keeps failing the slot is stranded: begin() on it fails with an error
//      naming the slot and the destroy error. Other slots keep working.
//   5. abandon_all() (device reset) forgets every handle without destroying it and
//      invalidates every outstanding lease.
//
// Leases: begin() gives the slot to one run under a SlotLease {slot, generation}.
// Every begin() and every abandon_all() bumps the slot's generation. An operation
// given a lease whose generation differs from the slot's, or whose slot is not owned
// by a run (already retired, or reset), fails with kFailedPrecondition and a message
// naming the slot and both generations. Which slot a run uses is the caller's choice
// (the Worker's); begin() on a slot that a run still owns is an error.
//
// Devices: StreamSlots never talks to a device. Streams are opaque handles made and
// destroyed by injected functions (StreamOps); for the HAL these wrap
// Device::create_stream / Device::destroy_stream, in tests a fake.
//
// Ownership and lifetime: StreamSlots owns every handle it holds (see slot_state())
// and destroys them when it is destroyed. A lease's stream is lent to the run for
// the lease's lifetime, i.e. until retire() or abandon_all(). The StreamOps (and
// whatever they call) must outlive the StreamSlots.
//
// Threading: every method is thread-safe; the intended use is a submitter thread
// calling begin() while a progress thread calls mark_polled_complete() and retire().
// Each slot has its own mutex, and StreamOps are called while holding the mutex of
// the slot they act for. That keeps each slot's state transitions atomic (a stream is
// either held or destroyed, never in between) at the price that a slow or hung
// create/destroy delays other calls on *the same slot* only; peer slots never wait
// for it. Consequences for StreamOps: they may be called concurrently for different
// slots, so they must be thread-safe, and they must not call back into this
// StreamSlots (that would deadlock on the slot mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>

#include "npurt/base/status.h"
#include "npurt/hal/ids.h"

namespace npurt::exec {

// A device stream; kNoStream (the zero id) is never a valid one.
using StreamHandle = hal::StreamId;
inline constexpr StreamHandle kNoStream{};

// How StreamSlots makes and unmakes streams. Both must be set. `create` must not
// return kNoStream. `destroy` waits for the stream's queued work and releases it; an
// error leaves the stream alive (StreamSlots keeps the handle and retries).
struct StreamOps {
  std::function<StatusOr<StreamHandle>()> create;
  std::function<Status(StreamHandle)> destroy;
};

// When may a slot reuse the stream it holds?
enum class ReusePolicy : uint8_t {
  // The correct rule: reuse iff the last run was retired complete and no code was
  // published since the stream was created. Use this one.
  kPublicationAware,
  // WRONG, TEST-ONLY. Reuse iff the last run was retired complete and ran the same
  // image id as the new run; publications are ignored. It reproduces the classic bug:
  // slot 0 runs A, B is published and runs on slot 1 (its code may land where A's
  // was), A is published again, and slot 0 "remembers" A and reuses a stream whose
  // cores cached B's bytes at that address. It also rebuilds streams needlessly when
  // two resident images merely alternate. It exists only so system tests can prove
  // they detect the stale-instruction hazard; never select it in production code.
  kNaiveLastImage,
};

// How the executor retired a run. Only kComplete proves the stream finished cleanly.
enum class RunOutcome : uint8_t { kComplete, kFailed, kTimedOut, kAbandoned };

std::string_view reuse_policy_name(ReusePolicy policy);
std::string_view run_outcome_name(RunOutcome outcome);

// One run's claim on a slot, from begin() to retire(). Plain value; copying it does
// not copy the claim (whichever copy is used first to retire wins, the others
// become stale).
struct SlotLease {
  uint32_t slot = 0;
  uint64_t generation = 0;          // the slot's generation when begin() returned
  StreamHandle stream = kNoStream;  // the stream the run launches on
  bool fresh_stream = false;        // begin() created `stream` for this run
  uint64_t epoch = 0;               // the publication epoch given to begin()
};

// A snapshot of one slot, for tests and traces.
struct SlotState {
  bool owned = false;          // a run holds a lease on the slot
  uint64_t generation = 0;
  StreamHandle stream = kNoStream;  // the handle the slot holds, if any
  bool pending_destroy = false;     // `stream` is stale and a destroy of it failed
  Status last_destroy_error;        // why, while pending_destroy
  uint64_t stream_epoch = 0;        // publication epoch `stream` was created at
  uint64_t last_image_id = 0;       // image id given to the slot's latest begin()
  bool last_run_retired_complete = false;  // the latest run was retired kComplete
  bool polled_complete = false;     // the latest run was observed complete (only that)
};

// Monotonic counters since construction. A snapshot is consistent: it reflects
// whole operations only (e.g. a stale replacement and its destroy appear together).
struct StreamSlotStats {
  uint64_t streams_created = 0;       // successful creates
  uint64_t streams_destroyed = 0;     // successful destroys (not counting the destructor)
  uint64_t streams_abandoned = 0;     // handles forgotten by abandon_all()
  uint64_t create_failures = 0;       // creates that returned an error (or kNoStream)
  uint64_t destroy_failures = 0;      // destroy attempts that returned an error
  uint64_t reuse_hits = 0;            // begin() calls that reused the held stream
  uint64_t stale_replacements = 0;    // begin() calls that found the held stream stale
  uint64_t unproven_retirements = 0;  // retire() calls with an outcome other than kComplete
  uint64_t stale_leases_rejected = 0; // lease operations refused for a stale lease
};

class StreamSlots {
 public:
  static constexpr uint32_t kDefaultDepth = 2;
  static constexpr uint32_t kMaxDepth = 64;

  // `depth` is the number of pipeline slots, in [1, kMaxDepth]. Fails with
  // kInvalidArgument for a depth outside that range or a missing StreamOps function.
  // No stream is created until a slot's first begin().
  static StatusOr<std::unique_ptr<StreamSlots>> make(
      StreamOps ops, uint32_t depth = kDefaultDepth,
      ReusePolicy policy = ReusePolicy::kPublicationAware);

  // Destroys every stream still held, pending destruction or not, including the
  // streams of runs never retired: destroying the StreamSlots ends all leases.
  // Destroy errors are dropped, as nobody is left to retry them or to report them to.
  ~StreamSlots();

  StreamSlots(const StreamSlots&) = delete;
  StreamSlots& operator=(const StreamSlots&) = delete;

  // Gives `slot` to a new run and returns its lease. First the slot's pending destroy,
  // if any, is retried; then its stream is reused if the policy allows, else destroyed
  // and replaced by a new one.
  //
  // `publication_epoch` is the code registry's publication epoch, read by the caller
  // *after* the run's image is published and *before* this call. It is passed in
  // rather than read through an injected getter because:
  //   - that ordering is what makes the rule sound: a stream created here is recorded
  //     as created at an epoch no newer than the truth (so a publication racing with
  //     this call can only cause a spare recreation, never a missed one), and the
  //     run's own image is known to be in GM before the stream's first launch;
  //   - only the caller knows when its image became resident (the Worker pins it,
  //     then stages the run), and it can hand the same epoch to its trace;
  //   - StreamSlots stays a pure policy: no dependency on the registry and no
  //     registry lock taken under a slot lock; tests drive epochs directly.
  // Epochs are expected to be non-decreasing. A stream is reused only at exactly the
  // epoch it was created at; any other epoch (newer, or older because the caller's
  // view is out of date) makes it stale.
  //
  // `image_id` identifies the image the run executes. kPublicationAware ignores it
  // (beyond recording it for slot_state()); kNaiveLastImage keys reuse on it.
  //
  // Errors: kOutOfRange for a slot >= depth(); kFailedPrecondition if a run owns the
  // slot, or if the slot is stranded (destroying its stale stream failed; the message
  // names the slot, the stream and the destroy error; the handle is kept and retried
  // next time); the create error, with the slot as context, if creating the
  // replacement fails (the slot then holds no stream and stays usable); kInternal if
  // `create` returned kNoStream. On error the slot is not owned and no lease exists.
  StatusOr<SlotLease> begin(uint32_t slot, uint64_t publication_epoch, uint64_t image_id);

  // Records that a progress thread saw the lease's run complete. Observation only:
  // it never makes a stream reusable; only retire(kComplete) does.
  // Errors: kOutOfRange / kFailedPrecondition / kInvalidArgument for a bad lease.
  Status mark_polled_complete(const SlotLease& lease);

  // Ends the lease's run and frees its slot. kComplete makes the stream a candidate
  // for reuse; any other outcome destroys the stream now. If that destroy fails the
  // run is still retired (OK is returned): the handle stays with the slot, pending
  // destruction, and the failure surfaces through slot_state(), the next begin() on
  // the slot, and retry_pending_destroys().
  // Errors: kOutOfRange for a slot >= depth(); kFailedPrecondition for a stale lease
  // (naming the slot and both generations); kInvalidArgument if the lease's stream
  // is not the slot's. A rejected lease changes nothing.
  Status retire(const SlotLease& lease, RunOutcome outcome);

  // Retries every pending destroy (on slots no run owns). OK when none is left
  // pending; otherwise kFailedPrecondition naming each stranded slot, its stream and
  // its destroy error.
  Status retry_pending_destroys();

  // Device reset: forgets every handle without destroying it (the device they lived
  // on is gone) and bumps every slot's generation, so all outstanding leases become
  // stale. Slots are reset one at a time, each atomically. The next begin() on each
  // slot creates a fresh stream.
  void abandon_all();

  // Whether begin(slot, publication_epoch, image_id) would reuse the held stream now.
  // False while a run owns the slot. kOutOfRange for a slot >= depth().
  StatusOr<bool> would_reuse(uint32_t slot, uint64_t publication_epoch,
                             uint64_t image_id) const;

  // A snapshot of one slot. kOutOfRange for a slot >= depth().
  StatusOr<SlotState> slot_state(uint32_t slot) const;

  // A consistent snapshot of the counters.
  StreamSlotStats stats() const;

  uint32_t depth() const { return depth_; }
  ReusePolicy policy() const { return policy_; }

 private:
  struct Slot;
  class StatsDelta;

  StreamSlots(StreamOps ops, uint32_t depth, ReusePolicy policy);

  Status check_slot_index(uint32_t slot) const;
  Status check_lease(uint32_t slot_index, const Slot& slot, const SlotLease& lease,
                     StatsDelta& stats);
  bool reusable(const Slot& slot, uint64_t publication_epoch, uint64_t image_id) const;
  Status destroy_condemned_stream(uint32_t slot_index, Slot& slot, StatsDelta& stats);

  StreamOps ops_;
  uint32_t depth_;
  ReusePolicy policy_;
  std::unique_ptr<Slot[]> slots_;

  // Every operation gathers its counter changes and adds them under stats_mu_ before
  // it releases its slot, so a snapshot never shows half an operation. Lock order:
  // a slot's mutex, then stats_mu_.
  mutable std::mutex stats_mu_;
  StreamSlotStats stats_;
};

}  // namespace npurt::exec
