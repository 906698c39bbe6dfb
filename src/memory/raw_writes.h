// RawWrites: tracked mode's raw writes (caught per page by a buffer's
// PageWriteTracker) recorded in the buffer's coherence map.
//
// The bytes of a dirty page become host-newer, except device-newer bytes: a raw write
// into them cannot be told apart from the stale bytes around it, so the device's
// bytes win (MemoryStats::tracked_conflict_pages). A write guard's pages are
// explained by the guard itself: its view is host-newer when it is released, and
// the bytes around the view on its first and last page ("margins", copied when the
// guard was taken) count only where they changed.
//
// Not thread-safe: the core's mutex serializes every call (the scan-once scope is
// the calling thread's own).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/buffer_state.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

// The mirror bytes outside a guard's view on the view's first and last page.
struct GuardMargins {
  uint64_t head_begin = 0;  // the first page's start; head: [head_begin, view begin)
  uint64_t tail_end = 0;    // tail: [view end, tail_end)
  std::vector<uint8_t> head;
  std::vector<uint8_t> tail;
};

class RawWrites {
 public:
  RawWrites(uint64_t page, MemoryStats& stats) : page_(page), stats_(&stats) {}

  // Records the dirty pages overlapping `r` as host writes and protects them again.
  // Inside this thread's scan-once scope: those of every page of the buffer that
  // holds a byte not device-newer, at its first use in the scope, and nothing at
  // later uses.
  Status absorb(BufferState& b, ByteRange r);
  // The calling thread's scan-once scope (MemoryContext::RawWriteScan): false, and
  // nothing changes, when one is already active on this thread.
  bool begin_scan_once();
  void end_scan_once();
  // Raw bytes `r` may have been written: host-newer, except device-newer bytes.
  void record(BufferState& b, ByteRange r);

  // A write guard over `r` of tracked buffer `b` starts: earlier raw writes are
  // recorded now, and the margins copied.
  StatusOr<GuardMargins> open_guard(BufferState& b, ByteRange r);
  // The guard ends: what changed around its view is recorded (`margins` null when
  // tracking began while the guard was held: every dirty page counts then). The
  // view itself is the caller's to record.
  void close_guard(BufferState& b, ByteRange r, const GuardMargins* margins);

 private:
  // absorb() inside a scan-once scope.
  Status absorb_once(BufferState& b);
  // Records the dirty pages in [first, last) (page-aligned) and protects them again.
  Status collect(BufferState& b, uint64_t first, uint64_t last);
  // Records host writes to the bytes from `begin` on that differ from `before`.
  void record_changed_bytes(BufferState& b, uint64_t begin, std::span<const uint8_t> before);

  const uint64_t page_;
  MemoryStats* const stats_;
  // Scratch reused by every call, so steady state allocates nothing.
  std::vector<ByteRange> dirty_;
  std::vector<ByteRange> pieces_;
  std::vector<ByteRange> once_spans_;
};

}  // namespace npurt::memory_detail
