// Host access guards: the safe way to read and write a view's bytes on the host.
//
// Guards come from MemoryContext::read(), write() and overwrite():
//   read(view)       fetches the view's device-newer bytes into the mirror first
//                    (waiting for the device work that writes them), then hands out
//                    the mirror bytes read-only.
//   write(view)      fetches like read(), then hands out the bytes writable; when
//                    the guard is released the whole view is host-newer.
//   overwrite(view)  like write() without the fetch: for callers that replace every
//                    byte of the view (what the view held before is never read).
//
// "Host-newer" is recorded when a write guard is released (release() or
// destruction), for the exact bytes of the view. A launch that reads the view while
// the guard is still alive uploads what the mirror holds then; after release the
// view is uploaded again, so the device always ends up with the host's final bytes.
// Hold write guards briefly, and release before launching work that reads the view.
//
// The bytes stay valid for the guard's life, even if the buffer is freed meanwhile
// (the guard keeps the mirror alive; releasing a guard of a freed buffer records
// nothing). They are stable unless another thread writes or fetches the same range.
//
// Tracked buffers: the guard's own writes are not counted as raw writes, and bytes
// outside the view on the view's first and last page that something else wrote
// while the guard was held are still recorded, byte-exactly.
//
// Threading: a guard is a move-only value owned by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/memory/buffer.h"

namespace npurt {

namespace memory_detail {
// Aborts unless `bytes` bytes at `data` (view offset `offset`) are whole, aligned Ts.
void check_typed(const void* data, uint64_t bytes, size_t type_size, size_t type_align,
                 uint64_t offset);
}  // namespace memory_detail

class ReadGuard {
 public:
  ReadGuard() = default;
  ReadGuard(ReadGuard&&) noexcept = default;
  ReadGuard& operator=(ReadGuard&&) noexcept = default;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // The bytes as T; the view's offset and size must suit T (aborts otherwise: a
  // programming error, not bad input).
  template <typename T>
  std::span<const T> as() const {
    static_assert(std::is_trivially_copyable_v<T>);
    memory_detail::check_typed(data_, size_, sizeof(T), alignof(T), view_.offset());
    return {reinterpret_cast<const T*>(data_), size_ / sizeof(T)};
  }
  const View& view() const { return view_; }

 private:
  friend class memory_detail::MemoryCore;
  explicit ReadGuard(View view)
      : view_(std::move(view)), data_(view_.data()), size_(view_.size()) {}
  View view_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

class WriteGuard {
 public:
  WriteGuard() = default;
  WriteGuard(WriteGuard&& other) noexcept { *this = std::move(other); }
  WriteGuard& operator=(WriteGuard&& other) noexcept;
  ~WriteGuard() { release(); }

  std::span<uint8_t> bytes() const { return {data_, size_}; }
  template <typename T>
  std::span<T> as() const {
    static_assert(std::is_trivially_copyable_v<T>);
    memory_detail::check_typed(data_, size_, sizeof(T), alignof(T), view_.offset());
    return {reinterpret_cast<T*>(data_), size_ / sizeof(T)};
  }
  const View& view() const { return view_; }
  bool active() const { return active_; }

  // Ends the write: the view becomes host-newer. Idempotent; the guard's bytes must
  // not be written afterwards.
  void release();

 private:
  friend class memory_detail::MemoryCore;
  explicit WriteGuard(View view)
      : view_(std::move(view)), data_(view_.data()), size_(view_.size()) {}

  View view_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool active_ = false;
  // Tracked buffers: the mirror bytes outside the view on its first and last page,
  // as they were when the guard was taken (see "Tracked buffers" above).
  bool twinned_ = false;
  uint64_t head_begin_ = 0;
  uint64_t tail_end_ = 0;
  std::vector<uint8_t> head_;
  std::vector<uint8_t> tail_;
};

}  // namespace npurt
