#include "npurt/memory/coherence_map.h"

#include <algorithm>

namespace npurt {

const char* coherence_state_name(CoherenceState state) {
  switch (state) {
    case CoherenceState::kUninitialized: return "uninitialized";
    case CoherenceState::kHostNewer: return "host-newer";
    case CoherenceState::kDeviceNewer: return "device-newer";
    case CoherenceState::kBothValid: return "both-valid";
  }
  return "unknown";
}

CoherenceMap::CoherenceMap(uint64_t size) : size_(size) {}

void CoherenceMap::check_range(uint64_t begin, uint64_t end) const {
  NPURT_CHECK(begin <= end && end <= size_);
}

CoherenceMap::State CoherenceMap::state_at(uint64_t offset) const {
  NPURT_CHECK(offset < size_);
  if (runs_.empty()) return uniform_;
  return runs_[run_index(offset)].state;
}

bool CoherenceMap::is_uniform(State* state) const {
  if (!runs_.empty()) return false;
  if (state != nullptr) *state = uniform_;
  return true;
}

size_t CoherenceMap::segment_count() const {
  if (size_ == 0) return 0;
  return runs_.empty() ? 1 : runs_.size();
}

void CoherenceMap::set(uint64_t begin, uint64_t end, State state) {
  check_range(begin, end);
  if (begin == end) return;
  if (runs_.empty()) {
    if (state == uniform_) return;
    if (begin == 0 && end == size_) {
      uniform_ = state;
      return;
    }
    materialize();
  }
  const size_t first = boundary(begin);
  const size_t last = boundary(end);  // splits only at or after `first`
  runs_[first].state = state;
  runs_.erase(runs_.begin() + static_cast<ptrdiff_t>(first) + 1,
              runs_.begin() + static_cast<ptrdiff_t>(last));
  coalesce(first == 0 ? 0 : first - 1, first + 1);
  collapse_if_uniform();
}

void CoherenceMap::mark_synced(uint64_t begin, uint64_t end) {
  check_range(begin, end);
  auto is_one_sided = [](State s) { return s == State::kHostNewer || s == State::kDeviceNewer; };
  if (runs_.empty()) {
    // Uniform both-valid / uninitialized is the steady state: nothing to change.
    if (is_one_sided(uniform_)) set(begin, end, State::kBothValid);
    return;
  }
  // Splitting and re-merging would leave the map unchanged when no byte is
  // one-sided; checking first keeps that common case read-only.
  bool any_one_sided = false;
  for_each_in(begin, end, [&](uint64_t, uint64_t, State s) { any_one_sided |= is_one_sided(s); });
  if (!any_one_sided) return;

  const size_t first = boundary(begin);
  const size_t last = boundary(end);
  for (size_t i = first; i < last; ++i) {
    if (is_one_sided(runs_[i].state)) runs_[i].state = State::kBothValid;
  }
  coalesce(first == 0 ? 0 : first - 1, last);
  collapse_if_uniform();
}

std::vector<ByteRange> CoherenceMap::ranges_in_state(uint64_t begin, uint64_t end,
                                                     State state) const {
  std::vector<ByteRange> out;
  // Neighbouring pieces always differ in state, so each matching piece is
  // already maximal within [begin, end).
  for_each_in(begin, end, [&](uint64_t b, uint64_t e, State s) {
    if (s == state) out.push_back({b, e});
  });
  return out;
}

void CoherenceMap::materialize() {
  if (!runs_.empty()) return;
  runs_.push_back({0, uniform_});
}

void CoherenceMap::collapse_if_uniform() {
  if (runs_.size() != 1) return;
  uniform_ = runs_[0].state;
  runs_.clear();  // keeps capacity on purpose
}

size_t CoherenceMap::run_index(uint64_t offset) const {
  // The last run starting at or before offset; runs_[0].begin == 0 guarantees one.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), offset,
                             [](uint64_t off, const Run& r) { return off < r.begin; });
  return static_cast<size_t>(it - runs_.begin()) - 1;
}

size_t CoherenceMap::split_at(uint64_t offset) {
  const size_t i = run_index(offset);
  if (runs_[i].begin == offset) return i;
  runs_.insert(runs_.begin() + static_cast<ptrdiff_t>(i) + 1, Run{offset, runs_[i].state});
  return i + 1;
}

size_t CoherenceMap::boundary(uint64_t offset) {
  return offset == size_ ? runs_.size() : split_at(offset);
}

void CoherenceMap::coalesce(size_t first, size_t last) {
  if (runs_.empty()) return;
  last = std::min(last, runs_.size() - 1);
  if (first >= last) return;
  // Compact [first, last] in place, keeping the first run of each equal group.
  size_t kept = first;
  for (size_t i = first + 1; i <= last; ++i) {
    if (runs_[i].state != runs_[kept].state) runs_[++kept] = runs_[i];
  }
  runs_.erase(runs_.begin() + static_cast<ptrdiff_t>(kept) + 1,
              runs_.begin() + static_cast<ptrdiff_t>(last) + 1);
}

}  // namespace npurt
