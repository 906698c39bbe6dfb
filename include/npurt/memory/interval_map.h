// IntervalMap<State>: a State for every byte of [0, size), as maximal segments.
//
// Adjacent segments always differ (the map is coalesced after every mutation), so
// the segment list is canonical. A map in one state as a whole (the common case) is
// stored as that state alone: queries and no-op updates are O(1) and allocate
// nothing. Mixed maps keep a sorted vector of segment starts (real buffers have a
// handful of segments, for which a vector beats a node-based map), which keeps its
// capacity when the map becomes uniform again. Mutations are O(segments), queries
// O(log segments + pieces visited). Ranges are half-open, begin <= end <= size()
// (violating that is an npurt bug and aborts); empty ranges are no-ops. State needs
// operator==. Thread-compatible: the owner serializes mutations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "npurt/base/status.h"

namespace npurt {

template <typename State>
class IntervalMap {
 public:
  explicit IntervalMap(uint64_t size, State initial = State{}) : size_(size), uniform_(initial) {}

  uint64_t size() const { return size_; }

  // True when all bytes share one state, stored into *state when non-null.
  bool is_uniform(State* state = nullptr) const {
    if (!runs_.empty()) return false;
    if (state != nullptr) *state = uniform_;
    return true;
  }
  // Maximal segments: 1 for a uniform non-empty map, 0 for a zero-sized one.
  size_t segment_count() const { return size_ == 0 ? 0 : std::max<size_t>(1, runs_.size()); }

  const State& state_at(uint64_t offset) const {
    NPURT_CHECK(offset < size_);
    return runs_.empty() ? uniform_ : runs_[run_index(offset)].state;
  }

  // Calls f(piece_begin, piece_end, state) for each segment intersecting
  // [begin, end), clipped to it, in increasing order. f must not mutate the map.
  template <typename F>
  void for_each_in(uint64_t begin, uint64_t end, F&& f) const {
    check_range(begin, end);
    if (begin == end) return;
    if (runs_.empty()) return (void)f(begin, end, uniform_);
    for (size_t i = run_index(begin); i < runs_.size() && runs_[i].begin < end; ++i) {
      f(std::max(runs_[i].begin, begin), std::min(run_end(i), end), runs_[i].state);
    }
  }

  // Applies mutate(state) once to every segment of [begin, end), split at the
  // range's ends, then merges equal neighbours.
  template <typename F>
  void update(uint64_t begin, uint64_t end, F&& mutate) {
    check_range(begin, end);
    if (begin == end) return;
    if (runs_.empty()) {
      if (begin == 0 && end == size_) return (void)mutate(uniform_);
      State s = uniform_;
      mutate(s);
      if (s == uniform_) return;
      runs_.push_back({0, uniform_});
      const size_t i = split_at(begin);
      boundary(end);
      runs_[i].state = std::move(s);  // differs from both neighbours
      return;
    }
    const size_t first = boundary(begin);
    const size_t last = boundary(end);
    for (size_t i = first; i < last; ++i) mutate(runs_[i].state);
    coalesce(first == 0 ? 0 : first - 1, last);
  }

  void set(uint64_t begin, uint64_t end, const State& state) {
    update(begin, end, [&](State& s) { s = state; });
  }

 private:
  // A segment starts at `begin` and ends where the next one starts (or at size_).
  struct Run {
    uint64_t begin;
    State state;
  };

  void check_range(uint64_t begin, uint64_t end) const {
    NPURT_CHECK(begin <= end && end <= size_);
  }
  uint64_t run_end(size_t i) const { return i + 1 < runs_.size() ? runs_[i + 1].begin : size_; }
  // The run containing `offset` (< size_); runs_[0].begin == 0 guarantees one.
  size_t run_index(uint64_t offset) const {
    auto it = std::upper_bound(runs_.begin(), runs_.end(), offset,
                               [](uint64_t off, const Run& r) { return off < r.begin; });
    return static_cast<size_t>(it - runs_.begin()) - 1;
  }
  // Makes a run start exactly at `offset` (< size_); returns its index.
  size_t split_at(uint64_t offset) {
    const size_t i = run_index(offset);
    if (runs_[i].begin == offset) return i;
    runs_.insert(runs_.begin() + static_cast<ptrdiff_t>(i) + 1, Run{offset, runs_[i].state});
    return i + 1;
  }
  // The first run at or after `offset`; runs_.size() for offset == size_.
  size_t boundary(uint64_t offset) { return offset == size_ ? runs_.size() : split_at(offset); }
  // Merges equal neighbours among runs [first, last] (clamped); back to the uniform
  // representation when one run is left.
  void coalesce(size_t first, size_t last) {
    last = std::min(last, runs_.size() - 1);
    size_t kept = first;
    for (size_t i = first + 1; i <= last; ++i) {
      if (!(runs_[i].state == runs_[kept].state)) runs_[++kept] = runs_[i];
    }
    if (first < last) {
      runs_.erase(runs_.begin() + static_cast<ptrdiff_t>(kept) + 1,
                  runs_.begin() + static_cast<ptrdiff_t>(last) + 1);
    }
    if (runs_.size() == 1) {
      uniform_ = std::move(runs_[0].state);
      runs_.clear();  // keeps capacity on purpose
    }
  }

  uint64_t size_;
  State uniform_;          // the whole map's state while runs_ is empty
  std::vector<Run> runs_;  // sorted by begin, runs_[0].begin == 0, neighbours differ, >= 2
};

}  // namespace npurt
