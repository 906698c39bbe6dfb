#include "memory/raw_writes.h"

#include <algorithm>

namespace npurt::memory_detail {
namespace {

// The calling thread's scan-once scope: which RawWrites it is for, and the buffers
// whose raw writes it collected so far.
struct ScanOnce {
  const RawWrites* owner = nullptr;
  std::vector<const BufferState*> scanned;
};
thread_local ScanOnce t_scan_once;

}  // namespace

bool RawWrites::begin_scan_once() {
  if (t_scan_once.owner != nullptr) return false;
  t_scan_once.owner = this;
  t_scan_once.scanned.clear();
  return true;
}

void RawWrites::end_scan_once() {
  if (t_scan_once.owner != this) return;
  t_scan_once.owner = nullptr;
  t_scan_once.scanned.clear();
}

Status RawWrites::absorb(BufferState& b, ByteRange r) {
  if (!b.tracker || r.begin >= r.end) return ok_status();
  if (t_scan_once.owner == this) return absorb_once(b);
  return collect(b, floor_to(r.begin, page_), std::min(ceil_to(r.end, page_), b.mirror_bytes));
}

Status RawWrites::absorb_once(BufferState& b) {
  constexpr uint64_t kJoinGap = 1 << 20;
  std::vector<const BufferState*>& scanned = t_scan_once.scanned;
  if (std::find(scanned.begin(), scanned.end(), &b) != scanned.end()) return ok_status();
  scanned.push_back(&b);
  // The pages holding any byte that is not device-newer. A raw write into
  // device-newer bytes loses to the device's anyway (record() only counts it), so
  // their pages, the weights whose host copy was dropped among them, are left for a
  // later scan that needs them: a host read fetching those bytes collects them first.
  std::vector<ByteRange>& spans = once_spans_;
  spans.clear();
  b.map.for_each_in(0, b.size, [&](uint64_t s, uint64_t e, CoherenceState state) {
    if (state == CoherenceState::kDeviceNewer) return;
    const uint64_t first = floor_to(s, page_), last = std::min(ceil_to(e, page_), b.mirror_bytes);
    // Spans a few device-newer pages apart are scanned as one: a page walk is cheaper
    // than a system call.
    if (!spans.empty() && spans.back().end + kJoinGap >= first) {
      spans.back().end = std::max(spans.back().end, last);
    } else {
      spans.push_back({first, last});
    }
  });
  for (const ByteRange& span : spans) NPURT_RETURN_IF_ERROR(collect(b, span.begin, span.end));
  return ok_status();
}

Status RawWrites::collect(BufferState& b, uint64_t first, uint64_t last) {
  dirty_.clear();
  Status s = b.tracker->take_dirty(first, last, &dirty_);
  for (const ByteRange& d : dirty_) {
    stats_->tracked_pages_collected += d.size() / page_;
    record(b, {d.begin, std::min(d.end, b.size)});
  }
  NPURT_RETURN_IF_ERROR_CTX(s, "collecting raw writes to " + buffer_text(b));
  return ok_status();
}

void RawWrites::record(BufferState& b, ByteRange r) {
  if (r.begin >= r.end) return;
  pieces_.clear();
  uint64_t counted = 0;  // pages below this one were counted as conflicts
  b.map.for_each_in(r.begin, r.end, [&](uint64_t s, uint64_t e, CoherenceState state) {
    if (state == CoherenceState::kDeviceNewer) {
      const uint64_t first = std::max(floor_to(s, page_), counted);
      counted = ceil_to(e, page_);
      if (first < counted) stats_->tracked_conflict_pages += (counted - first) / page_;
    } else if (state != CoherenceState::kHostNewer) {
      pieces_.push_back({s, e});
    }
  });
  for (const ByteRange& p : pieces_) b.map.host_written(p.begin, p.end);
}

StatusOr<GuardMargins> RawWrites::open_guard(BufferState& b, ByteRange r) {
  // Raw writes made so far are recorded now, so that pages dirtied while the guard
  // is held are explained by the guard (its view) and the margins' differences only.
  NPURT_RETURN_IF_ERROR(absorb(b, r));
  GuardMargins m;
  m.head_begin = floor_to(r.begin, page_);
  m.tail_end = std::min(ceil_to(r.end, page_), b.size);
  m.head.assign(b.mirror + m.head_begin, b.mirror + r.begin);
  if (r.end < m.tail_end) m.tail.assign(b.mirror + r.end, b.mirror + m.tail_end);
  return m;
}

void RawWrites::close_guard(BufferState& b, ByteRange r, const GuardMargins* margins) {
  const uint64_t first = floor_to(r.begin, page_);
  const uint64_t last = std::min(ceil_to(r.end, page_), b.mirror_bytes);
  dirty_.clear();
  if (!b.tracker->take_dirty(first, last, &dirty_).ok()) {
    // Cannot tell what was written around the view: assume everything was.
    record(b, {first, std::min(last, b.size)});
    return;
  }
  if (margins == nullptr) {
    for (const ByteRange& d : dirty_) record(b, {d.begin, std::min(d.end, b.size)});
    return;
  }
  const uint64_t tail_page = floor_to(r.end, page_);
  for (const ByteRange& d : dirty_) {
    if (!margins->head.empty() && d.begin <= margins->head_begin && margins->head_begin < d.end) {
      record_changed_bytes(b, margins->head_begin, margins->head);
    }
    if (!margins->tail.empty() && d.begin <= tail_page && tail_page < d.end) {
      record_changed_bytes(b, r.end, margins->tail);
    }
  }
}

void RawWrites::record_changed_bytes(BufferState& b, uint64_t begin, std::span<const uint8_t> before) {
  const uint8_t* now = b.mirror + begin;
  for (size_t i = 0; i < before.size(); ++i) {
    if (now[i] == before[i]) continue;
    size_t j = i + 1;
    while (j < before.size() && now[j] != before[j]) ++j;
    b.map.host_written(begin + i, begin + j);
    i = j;  // now[j] == before[j], or the end
  }
}

}  // namespace npurt::memory_detail
