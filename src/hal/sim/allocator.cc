#include "hal/sim/allocator.h"

#include <string>

#include "npurt/base/math.h"

namespace npurt::sim {

GmAllocator::GmAllocator(uint64_t base, uint64_t size) : base_(base), size_(size) {
  insert_free(base_, size_, 0);
}

void GmAllocator::insert_free(uint64_t addr, uint64_t size, uint64_t seq) {
  FreeBlock b{size, seq};
  free_by_addr_.emplace(addr, b);
  free_by_fit_.insert(fit_key(addr, b));
}

void GmAllocator::erase_free(std::map<uint64_t, FreeBlock>::iterator it) {
  free_by_fit_.erase(fit_key(it->first, it->second));
  free_by_addr_.erase(it);
}

StatusOr<uint64_t> GmAllocator::allocate(uint64_t bytes, uint64_t alignment) {
  if (bytes == 0) return invalid_argument("device allocation of 0 bytes");
  if (!is_pow2(alignment) || alignment > 4096) {
    return invalid_argument("device allocation alignment " + std::to_string(alignment) +
                            " is not a power of two <= 4096");
  }
  if (bytes > size_) {
    return resource_exhausted("device allocation of " + std::to_string(bytes) +
                              " bytes exceeds global memory of " + std::to_string(size_));
  }
  const uint64_t need = round_up(bytes, kGranule);
  alignment = std::max(alignment, kGranule);
  // Walk candidates from the best fit upward; the first whose aligned start fits wins.
  for (auto fit = free_by_fit_.lower_bound({need, 0, 0}); fit != free_by_fit_.end(); ++fit) {
    const auto [size, inv_seq, addr] = *fit;
    const uint64_t start = round_up(addr, alignment);
    const uint64_t pad = start - addr;
    if (pad + need > size) continue;
    auto it = free_by_addr_.find(addr);
    const uint64_t seq = it->second.freed_seq;
    erase_free(it);
    if (pad > 0) insert_free(addr, pad, seq);
    if (size > pad + need) insert_free(start + need, size - pad - need, seq);
    live_.emplace(start, LiveBlock{need, bytes});
    in_use_ += need;
    return start;
  }
  return resource_exhausted("device out of memory: no free block of " + std::to_string(need) +
                            " bytes (in use " + std::to_string(in_use_) + " of " +
                            std::to_string(size_) + ")");
}

Status GmAllocator::free(uint64_t addr) {
  auto live = live_.find(addr);
  if (live == live_.end()) return not_found("free of " + hex(addr) + ": not a live device allocation");
  uint64_t start = addr;
  uint64_t size = live->second.size;
  in_use_ -= size;
  live_.erase(live);
  // Coalesce with free neighbours so large blocks become available again.
  auto next = free_by_addr_.find(start + size);
  if (next != free_by_addr_.end()) {
    size += next->second.size;
    erase_free(next);
  }
  auto prev = free_by_addr_.lower_bound(start);
  if (prev != free_by_addr_.begin()) {
    --prev;
    if (prev->first + prev->second.size == start) {
      start = prev->first;
      size += prev->second.size;
      erase_free(prev);
    }
  }
  insert_free(start, size, next_seq_++);
  return ok_status();
}

std::optional<GmAllocator::Block> GmAllocator::live_block_containing(uint64_t addr,
                                                                    uint64_t bytes) const {
  auto it = live_.upper_bound(addr);
  if (it == live_.begin()) return std::nullopt;
  --it;
  const uint64_t begin = it->first;
  const uint64_t end = begin + it->second.requested;
  if (addr < begin || addr > end || bytes > end - addr) return std::nullopt;
  return Block{begin, it->second.requested};
}

}  // namespace npurt::sim
