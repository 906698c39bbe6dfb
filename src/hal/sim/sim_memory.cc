#include "hal/sim/sim_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "npurt/base/trace.h"

namespace npurt::sim {
namespace {

using hal::Counters;
using hal::DeviceAddr;
using hal::FaultSite;

constexpr uint64_t kGmBase = 0x1'0000'0000ull;  // device addresses never start at 0

// Commits the host pages behind [p, p + bytes). A real device's memory exists once it
// is allocated; left to first touch, the host would zero each page inside whichever
// kernel or copy touched it first (a 512-token prefill's first chunk spent a third of
// a layer there), so device timings would depend on whether a buffer was new. Pages
// of freed blocks stay committed, so reallocation costs nothing. A hint: kernels
// without MADV_POPULATE_WRITE fall back to first touch.
void commit_pages(uint8_t* p, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  constexpr uintptr_t kPage = 4096;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes + kPage - 1) & ~(kPage - 1);
  madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

StatusOr<GlobalMemory> SimMemory::reserve(const hal::SimOptions& options) {
  void* gm = mmap(nullptr, options.global_memory_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (gm == MAP_FAILED) return resource_exhausted("cannot reserve simulated global memory");
  // Device memory is mapped with large pages on real accelerators; here it keeps the
  // cores' weight streams from stalling on page walks (a hint: ignored where
  // transparent huge pages are off).
  madvise(gm, options.global_memory_bytes, MADV_HUGEPAGE);
  void* shadow = nullptr;
  if (options.sanitize) {
    shadow = mmap(nullptr, options.global_memory_bytes / 8, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (shadow == MAP_FAILED) {
      munmap(gm, options.global_memory_bytes);
      return resource_exhausted("cannot reserve sanitizer shadow memory");
    }
  }
  GlobalMemory m;
  m.host = static_cast<uint8_t*>(gm);
  m.base_addr = kGmBase;
  m.size = options.global_memory_bytes;
  m.shadow = static_cast<uint64_t*>(shadow);
  return m;
}

SimMemory::SimMemory(const GlobalMemory& gm, SimCounters& counters, FaultInjector& faults)
    : gm_(gm), counters_(counters), faults_(faults), alloc_(gm.base_addr, gm.size) {}

SimMemory::~SimMemory() {
  munmap(gm_.host, gm_.size);
  if (gm_.shadow) munmap(gm_.shadow, gm_.size / 8);
}

StatusOr<DeviceAddr> SimMemory::allocate(uint64_t bytes, uint64_t alignment) {
  if (auto f = faults_.draw(FaultSite::kAllocate)) {
    return injected_error(counters_, faults_, *f, StatusCode::kResourceExhausted,
                          "allocate " + std::to_string(bytes) + " bytes");
  }
  StatusOr<uint64_t> addr = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return alloc_.allocate(bytes, alignment);
  }();
  NPURT_RETURN_IF_ERROR(addr.status());
  commit_pages(gm_.ptr(*addr), bytes);
  counters_.bump([&](Counters& c) {
    ++c.allocations;
    c.allocated_bytes += bytes;
  });
  return DeviceAddr(*addr);
}

Status SimMemory::free(DeviceAddr addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto block = alloc_.live_block_containing(addr, 0);
  NPURT_RETURN_IF_ERROR(alloc_.free(addr.value()));
  // Freed bytes are garbage to their next owner.
  if (block) gm_.mark_uninitialized(block->addr, block->bytes);
  counters_.bump([&](Counters& c) {
    ++c.frees;
    c.freed_bytes += block ? block->bytes : 0;
  });
  return ok_status();
}

Status SimMemory::upload_code(DeviceAddr dst, const isa::Image& image) {
  const auto bytes = image.bytes();
  NPURT_RETURN_IF_ERROR(check_range(dst, bytes.size(), "upload_code destination"));
  const double t0 = trace::enabled() ? trace::now_us() : 0;
  std::memcpy(gm_.ptr(dst), bytes.data(), bytes.size());
  gm_.mark_initialized(dst, bytes.size());
  counters_.bump([&](Counters& c) {
    ++c.code_uploads;
    c.code_upload_bytes += bytes.size();
  });
  if (trace::enabled()) {
    trace::complete("device", "upload code " + image.name(), "code", t0, trace::now_us(),
                    {{"addr", hex(dst)}, {"bytes", bytes.size()}});
  }
  return ok_status();
}

StatusOr<uint8_t*> SimMemory::host_address(DeviceAddr addr, uint64_t bytes, bool writes) {
  NPURT_RETURN_IF_ERROR(check_range(addr, std::max<uint64_t>(bytes, 1), "host_address"));
  if (writes) gm_.mark_initialized(addr, bytes);
  return gm_.ptr(addr);
}

Status SimMemory::check_range(DeviceAddr addr, uint64_t bytes, std::string_view what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!alloc_.live_block_containing(addr, bytes)) {
    return out_of_range(std::string(what) + ": [" + hex(addr) + ", +" + std::to_string(bytes) +
                        ") is not inside one live device allocation");
  }
  return ok_status();
}

std::optional<GmAllocator::Block> SimMemory::live_block_containing(DeviceAddr addr, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return alloc_.live_block_containing(addr, bytes);
}

}  // namespace npurt::sim
