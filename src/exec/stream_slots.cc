#include "npurt/exec/stream_slots.h"

#include <mutex>
#include <string>
#include <utility>

namespace npurt::exec {

// Per-slot state: exactly what slot_state() reports, every field guarded by `mu`.
//
// A slot holds at most one stream. Invariants (checked where they matter):
//   - owned implies stream != kNoStream and !pending_destroy (begin() fails rather
//     than hand out a slot whose old stream could not be destroyed);
//   - pending_destroy implies stream != kNoStream.
struct StreamSlots::Slot : SlotState {
  mutable std::mutex mu;
};

// One operation's counter changes. They are added to the totals when the operation
// ends; declared after the operation's slot lock, that is still under it.
class StreamSlots::StatsDelta {
 public:
  explicit StatsDelta(StreamSlots& owner) : owner_(owner) {}
  ~StatsDelta() {
    std::lock_guard lock(owner_.stats_mu_);
    StreamSlotStats& t = owner_.stats_;
    t.streams_created += d.streams_created;
    t.streams_destroyed += d.streams_destroyed;
    t.streams_abandoned += d.streams_abandoned;
    t.create_failures += d.create_failures;
    t.destroy_failures += d.destroy_failures;
    t.reuse_hits += d.reuse_hits;
    t.stale_replacements += d.stale_replacements;
    t.unproven_retirements += d.unproven_retirements;
    t.stale_leases_rejected += d.stale_leases_rejected;
  }
  StatsDelta(const StatsDelta&) = delete;
  StatsDelta& operator=(const StatsDelta&) = delete;

  StreamSlotStats d;

 private:
  StreamSlots& owner_;
};

namespace {

std::string slot_name(uint32_t slot_index) {
  return "stream slot " + std::to_string(slot_index);
}

}  // namespace

std::string_view reuse_policy_name(ReusePolicy policy) {
  switch (policy) {
    case ReusePolicy::kPublicationAware: return "publication-aware";
    case ReusePolicy::kNaiveLastImage: return "naive-last-image";
  }
  return "unknown";
}

std::string_view run_outcome_name(RunOutcome outcome) {
  switch (outcome) {
    case RunOutcome::kComplete: return "complete";
    case RunOutcome::kFailed: return "failed";
    case RunOutcome::kTimedOut: return "timed out";
    case RunOutcome::kAbandoned: return "abandoned";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<StreamSlots>> StreamSlots::make(StreamOps ops, uint32_t depth,
                                                         ReusePolicy policy) {
  if (depth == 0 || depth > kMaxDepth) {
    return invalid_argument("stream slot depth " + std::to_string(depth) +
                            " outside [1, " + std::to_string(kMaxDepth) + "]");
  }
  if (!ops.create) return invalid_argument("StreamOps.create is not set");
  if (!ops.destroy) return invalid_argument("StreamOps.destroy is not set");
  if (policy != ReusePolicy::kPublicationAware && policy != ReusePolicy::kNaiveLastImage) {
    return invalid_argument("unknown stream reuse policy " +
                            std::to_string(static_cast<int>(policy)));
  }
  return std::unique_ptr<StreamSlots>(new StreamSlots(std::move(ops), depth, policy));
}

StreamSlots::StreamSlots(StreamOps ops, uint32_t depth, ReusePolicy policy)
    : ops_(std::move(ops)), depth_(depth), policy_(policy), slots_(new Slot[depth]) {}

StreamSlots::~StreamSlots() {
  for (uint32_t i = 0; i < depth_; ++i) {
    Slot& slot = slots_[i];
    std::lock_guard lock(slot.mu);
    if (slot.stream == kNoStream) continue;
    // Best effort: a failure here has no one to be retried by or reported to.
    ops_.destroy(slot.stream).ignore();
    slot.stream = kNoStream;
  }
}

Status StreamSlots::check_slot_index(uint32_t slot_index) const {
  if (slot_index < depth_) return ok_status();
  return out_of_range(slot_name(slot_index) + " out of range: depth is " +
                      std::to_string(depth_));
}

Status StreamSlots::check_lease(uint32_t slot_index, const Slot& slot,
                                const SlotLease& lease, StatsDelta& stats) {
  if (lease.generation != slot.generation || !slot.owned) {
    ++stats.d.stale_leases_rejected;
    return failed_precondition(
        "stale lease for " + slot_name(slot_index) + ": lease generation " +
        std::to_string(lease.generation) + ", slot generation " +
        std::to_string(slot.generation) +
        (slot.owned ? "" : " (the slot is not owned by a run)"));
  }
  if (lease.stream != slot.stream) {
    return invalid_argument("lease for " + slot_name(slot_index) + " generation " +
                            std::to_string(lease.generation) + " names stream " +
                            hal::to_string(lease.stream) + ", but its run owns stream " +
                            hal::to_string(slot.stream));
  }
  return ok_status();
}

bool StreamSlots::reusable(const Slot& slot, uint64_t publication_epoch,
                           uint64_t image_id) const {
  if (slot.owned || slot.stream == kNoStream || slot.pending_destroy) return false;
  // Shared by both policies: only a run the executor retired complete proves the
  // stream is in a clean state.
  if (!slot.last_run_retired_complete) return false;
  switch (policy_) {
    case ReusePolicy::kPublicationAware:
      return slot.stream_epoch == publication_epoch;
    case ReusePolicy::kNaiveLastImage:
      return slot.last_image_id == image_id;
  }
  return false;
}

// Destroys the slot's stream, which must already be condemned (pending_destroy). On
// failure the handle stays, still pending, and the returned error names the slot.
Status StreamSlots::destroy_condemned_stream(uint32_t slot_index, Slot& slot,
                                             StatsDelta& stats) {
  NPURT_CHECK(slot.pending_destroy && slot.stream != kNoStream && !slot.owned);
  Status destroyed = ops_.destroy(slot.stream);
  if (!destroyed.ok()) {
    ++stats.d.destroy_failures;
    slot.last_destroy_error = destroyed;
    return failed_precondition(slot_name(slot_index) +
                               " is stranded: destroying its stale stream " +
                               hal::to_string(slot.stream) + " failed: " +
                               destroyed.to_string());
  }
  ++stats.d.streams_destroyed;
  slot.stream = kNoStream;
  slot.pending_destroy = false;
  slot.last_destroy_error = ok_status();
  return ok_status();
}

StatusOr<SlotLease> StreamSlots::begin(uint32_t slot_index, uint64_t publication_epoch,
                                       uint64_t image_id) {
  NPURT_RETURN_IF_ERROR(check_slot_index(slot_index).with_context("begin"));
  Slot& slot = slots_[slot_index];
  std::lock_guard lock(slot.mu);
  StatsDelta stats(*this);

  if (slot.owned) {
    return failed_precondition("begin: " + slot_name(slot_index) +
                               " is owned by an unretired run (generation " +
                               std::to_string(slot.generation) + ")");
  }

  // A stream condemned earlier (stale, or its run unproven) whose destroy failed.
  if (slot.pending_destroy) {
    NPURT_RETURN_IF_ERROR(
        destroy_condemned_stream(slot_index, slot, stats).with_context("begin"));
  }

  if (slot.stream != kNoStream) {
    if (reusable(slot, publication_epoch, image_id)) {
      ++stats.d.reuse_hits;
    } else {
      // Stale: replace it now that no run owns it.
      ++stats.d.stale_replacements;
      slot.pending_destroy = true;
      NPURT_RETURN_IF_ERROR(
          destroy_condemned_stream(slot_index, slot, stats).with_context("begin"));
    }
  }

  bool fresh_stream = false;
  if (slot.stream == kNoStream) {
    StatusOr<StreamHandle> created = ops_.create();
    if (!created.ok()) {
      ++stats.d.create_failures;
      return created.status().with_context("begin: " + slot_name(slot_index) +
                                           ": creating a stream");
    }
    if (*created == kNoStream) {
      ++stats.d.create_failures;
      return internal_error("begin: " + slot_name(slot_index) +
                            ": StreamOps.create returned the null stream handle");
    }
    ++stats.d.streams_created;
    slot.stream = *created;
    slot.stream_epoch = publication_epoch;
    fresh_stream = true;
  }

  slot.owned = true;
  ++slot.generation;
  slot.last_image_id = image_id;
  slot.last_run_retired_complete = false;
  slot.polled_complete = false;
  return SlotLease{slot_index, slot.generation, slot.stream, fresh_stream, publication_epoch};
}

Status StreamSlots::mark_polled_complete(const SlotLease& lease) {
  NPURT_RETURN_IF_ERROR(check_slot_index(lease.slot).with_context("mark_polled_complete"));
  Slot& slot = slots_[lease.slot];
  std::lock_guard lock(slot.mu);
  StatsDelta stats(*this);
  NPURT_RETURN_IF_ERROR(
      check_lease(lease.slot, slot, lease, stats).with_context("mark_polled_complete"));
  slot.polled_complete = true;
  return ok_status();
}

Status StreamSlots::retire(const SlotLease& lease, RunOutcome outcome) {
  NPURT_RETURN_IF_ERROR(check_slot_index(lease.slot).with_context("retire"));
  Slot& slot = slots_[lease.slot];
  std::lock_guard lock(slot.mu);
  StatsDelta stats(*this);
  NPURT_RETURN_IF_ERROR(check_lease(lease.slot, slot, lease, stats).with_context("retire"));

  slot.owned = false;
  if (outcome == RunOutcome::kComplete) {
    slot.last_run_retired_complete = true;
    return ok_status();
  }

  // Failed, timed out or abandoned: the stream's state is unknown, so it goes. Any
  // value other than kComplete is treated this way, which is the safe direction.
  ++stats.d.unproven_retirements;
  slot.last_run_retired_complete = false;
  slot.pending_destroy = true;
  // The run is retired either way. A failed destroy leaves the handle pending; it is
  // retried and reported by the next begin() on this slot and retry_pending_destroys().
  destroy_condemned_stream(lease.slot, slot, stats).ignore();
  return ok_status();
}

Status StreamSlots::retry_pending_destroys() {
  std::string failures;
  uint32_t stranded = 0;
  for (uint32_t i = 0; i < depth_; ++i) {
    Slot& slot = slots_[i];
    std::lock_guard lock(slot.mu);
    StatsDelta stats(*this);
    if (!slot.pending_destroy || slot.owned) continue;
    Status destroyed = destroy_condemned_stream(i, slot, stats);
    if (destroyed.ok()) continue;
    if (stranded++ > 0) failures += "; ";
    failures += destroyed.message();
  }
  if (stranded == 0) return ok_status();
  return failed_precondition("retry_pending_destroys: " + std::to_string(stranded) +
                             " stream destroy(s) still failing: " + failures);
}

void StreamSlots::abandon_all() {
  for (uint32_t i = 0; i < depth_; ++i) {
    Slot& slot = slots_[i];
    std::lock_guard lock(slot.mu);
    StatsDelta stats(*this);
    if (slot.stream != kNoStream) ++stats.d.streams_abandoned;
    slot.stream = kNoStream;
    slot.stream_epoch = 0;
    slot.pending_destroy = false;
    slot.last_destroy_error = ok_status();
    slot.owned = false;
    slot.last_run_retired_complete = false;
    slot.polled_complete = false;
    ++slot.generation;
  }
}

StatusOr<bool> StreamSlots::would_reuse(uint32_t slot_index, uint64_t publication_epoch,
                                        uint64_t image_id) const {
  NPURT_RETURN_IF_ERROR(check_slot_index(slot_index).with_context("would_reuse"));
  const Slot& slot = slots_[slot_index];
  std::lock_guard lock(slot.mu);
  return reusable(slot, publication_epoch, image_id);
}

StatusOr<SlotState> StreamSlots::slot_state(uint32_t slot_index) const {
  NPURT_RETURN_IF_ERROR(check_slot_index(slot_index).with_context("slot_state"));
  const Slot& slot = slots_[slot_index];
  std::lock_guard lock(slot.mu);
  return static_cast<const SlotState&>(slot);
}

StreamSlotStats StreamSlots::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

}  // namespace npurt::exec
