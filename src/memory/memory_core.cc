#include "memory/memory_core.h"

#include "npurt/base/hazards.h"

namespace npurt::memory_detail {

MemoryCore::MemoryCore(std::shared_ptr<hal::Device> dev, MemoryOptions opts)
    : device(std::move(dev)),
      options(opts),
      page(PageWriteTracker::page_size()),
      naive_coherence(hazard_on(Hazard::kNaiveCoherence)),
      fences(*device),
      coherence(make_coherence_rules(naive_coherence)),
      ordering(make_ordering_rules(!hazard_on(Hazard::kUnorderedConflicts), fences)),
      buffers(this, device, fences, stats),
      raw_writes(page, stats),
      // The naive flags keep no ranges to resend.
      planner(buffers, fences, raw_writes, *coherence, *ordering,
              !naive_coherence && !hazard_on(Hazard::kNoResendOfFailedUploads)),
      executor(*device, fences, *coherence, stats, options.max_pooled_staging_bytes,
               !hazard_on(Hazard::kLaunchesDropTheirCode)) {}

Status MemoryCore::open() {
  std::lock_guard<std::mutex> lock(mu);
  // Transfers run no code: a pool without a registry, replaced only after a failure.
  NPURT_ASSIGN_OR_RETURN(std::unique_ptr<exec::StreamPool> transfers,
                         exec::StreamPool::make(exec::FactoryKey(), "memory context transfers", device, nullptr));
  executor.set_transfers(std::move(transfers));
  return ok_status();
}

void MemoryCore::close() {
  std::lock_guard<std::mutex> lock(mu);
  if (buffers.closed()) return;
  fences.wait_all().ignore();
  buffers.close();
  executor.close();
  fences.destroy();
}

Status MemoryCore::free_buffer(BufferState& b) {
  std::lock_guard<std::mutex> lock(mu);
  return buffers.free(b);
}

Status MemoryCore::enable_tracking(BufferState& b, WriteTrackingMechanism mechanism) {
  std::lock_guard<std::mutex> lock(mu);
  const std::string what = "enable_tracking for " + buffer_text(b);
  NPURT_RETURN_IF_ERROR(buffers.check_open().with_context(what));
  if (b.freed) return failed_precondition(what + ": " + b.freed_reason);
  if (!coherence->sees_raw_writes()) {
    b.tracked = true;
    return ok_status();
  }
  if (b.tracker) return ok_status();
  auto tracker = PageWriteTracker::create(b.mirror, b.mirror_bytes, {mechanism});
  if (!tracker.ok()) return tracker.status().with_context(what);
  NPURT_RETURN_IF_ERROR(tracker->arm().with_context(what));
  b.tracker.emplace(std::move(tracker).value());
  b.tracked = true;
  return ok_status();
}

StatusOr<WriteGuard> MemoryCore::open_write_guard(const View& view, const char* what) {
  BufferState& b = *state_of(view);
  WriteGuard guard(view);
  if (b.tracker) {
    const ByteRange r{view.offset(), view.end()};
    StatusOr<GuardMargins> margins = raw_writes.open_guard(b, r);
    NPURT_RETURN_IF_ERROR_CTX(margins.status(), std::string(what) + " of " + buffer_text(b) + " " + range_text(r));
    guard.twinned_ = true;
    guard.head_begin_ = margins->head_begin;
    guard.tail_end_ = margins->tail_end;
    guard.head_ = std::move(margins->head);
    guard.tail_ = std::move(margins->tail);
  }
  guard.active_ = true;
  return guard;
}

void MemoryCore::release(WriteGuard& guard) {
  std::lock_guard<std::mutex> lock(mu);
  BufferState& b = *state_of(guard.view_);
  if (buffers.closed() || b.freed) return;
  const ByteRange r{guard.view_.offset(), guard.view_.end()};
  if (b.tracker) {
    GuardMargins margins;
    if (guard.twinned_) {
      margins.head_begin = guard.head_begin_;
      margins.tail_end = guard.tail_end_;
      margins.head = std::move(guard.head_);
      margins.tail = std::move(guard.tail_);
    }
    // Tracking turned on while the guard was held: no copy to compare with.
    raw_writes.close_guard(b, r, guard.twinned_ ? &margins : nullptr);
  }
  coherence->on_host_write(b, r);
}

}  // namespace npurt::memory_detail
