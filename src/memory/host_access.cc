#include "npurt/memory/host_access.h"

#include <cstdio>

#include "memory/memory_core.h"

namespace npurt {

namespace memory_detail {

void misaligned_typed_access(size_t type_size, size_t type_align, uint64_t offset, uint64_t bytes) {
  char text[200];
  std::snprintf(text, sizeof text,
                "typed access to a guard of %llu bytes at view offset %llu: not a whole number of "
                "%zu-byte values aligned to %zu",
                static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(offset),
                type_size, type_align);
  fatal(text, __FILE__, __LINE__);
}

}  // namespace memory_detail

WriteGuard::WriteGuard(WriteGuard&& other) noexcept
    : view_(std::move(other.view_)),
      data_(other.data_),
      size_(other.size_),
      active_(other.active_),
      twinned_(other.twinned_),
      head_begin_(other.head_begin_),
      tail_end_(other.tail_end_),
      head_(std::move(other.head_)),
      tail_(std::move(other.tail_)) {
  other.active_ = false;
  other.data_ = nullptr;
  other.size_ = 0;
}

WriteGuard& WriteGuard::operator=(WriteGuard&& other) noexcept {
  if (this != &other) {
    release();
    view_ = std::move(other.view_);
    data_ = other.data_;
    size_ = other.size_;
    active_ = other.active_;
    twinned_ = other.twinned_;
    head_begin_ = other.head_begin_;
    tail_end_ = other.tail_end_;
    head_ = std::move(other.head_);
    tail_ = std::move(other.tail_);
    other.active_ = false;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void WriteGuard::release() {
  if (!active_) return;
  view_.buffer_->core->release(*this);
  active_ = false;
}

}  // namespace npurt
