// CoherenceMap: which side of a buffer holds the newest bytes, per byte range.
//
// Every Buffer owns one map covering [0, size); each byte is in one of four states.
// The map is an IntervalMap (interval_map.h): coalesced, so its segments are
// canonical, and a buffer in one state as a whole (all both-valid in steady state,
// all host-newer right after the host filled it) costs O(1) per query and no-op
// transition and allocates nothing. Ranges violating begin <= end <= size() are an
// npurt bug (views are validated before they reach here) and abort.
//
// Threading: thread-compatible (const methods may run concurrently; any mutation
// needs exclusive access). The owning Buffer serializes access.
#pragma once

#include <cstdint>
#include <vector>

#include "npurt/memory/interval_map.h"

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

inline const char* coherence_state_name(CoherenceState state) {
  switch (state) {
    case CoherenceState::kUninitialized: return "uninitialized";
    case CoherenceState::kHostNewer: return "host-newer";
    case CoherenceState::kDeviceNewer: return "device-newer";
    case CoherenceState::kBothValid: return "both-valid";
  }
  return "unknown";
}

class CoherenceMap : public IntervalMap<CoherenceState> {
 public:
  using State = CoherenceState;

  // A map of `size` bytes, all kUninitialized. IntervalMap provides size(),
  // set(begin, end, state), state_at(offset), is_uniform(), segment_count() and
  // for_each_in(begin, end, f(piece_begin, piece_end, state)).
  explicit CoherenceMap(uint64_t size) : IntervalMap(size, State::kUninitialized) {}

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
  void mark_synced(uint64_t begin, uint64_t end) {
    auto one_sided = [](State s) { return s == State::kHostNewer || s == State::kDeviceNewer; };
    // Splitting and re-merging would leave the map unchanged when no byte is
    // one-sided; checking first keeps that common case (all both-valid) read-only.
    bool any = false;
    for_each_in(begin, end, [&](uint64_t, uint64_t, State s) { any |= one_sided(s); });
    if (any) update(begin, end, [&](State& s) { s = one_sided(s) ? State::kBothValid : s; });
  }

  // Maximal sub-ranges of [begin, end) whose bytes are in `state` (neighbouring
  // pieces always differ, so each matching piece is maximal).
  std::vector<ByteRange> ranges_in_state(uint64_t begin, uint64_t end, State state) const {
    std::vector<ByteRange> out;
    for_each_in(begin, end, [&](uint64_t b, uint64_t e, State s) {
      if (s == state) out.push_back({b, e});
    });
    return out;
  }
};

}  // namespace npurt
