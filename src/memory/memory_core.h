// MemoryCore: the state behind MemoryContext, Buffer, View and the guards.
//
// MemoryContext owns the core's device resources (transfer streams, events, device
// allocations) and releases them in close(). Buffers, views and guards share the core
// object itself, which keeps the device alive, so they can outlive the context safely:
// a closed core refuses every call with kFailedPrecondition.
//
// Every member of the core and the mutable part of every BufferState is guarded by
// MemoryCore::mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "memory/dep_map.h"
#include "memory/fence_table.h"
#include "memory/rules.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/memory/coherence_map.h"
#include "npurt/memory/launch_plan.h"
#include "npurt/memory/memory_context.h"
#include "npurt/memory/write_tracker.h"

namespace npurt::memory_detail {

using CommandArg = MemoryContext::CommandArg;

struct BufferState {
  BufferState(std::shared_ptr<MemoryCore> owner, std::string buffer_name, uint64_t bytes, uint8_t* mirror_ptr,
              uint64_t mirror_length, hal::DeviceAddr addr)
      : core(std::move(owner)),
        name(std::move(buffer_name)),
        size(bytes),
        mirror(mirror_ptr),
        mirror_bytes(mirror_length),
        device_addr(addr) {}
  ~BufferState();

  const std::shared_ptr<MemoryCore> core;
  const std::string name;
  const uint64_t size;
  uint8_t* const mirror;
  const uint64_t mirror_bytes;  // size rounded up to whole pages
  const hal::DeviceAddr device_addr;
  std::atomic<bool> tracked{false};

  // Guarded by core->mu_.
  bool freed = false;
  const char* freed_reason = "";
  CoherenceMap map{size};
  DepMap deps{size};
  std::optional<PageWriteTracker> tracker;
  NaiveFlags naive;
  size_t live_index = 0;  // position in MemoryCore::live_
};

class MemoryCore : public std::enable_shared_from_this<MemoryCore> {
 public:
  MemoryCore(std::shared_ptr<hal::Device> device, MemoryOptions options);
  MemoryCore(const MemoryCore&) = delete;
  MemoryCore& operator=(const MemoryCore&) = delete;

  Status open();  // creates the transfer stream pool
  void close();   // see the file comment

  const MemoryOptions& options() const { return options_; }
  hal::Device& device() const { return *device_; }

  StatusOr<Buffer> create_buffer(uint64_t bytes, const BufferOptions& options);
  Status free_buffer(BufferState& buffer);
  Status enable_tracking(BufferState& buffer, WriteTrackingMechanism mechanism);

  StatusOr<ReadGuard> read(const View& view);
  StatusOr<WriteGuard> write(const View& view, bool fetch_first);
  void release(WriteGuard& guard);
  Status mark_host_written(const View& view);
  Status to_device(const View& view);
  Status to_host(const View& view);
  Status drop_host_copy(const View& view);
  Status retain_until_exit(const View& view);

  StatusOr<LaunchPlan> plan_launch(hal::StreamId stream, const isa::Image& image, uint32_t grid,
                                   std::span<const LaunchArg> args);
  Status launch(hal::StreamId stream, const exec::CodeHandle& code, uint32_t grid,
                std::span<const LaunchArg> args);
  Status enqueue_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args,
                         const MemoryContext::EnqueueCommand& enqueue);
  Status synchronize();
  MemoryStats stats() const;

 private:
  struct Staging {
    std::unique_ptr<uint8_t[]> data;
    uint64_t capacity = 0;
  };
  struct PendingStaging {
    FenceRef fence;
    Staging staging;
  };
  struct DeferredFree {
    hal::DeviceAddr addr;
    std::vector<FenceRef> fences;
  };
  // A launched image, held until the launch's fence completes.
  struct HeldCode {
    FenceRef fence;
    exec::CodeHandle code;
  };

  Status check_open() const;
  // Frees a device block, unless retain_until_exit() kept it.
  Status free_device_block(hal::DeviceAddr addr);
  // OK when `view` is attached, of this context, and its buffer is alive.
  Status check_view(const View& view) const;
  Status validate_launch(const isa::Image& image, uint32_t grid,
                         std::span<const LaunchArg> args) const;

  // Tracked mode: records the dirty pages overlapping [begin, end) as host writes.
  Status absorb_dirty(BufferState& b, uint64_t begin, uint64_t end);
  // Raw bytes [begin, end) may have been written: host-newer, except device-newer bytes.
  void record_raw_write(BufferState& b, uint64_t begin, uint64_t end);
  // Bytes of `r` that both sides hold, as far as committed work says, but whose
  // upload belonged to work that failed: the device copy may be garbage, the host's
  // is still right, so they become host-newer again and are sent with the next sync.
  void resend_failed_uploads(BufferState& b, ByteRange r);
  // Records host writes to the bytes of [begin, end) that differ from `before`.
  void record_changed_bytes(BufferState& b, uint64_t begin, std::span<const uint8_t> before);

  // Planning into plan_ (rules.h). Raw writes tracked mode caught in the bytes
  // concerned are recorded first (they happened before the call); planning itself
  // changes no state. plan_kernel also checks the launch (bad input: a Status).
  Status plan_transfer(BufferState& b, ByteRange range, bool upload);
  Status plan_kernel(hal::StreamId stream, const isa::Image& image, uint32_t grid,
                     std::span<const LaunchArg> args);
  Status plan_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args);
  // The device work of views_ (a launch's buffer arguments or a command's views);
  // label(i) names argument i in errors.
  Status plan_views(hal::StreamId stream, const std::function<std::string(size_t)>& label);
  // Executing plan_, then committing its effects (fence: the plan's completion).
  Status execute_transfer(BufferState& b);
  Status execute_launch(const exec::CodeHandle& code, uint32_t grid, std::span<const LaunchArg> args);
  // The plan's waits and uploads, then `work` on the plan's stream, then the fence
  // and commit; `what` names the operation in errors. `code`, where the work runs
  // one, is held until the fence completes.
  Status execute_plan(const std::function<std::string()>& what, const std::function<Status(hal::StreamId)>& work,
                      const exec::CodeHandle* code = nullptr);
  void commit(FenceRef fence);
  // check_view, then a synchronous transfer of the view's stale bytes, for `what`.
  Status sync_view(const View& view, bool upload, const char* what);


  // Dependency bookkeeping.
  void set_writer(BufferState& b, ByteRange r, FenceRef f);
  void add_reader(BufferState& b, ByteRange r, FenceRef f, hal::StreamId stream);
  void forget_writer(BufferState& b, ByteRange r);
  void prune(DepState& s) const;

  Staging take_staging(uint64_t bytes);
  void recycle_staging();
  void reap_deferred_frees();
  // Drops the held code of completed launches (oldest first).
  void release_finished_code();

  const std::shared_ptr<hal::Device> device_;
  const MemoryOptions options_;
  const uint64_t page_;
  // The hazard switches (base/hazards.h) as they were when the context was made.
  const bool naive_coherence_;
  const bool resend_failed_uploads_;
  const bool hold_launched_code_;

  mutable std::mutex mu_;
  bool closed_ = false;
  std::unique_ptr<exec::StreamPool> transfers_;  // synchronous transfers (one slot)
  FenceTable fences_;
  const std::unique_ptr<CoherenceRules> coherence_;
  const std::unique_ptr<OrderingRules> ordering_;
  std::vector<BufferState*> live_;
  std::vector<DeferredFree> deferred_;
  std::vector<Staging> staging_pool_;
  uint64_t pooled_staging_bytes_ = 0;
  std::deque<PendingStaging> pending_staging_;
  std::deque<HeldCode> held_code_;
  MemoryStats stats_;

  // Device blocks retain_until_exit() kept. A lock of its own, taken after mu_ where
  // both are held: a stream's host function retains while close() holds mu_ waiting
  // for that very stream.
  mutable std::mutex retained_mu_;
  std::vector<hal::DeviceAddr> retained_;  // guarded by retained_mu_
  uint64_t retained_bytes_ = 0;            // guarded by retained_mu_

  // Scratch reused by every plan, so steady state allocates nothing.
  struct PlannedView {
    const View* view;
    isa::Access access;
    size_t index;  // the argument's position, for errors
  };
  std::vector<PlannedView> views_;
  Plan plan_;
  std::vector<ByteRange> dirty_;
  std::vector<ByteRange> pieces_;
  hal::LaunchParams params_;
};

}  // namespace npurt::memory_detail
