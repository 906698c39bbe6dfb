#include "memory/buffer_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "npurt/base/math.h"

namespace npurt::memory_detail {

std::string range_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

BufferState::~BufferState() {
  tracker.reset();  // unprotects the mirror before it goes
  munmap(mirror, mirror_bytes);
}

Status BufferTable::check_open() const {
  if (closed_) return failed_precondition("its memory context is closed");
  return ok_status();
}

Status BufferTable::view_error(const BufferState* state, ByteRange range) const {
  if (state == nullptr) return failed_precondition("view is not attached to a buffer");
  const BufferState& b = *state;
  auto what = [&] { return "view " + range_text(range) + " of " + buffer_text(b); };
  if (b.core.get() != owner_) return invalid_argument(what() + " belongs to another memory context");
  if (b.freed) return failed_precondition(what() + ": " + b.freed_reason);
  NPURT_RETURN_IF_ERROR_CTX(check_open(), what());
  return ok_status();
}

StatusOr<std::shared_ptr<BufferState>> BufferTable::create(std::shared_ptr<MemoryCore> core,
                                                           const std::string& name, uint64_t bytes,
                                                           uint64_t alignment) {
  const std::string what = "create_buffer '" + name + "'";
  if (bytes == 0) return invalid_argument(what + ": size must be > 0");
  if (!is_pow2(alignment) || alignment > 4096) {
    return invalid_argument(what + ": alignment " + std::to_string(alignment) + " is not a power of two <= 4096");
  }
  if (bytes > std::numeric_limits<uint64_t>::max() - page_) {
    return invalid_argument(what + ": size " + std::to_string(bytes) + " is too large");
  }
  NPURT_RETURN_IF_ERROR(check_open().with_context(what));
  reap_deferred_frees();
  const uint64_t mirror_bytes = ceil_to(bytes, page_);
  void* mirror = mmap(nullptr, mirror_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mirror == MAP_FAILED) {
    return resource_exhausted(what + ": host mirror of " + std::to_string(mirror_bytes) + " bytes: " +
                              std::strerror(errno));
  }
  StatusOr<hal::DeviceAddr> addr = device_->allocate(bytes, alignment);
  if (!addr.ok()) {
    munmap(mirror, mirror_bytes);
    return addr.status().with_context(what + " (" + std::to_string(bytes) + " bytes)");
  }
  auto state = std::make_shared<BufferState>(std::move(core), name, bytes, static_cast<uint8_t*>(mirror),
                                             mirror_bytes, *addr);
  state->live_index = live_.size();
  live_.push_back(state.get());
  ++stats_->buffers_created;
  return state;
}

Status BufferTable::free(BufferState& b) {
  if (b.freed) return ok_status();
  b.freed = true;
  b.freed_reason = "the buffer was freed";
  live_[b.live_index] = live_.back();
  live_[b.live_index]->live_index = b.live_index;
  live_.pop_back();

  fences_->poll();
  std::vector<FenceRef> pending;
  b.deps.for_each_in(0, b.size, [&](uint64_t, uint64_t, const DepState& s) {
    if (!fences_->known_done(s.writer)) pending.push_back(s.writer);
    for (uint8_t i = 0; i < s.num_readers; ++i) {
      if (!fences_->known_done(s.readers[i])) pending.push_back(s.readers[i]);
    }
  });
  if (pending.empty()) {
    NPURT_RETURN_IF_ERROR_CTX(free_device_block(b.device_addr), "freeing the device memory of " + buffer_text(b));
    return ok_status();
  }
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  deferred_.push_back({b.device_addr, std::move(pending)});
  ++stats_->deferred_frees;
  return ok_status();
}

void BufferTable::reap_deferred_frees() {
  if (deferred_.empty()) return;
  fences_->poll();
  std::erase_if(deferred_, [&](const DeferredFree& d) {
    for (const FenceRef& f : d.fences) {
      if (!fences_->known_done(f)) return false;
    }
    // The work is done; a failing free leaves nothing to retry.
    free_device_block(d.addr).ignore();
    return true;
  });
}

Status BufferTable::free_device_block(hal::DeviceAddr addr) {
  {
    std::lock_guard<std::mutex> lock(retained_mu_);
    if (std::find(retained_.begin(), retained_.end(), addr) != retained_.end()) return ok_status();
  }
  return device_->free(addr);
}

void BufferTable::retain_until_exit(const BufferState& b) {
  {
    std::lock_guard<std::mutex> lock(retained_mu_);
    if (std::find(retained_.begin(), retained_.end(), b.device_addr) != retained_.end()) return;
    retained_.push_back(b.device_addr);
    retained_bytes_ += b.size;
  }
  // The device's memory must outlive every object that could release it.
  static std::mutex keep_mu;
  static auto* kept = new std::vector<std::shared_ptr<hal::Device>>();
  std::lock_guard<std::mutex> lock(keep_mu);
  if (std::find(kept->begin(), kept->end(), device_) == kept->end()) kept->push_back(device_);
}

uint64_t BufferTable::retained_bytes() const {
  std::lock_guard<std::mutex> lock(retained_mu_);
  return retained_bytes_;
}

void BufferTable::close() {
  closed_ = true;
  for (BufferState* b : live_) {
    b->freed = true;
    b->freed_reason = "its memory context is closed";
    free_device_block(b->device_addr).ignore();
  }
  live_.clear();
  for (const DeferredFree& d : deferred_) free_device_block(d.addr).ignore();
  deferred_.clear();
}

}  // namespace npurt::memory_detail
