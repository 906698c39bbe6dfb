// BufferTable: the live buffers of one memory context and their device blocks.
//
// It allocates a buffer's mirror and device block, frees a block once the device
// work using it completed (deferred, never refused), keeps the blocks that
// retain_until_exit() named for the life of the process, and checks that a view
// may be used (attached, of this context, of a live buffer, the context open).
//
// Guarded by the core's mutex, except the retained blocks (a lock of their own, see
// retain_until_exit()).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/buffer_state.h"
#include "memory/fence_table.h"
#include "npurt/memory/buffer.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

class BufferTable {
 public:
  // `owner`: the core whose buffers these are (views of other cores are refused).
  BufferTable(const MemoryCore* owner, std::shared_ptr<hal::Device> device, FenceTable& fences,
              MemoryStats& stats)
      : owner_(owner), device_(std::move(device)), fences_(&fences), stats_(&stats) {}
  BufferTable(const BufferTable&) = delete;
  BufferTable& operator=(const BufferTable&) = delete;

  bool closed() const { return closed_; }
  Status check_open() const;
  // OK when the view `range` of `b` may be used: attached (`b` not null), of this
  // context, its buffer alive. Inline: every launch argument is checked.
  Status check_view(const BufferState* b, ByteRange range) const {
    if (b != nullptr && b->core.get() == owner_ && !b->freed && !closed_) [[likely]] return ok_status();
    return view_error(b, range);
  }

  // A buffer of `bytes` bytes, its mirror zero-filled and every byte uninitialized.
  StatusOr<std::shared_ptr<BufferState>> create(std::shared_ptr<MemoryCore> core, const std::string& name,
                                                uint64_t bytes, uint64_t alignment);
  // The buffer is gone for its users; its block is freed now, or once the device
  // work using it completed.
  Status free(BufferState& b);
  // Frees the deferred blocks whose work completed.
  void reap_deferred_frees();
  // Keeps the block of `b` (and the device) until the process exits. Safe to call
  // while another thread holds the core's mutex waiting for the caller's stream.
  void retain_until_exit(const BufferState& b);

  // Marks every buffer freed ("its memory context is closed") and frees every block
  // but the retained ones. Call after the device work completed.
  void close();

  size_t live() const { return live_.size(); }
  size_t pending_frees() const { return deferred_.size(); }
  uint64_t retained_bytes() const;

 private:
  struct DeferredFree {
    hal::DeviceAddr addr;
    std::vector<FenceRef> fences;
  };
  // Why check_view() refused.
  Status view_error(const BufferState* b, ByteRange range) const;
  // Frees a device block, unless retain_until_exit() kept it.
  Status free_device_block(hal::DeviceAddr addr);

  const MemoryCore* const owner_;
  const std::shared_ptr<hal::Device> device_;
  FenceTable* const fences_;
  MemoryStats* const stats_;
  const uint64_t page_ = PageWriteTracker::page_size();

  bool closed_ = false;
  std::vector<BufferState*> live_;
  std::vector<DeferredFree> deferred_;

  mutable std::mutex retained_mu_;
  std::vector<hal::DeviceAddr> retained_;  // guarded by retained_mu_
  uint64_t retained_bytes_ = 0;            // guarded by retained_mu_
};

}  // namespace npurt::memory_detail
