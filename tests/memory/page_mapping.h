// An anonymous private mapping of whole pages, as a Buffer's host mirror would be:
// the memory the write tracker's tests and benchmark track.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>

#include "npurt/memory/write_tracker.h"

namespace npurt::testing {

class PageMapping {
 public:
  static size_t page() { return PageWriteTracker::page_size(); }

  explicit PageMapping(size_t pages) : length_(pages * page()) {
    void* p = mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    data_ = static_cast<char*>(p);
  }
  ~PageMapping() { munmap(data_, length_); }
  PageMapping(const PageMapping&) = delete;
  PageMapping& operator=(const PageMapping&) = delete;

  char* data() const { return data_; }
  char* page_ptr(size_t i) const { return data_ + i * page(); }
  size_t length() const { return length_; }

 private:
  size_t length_;
  char* data_;
};

}  // namespace npurt::testing
