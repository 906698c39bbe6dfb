// DepMap: per byte range of a buffer's device copy, the last device operation that
// writes it and the device operations that currently read it (as fences).
//
// A new operation conflicts with the writer when it reads or writes the bytes
// (read-after-write, write-after-write) and with the readers when it writes them
// (write-after-read). The map keeps at most one reader per stream: fences on one
// stream complete in order, so a newer reader on the same stream stands for the
// older one. Fences known to be done are dropped whenever a segment is updated,
// and equal neighbours are merged, so a buffer has a handful of segments (about
// one per view used as a launch argument).
//
// Not thread-safe: the owning MemoryCore serializes access.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "memory/fence_table.h"
#include "npurt/base/status.h"

namespace npurt::memory_detail {

struct DepState {
  static constexpr size_t kMaxReaders = 6;

  FenceRef writer;
  // Sorted, distinct; one per stream (see above).
  std::array<FenceRef, kMaxReaders> readers{};
  uint8_t num_readers = 0;

  friend bool operator==(const DepState& a, const DepState& b) {
    return a.writer == b.writer && a.num_readers == b.num_readers &&
           std::equal(a.readers.begin(), a.readers.begin() + a.num_readers, b.readers.begin());
  }
};

class DepMap {
 public:
  explicit DepMap(uint64_t size) : size_(size) { segs_.push_back({0, DepState{}}); }

  uint64_t size() const { return size_; }
  size_t segment_count() const { return segs_.size(); }

  // Calls f(state) for each segment intersecting [begin, end).
  template <typename F>
  void for_each_in(uint64_t begin, uint64_t end, F&& f) const {
    if (begin >= end) return;
    for (size_t i = index_of(begin); i < segs_.size() && segs_[i].begin < end; ++i) {
      f(segs_[i].state);
    }
  }

  // Applies mutate(state) to every segment of [begin, end) (split at the range's
  // ends first), then merges equal neighbours.
  template <typename F>
  void update(uint64_t begin, uint64_t end, F&& mutate) {
    if (begin >= end) return;
    const size_t first = split_at(begin);
    const size_t last = end >= size_ ? segs_.size() : split_at(end);
    for (size_t i = first; i < last; ++i) mutate(segs_[i].state);
    merge(first == 0 ? 0 : first - 1, last);
  }

 private:
  struct Seg {
    uint64_t begin;
    DepState state;
  };

  size_t index_of(uint64_t offset) const {
    auto it = std::upper_bound(segs_.begin(), segs_.end(), offset,
                               [](uint64_t off, const Seg& s) { return off < s.begin; });
    return static_cast<size_t>(it - segs_.begin()) - 1;
  }
  size_t split_at(uint64_t offset) {
    const size_t i = index_of(offset);
    if (segs_[i].begin == offset) return i;
    segs_.insert(segs_.begin() + static_cast<ptrdiff_t>(i) + 1, Seg{offset, segs_[i].state});
    return i + 1;
  }
  // Merges equal neighbours among segments [first, last] (clamped).
  void merge(size_t first, size_t last) {
    last = std::min(last, segs_.size() - 1);
    if (first >= last) return;
    size_t kept = first;
    for (size_t i = first + 1; i <= last; ++i) {
      if (!(segs_[i].state == segs_[kept].state)) segs_[++kept] = segs_[i];
    }
    segs_.erase(segs_.begin() + static_cast<ptrdiff_t>(kept) + 1,
                segs_.begin() + static_cast<ptrdiff_t>(last) + 1);
  }

  uint64_t size_;
  std::vector<Seg> segs_;  // sorted by begin, segs_[0].begin == 0, never empty
};

}  // namespace npurt::memory_detail
