// BufferState: one buffer's bytes and bookkeeping, shared by its Buffer, views and
// guards (buffer.h, host_access.h), which keep it (and through it the memory core
// and the device) alive.
//
// The const members are set at creation; the rest is guarded by the core's mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "memory/dep_map.h"
#include "memory/rules.h"
#include "npurt/hal/ids.h"
#include "npurt/memory/coherence_map.h"
#include "npurt/memory/write_tracker.h"

namespace npurt::memory_detail {

class MemoryCore;

struct BufferState {
  BufferState(std::shared_ptr<MemoryCore> owner, std::string buffer_name, uint64_t bytes, uint8_t* mirror_ptr,
              uint64_t mirror_length, hal::DeviceAddr addr)
      : core(std::move(owner)),
        name(std::move(buffer_name)),
        size(bytes),
        mirror(mirror_ptr),
        mirror_bytes(mirror_length),
        device_addr(addr) {}
  ~BufferState();  // unmaps the mirror

  const std::shared_ptr<MemoryCore> core;
  const std::string name;
  const uint64_t size;
  uint8_t* const mirror;
  const uint64_t mirror_bytes;  // size rounded up to whole pages
  const hal::DeviceAddr device_addr;
  std::atomic<bool> tracked{false};

  // Guarded by the core's mutex.
  bool freed = false;
  const char* freed_reason = "";
  CoherenceMap map{size};
  DepMap deps{size};
  std::optional<PageWriteTracker> tracker;
  NaiveFlags naive;
  size_t live_index = 0;  // position in BufferTable's live list
};

// Text for errors.
std::string range_text(uint64_t begin, uint64_t end);
inline std::string range_text(ByteRange r) { return range_text(r.begin, r.end); }
inline std::string buffer_text(const BufferState& b) { return "buffer '" + b.name + "'"; }

// Page arithmetic (`page` a power of two).
inline uint64_t floor_to(uint64_t v, uint64_t page) { return v & ~(page - 1); }
inline uint64_t ceil_to(uint64_t v, uint64_t page) { return (v + page - 1) & ~(page - 1); }

}  // namespace npurt::memory_detail
