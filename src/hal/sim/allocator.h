// Global-memory allocator of the simulated NPU.
//
// Best fit, most recently freed first among equal sizes, adjacent free blocks
// coalesced. Fully deterministic: the same sequence of calls yields the same
// addresses, so address recycling (image B landing where image A was) is
// reproducible in tests. Not thread-safe; the device serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "npurt/base/status.h"
#include "npurt/hal/ids.h"

namespace npurt::sim {

class GmAllocator {
 public:
  static constexpr uint64_t kGranule = 256;  // block sizes and addresses are multiples

  GmAllocator(uint64_t base, uint64_t size);

  // alignment: a power of two <= 4096.
  StatusOr<uint64_t> allocate(uint64_t bytes, uint64_t alignment);
  Status free(uint64_t addr);

  struct Block {
    uint64_t addr;
    uint64_t bytes;  // as requested (what a kernel may touch)
  };
  // The live block containing [addr, addr + bytes), if any.
  std::optional<Block> live_block_containing(uint64_t addr, uint64_t bytes) const;
  std::optional<Block> live_block_containing(hal::DeviceAddr addr, uint64_t bytes) const {
    return live_block_containing(addr.value(), bytes);
  }
  uint64_t bytes_in_use() const { return in_use_; }
  size_t free_block_count() const { return free_by_addr_.size(); }

 private:
  struct FreeBlock {
    uint64_t size;
    uint64_t freed_seq;
  };
  struct LiveBlock {
    uint64_t size;       // rounded
    uint64_t requested;  // exact
  };
  // Ordered for best fit: smallest size, then most recently freed, then address.
  using FitKey = std::tuple<uint64_t, uint64_t, uint64_t>;  // size, ~freed_seq, addr
  static FitKey fit_key(uint64_t addr, const FreeBlock& b) { return {b.size, ~b.freed_seq, addr}; }

  void insert_free(uint64_t addr, uint64_t size, uint64_t seq);
  void erase_free(std::map<uint64_t, FreeBlock>::iterator it);

  uint64_t base_, size_;
  uint64_t next_seq_ = 1;
  uint64_t in_use_ = 0;
  std::map<uint64_t, FreeBlock> free_by_addr_;
  std::set<FitKey> free_by_fit_;
  std::map<uint64_t, LiveBlock> live_;
};

}  // namespace npurt::sim
