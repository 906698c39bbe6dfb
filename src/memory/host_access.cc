#include "npurt/memory/host_access.h"

#include <cstdio>
#include <utility>

#include "memory/memory_core.h"

namespace npurt {

namespace memory_detail {

void check_typed(const void* data, uint64_t bytes, size_t type_size, size_t type_align,
                 uint64_t offset) {
  if (bytes % type_size == 0 && reinterpret_cast<uintptr_t>(data) % type_align == 0) return;
  char text[200];
  std::snprintf(text, sizeof text,
                "typed access to a guard of %llu bytes at view offset %llu: not a whole number of "
                "%zu-byte values aligned to %zu",
                static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(offset),
                type_size, type_align);
  fatal(text, __FILE__, __LINE__);
}

}  // namespace memory_detail

WriteGuard& WriteGuard::operator=(WriteGuard&& other) noexcept {
  if (this == &other) return *this;
  release();
  view_ = std::move(other.view_);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  active_ = std::exchange(other.active_, false);
  twinned_ = other.twinned_;
  head_begin_ = other.head_begin_;
  tail_end_ = other.tail_end_;
  head_ = std::move(other.head_);
  tail_ = std::move(other.tail_);
  return *this;
}

void WriteGuard::release() {
  if (!active_) return;
  view_.buffer_->core->release(*this);
  active_ = false;
}

}  // namespace npurt
