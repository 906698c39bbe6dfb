// DepMap: per byte range of a buffer's device copy, the last device operation that
// writes it and the device operations that currently read it (as fences).
//
// A new operation conflicts with the writer when it reads or writes the bytes
// (read-after-write, write-after-write) and with the readers when it writes them
// (write-after-read). The map keeps at most one reader per stream: fences on one
// stream complete in order, so a newer reader on the same stream stands for the
// older one. Fences known to be done are dropped whenever a segment is updated,
// and equal neighbours are merged (IntervalMap), so a buffer has a handful of
// segments (about one per view used as a launch argument).
//
// Not thread-safe: the owning MemoryCore serializes access.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "memory/fence_table.h"
#include "npurt/memory/interval_map.h"

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

using DepMap = IntervalMap<DepState>;

}  // namespace npurt::memory_detail
