// CoherenceMap: which side of a buffer holds the newest bytes, per byte range.
//
// Every Buffer owns one map covering [0, size). Each byte is in exactly one of
// four states; adjacent bytes in the same state form one segment, and adjacent
// segments always differ (the map is kept coalesced after every mutation), so the
// segment list is canonical: two maps describing the same per-byte states have the
// same segments.
//
// Cost model. A buffer is usually in one state as a whole (all both-valid in steady
// state, all host-newer right after the host filled it). That case is stored as a
// single state with no segment list: queries and no-op transitions are O(1) and
// allocate nothing. Mixed buffers keep a sorted vector of segment starts; real
// buffers have a handful of segments (one per view that diverged), for which a
// vector beats a node-based map. Mutations are O(segments); queries are
// O(log segments + pieces visited).
//
// Ranges are half-open byte ranges [begin, end) with begin <= end <= size();
// violating that is an npurt bug (views are validated before they reach here) and
// aborts. Empty ranges are no-ops.
//
// Threading: thread-compatible (const methods may run concurrently; any mutation
// needs exclusive access). The owning Buffer serializes access.
#pragma once

#include <cstdint>
#include <vector>

#include "npurt/base/status.h"

namespace npurt {

// A half-open byte range [begin, end).
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

enum class CoherenceState : uint8_t {
  kUninitialized,  // neither side was ever written: nothing to move in either direction
  kHostNewer,      // the host mirror holds bytes the device copy lacks
  kDeviceNewer,    // the device copy holds bytes the host mirror lacks
  kBothValid,      // both copies hold the same, newest bytes
};

const char* coherence_state_name(CoherenceState state);

class CoherenceMap {
 public:
  using State = CoherenceState;

  // A map of `size` bytes, all kUninitialized.
  explicit CoherenceMap(uint64_t size);

  uint64_t size() const { return size_; }

  // Sets every byte of [begin, end) to `state`.
  void set(uint64_t begin, uint64_t end, State state);

  // State of the byte at `offset` (< size()).
  State state_at(uint64_t offset) const;

  // True when all bytes share one state, stored into *state when non-null.
  // A zero-sized map is uniform kUninitialized.
  bool is_uniform(State* state = nullptr) const;

  // Number of maximal same-state segments: 1 for a uniform non-empty map, 0 for a
  // zero-sized one. Exposed so tests can check coalescing and the fast path.
  size_t segment_count() const;

  // Calls f(piece_begin, piece_end, state) for each segment intersecting
  // [begin, end), clipped to it, in increasing order. Consecutive pieces have
  // different states. The map must not be mutated from inside f.
  template <typename F>
  void for_each_in(uint64_t begin, uint64_t end, F&& f) const;

  // ---- Transitions used by Buffer -------------------------------------------

  // The host wrote [begin, end): those bytes are now newest on the host.
  void host_written(uint64_t begin, uint64_t end) { set(begin, end, State::kHostNewer); }
  // The device wrote [begin, end): those bytes are now newest on the device.
  void device_written(uint64_t begin, uint64_t end) { set(begin, end, State::kDeviceNewer); }

  // Maximal sub-ranges of [begin, end) that must be copied host -> device before
  // the device reads them: exactly the host-newer bytes. Uninitialized bytes are
  // not included: neither side ever wrote them, so there is nothing to move.
  // Returns an empty vector (no allocation) when there is nothing to upload.
  std::vector<ByteRange> ranges_to_upload(uint64_t begin, uint64_t end) const {
    return ranges_in_state(begin, end, State::kHostNewer);
  }
  // Maximal sub-ranges of [begin, end) that must be copied device -> host before
  // the host reads them: exactly the device-newer bytes.
  std::vector<ByteRange> ranges_to_download(uint64_t begin, uint64_t end) const {
    return ranges_in_state(begin, end, State::kDeviceNewer);
  }

  // After a copy made both sides agree on [begin, end): host-newer and
  // device-newer bytes there become both-valid. Uninitialized bytes stay
  // uninitialized (a copy of never-written bytes does not initialize them).
  void mark_synced(uint64_t begin, uint64_t end);

  // Maximal sub-ranges of [begin, end) whose bytes are in `state`.
  std::vector<ByteRange> ranges_in_state(uint64_t begin, uint64_t end, State state) const;

 private:
  // One segment: it starts at `begin` and ends where the next one starts (or at
  // size_ for the last one).
  struct Run {
    uint64_t begin;
    State state;
  };

  void check_range(uint64_t begin, uint64_t end) const;
  // Switches to the explicit segment list (a single run) if uniform.
  void materialize();
  // Returns to the uniform representation if only one segment is left.
  void collapse_if_uniform();
  // Index of the run containing `offset` (< size_), explicit representation only.
  size_t run_index(uint64_t offset) const;
  // Makes a run start exactly at `offset` (< size_) and returns its index.
  size_t split_at(uint64_t offset);
  // First run index at or after `offset`, splitting so the runs before it end at
  // `offset` exactly; returns runs_.size() for offset == size_.
  size_t boundary(uint64_t offset);
  // Merges equal neighbours among runs [first, last] (indices clamped).
  void coalesce(size_t first, size_t last);
  uint64_t run_end(size_t i) const { return i + 1 < runs_.size() ? runs_[i + 1].begin : size_; }

  uint64_t size_;
  // The whole map's state when runs_ is empty (the fast path). Otherwise unused.
  State uniform_ = State::kUninitialized;
  // Explicit segments, sorted by begin, runs_[0].begin == 0, neighbours differ,
  // and at least two of them. Capacity is kept when collapsing back to uniform so
  // a buffer that oscillates between uniform and mixed stops allocating.
  std::vector<Run> runs_;
};

template <typename F>
void CoherenceMap::for_each_in(uint64_t begin, uint64_t end, F&& f) const {
  check_range(begin, end);
  if (begin == end) return;
  if (runs_.empty()) {
    f(begin, end, uniform_);
    return;
  }
  for (size_t i = run_index(begin); i < runs_.size() && runs_[i].begin < end; ++i) {
    const uint64_t piece_begin = runs_[i].begin > begin ? runs_[i].begin : begin;
    const uint64_t piece_end = run_end(i) < end ? run_end(i) : end;
    f(piece_begin, piece_end, runs_[i].state);
  }
}

}  // namespace npurt
