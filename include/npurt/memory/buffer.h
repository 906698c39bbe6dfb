// Buffer and View: device memory with a host mirror, and byte ranges of it.
//
// A Buffer is one device allocation of size() bytes plus a host mirror of the same
// size (page-aligned, rounded up to whole pages, zero-filled at creation). Which
// side holds the newest bytes is tracked per byte range by the buffer's
// MemoryContext (memory_context.h), never by the Buffer or its views; all data
// movement goes through the context.
//
// A View is (buffer, offset, length): cheap to copy, no state of its own. A view of
// a view is a view of the root buffer; there are no nested sub-buffers, so sibling
// and overlapping views always see each other's writes.
//
// Ownership and lifetime:
//   * Buffer is the only owner of the device allocation (move-only). free() or the
//     destructor releases it; when device work still uses the buffer (a launch not
//     yet complete), the device block is freed later, once that work is done (the
//     context checks on each call and at its destruction). Never a use-after-free.
//   * Views (and host access guards) keep the host mirror alive, not the device
//     allocation: using a view of a freed buffer is an error (kFailedPrecondition
//     naming the buffer), never a crash. The mirror is unmapped when the buffer and
//     its last view and guard are gone.
//   * Any order of destruction is safe: a buffer holds its context's core, which
//     holds the device, so neither goes away under it. Destroying the MemoryContext
//     first frees the device memory of every buffer (after waiting for their device
//     work), and later calls on them fail cleanly.
//
// Raw pointers: host_data() / View::data() point into the mirror. Reading through
// them sees the newest bytes only where the host holds them (use a read guard, or
// to_host(), to fetch device-newer bytes first); pages given back with
// MemoryContext::drop_host_copy() read as zeros until fetched. Writing through them is seen by the
// context only in tracked mode (BufferOptions::track_writes), or when declared with
// MemoryContext::mark_host_written().
//
// Threading: the const accessors and view() may be called from any thread. free()
// and destruction are thread-safe with respect to the context's other calls, but a
// Buffer object itself (like any object) must not be freed while another thread
// uses that same object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"
#include "npurt/memory/write_tracker.h"

namespace npurt {

namespace memory_detail {
struct BufferState;
class MemoryCore;
}  // namespace memory_detail

struct BufferOptions {
  // Names the buffer in errors and statistics.
  std::string name;
  // Device alignment (power of two <= 4096).
  uint64_t alignment = 256;
  // Tracked mode: raw writes to the host mirror are caught per page (see
  // memory_context.h, "Tracked mode"). Can also be turned on later with
  // Buffer::enable_tracking().
  bool track_writes = false;
  WriteTrackingMechanism mechanism = WriteTrackingMechanism::kAuto;
};

class View {
 public:
  // An empty view of no buffer; any use reports kFailedPrecondition.
  View() = default;

  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  uint64_t end() const { return offset_ + size_; }
  bool empty() const { return size_ == 0; }
  // False for a default-constructed view. A view of a freed buffer is still
  // "attached": the context reports it when the view is used.
  bool attached() const { return buffer_ != nullptr; }
  // The buffer's name ("" when detached).
  const std::string& buffer_name() const;

  // The view [offset(), +length) of the bytes of this view at `offset`, as a view of
  // the root buffer. kOutOfRange when it does not fit inside this view; a zero
  // length is allowed.
  StatusOr<View> subview(uint64_t offset, uint64_t length) const;

  // The mirror bytes of this view (nullptr when detached). See "Raw pointers".
  uint8_t* data() const;

  // True when both views are ranges of the same buffer.
  bool same_buffer(const View& other) const { return buffer_ == other.buffer_; }
  // True when the views share at least one byte.
  bool overlaps(const View& other) const {
    return same_buffer(other) && offset_ < other.end() && other.offset_ < end();
  }

 private:
  friend class Buffer;
  friend class WriteGuard;
  friend class memory_detail::MemoryCore;
  View(std::shared_ptr<memory_detail::BufferState> buffer, uint64_t offset, uint64_t size)
      : buffer_(std::move(buffer)), offset_(offset), size_(size) {}

  std::shared_ptr<memory_detail::BufferState> buffer_;
  uint64_t offset_ = 0;
  uint64_t size_ = 0;
};

class Buffer {
 public:
  // An empty buffer (no allocation).
  Buffer() = default;
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  // Frees (see free()); errors are dropped.
  ~Buffer();

  bool valid() const { return state_ != nullptr; }
  uint64_t size() const;
  const std::string& name() const;
  hal::DeviceAddr device_address() const;
  // The mirror (page-aligned, rounded up to whole pages). See "Raw pointers".
  uint8_t* host_data() const;
  bool tracked() const;

  // The whole buffer.
  View view() const;
  // [offset, offset + length); kOutOfRange when it does not fit.
  StatusOr<View> view(uint64_t offset, uint64_t length) const;

  // Turns on tracked mode (no-op when on). Raw writes made before this call are
  // not seen: declare them with mark_host_written() first. kUnimplemented when the
  // requested mechanism is unavailable; the buffer stays untracked then.
  Status enable_tracking(WriteTrackingMechanism mechanism = WriteTrackingMechanism::kAuto);

  // Releases the device allocation now, or once device work using it completes.
  // The Buffer becomes empty; views of it report "freed". Device errors from the
  // free itself are returned (the allocation is then forgotten, not retried).
  Status free();

 private:
  friend class MemoryContext;
  friend class memory_detail::MemoryCore;
  explicit Buffer(std::shared_ptr<memory_detail::BufferState> state) : state_(std::move(state)) {}

  std::shared_ptr<memory_detail::BufferState> state_;
};

}  // namespace npurt
