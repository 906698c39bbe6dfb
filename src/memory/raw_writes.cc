#include "memory/raw_writes.h"

#include <algorithm>

namespace npurt::memory_detail {

Status RawWrites::absorb(BufferState& b, ByteRange r) {
  if (!b.tracker || r.begin >= r.end) return ok_status();
  const uint64_t first = floor_to(r.begin, page_);
  const uint64_t last = std::min(ceil_to(r.end, page_), b.mirror_bytes);
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
