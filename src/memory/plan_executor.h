// PlanExecutor: runs a Plan (rules.h) and commits what it did.
//
// It enqueues the plan's waits, its uploads (from a snapshot of the stale host bytes,
// so the mirror is free again when the call returns) and the work, records the
// work's completion as a fence and commits the effects: the coherence rules update
// the coherence maps, and the dependency maps learn the new writers and readers.
// What queued work uses stays alive until its fence completes: the staging memory
// of its uploads and, for a launch, its code (so an image is not freed, and its
// address not handed to other code, while a launch of it is queued).
//
// Not thread-safe: the core's mutex serializes every call.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memory/buffer_state.h"
#include "memory/fence_table.h"
#include "memory/rules.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/memory/launch_arg.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

class PlanExecutor {
 public:
  // `hold_launched_code` false: Hazard::kLaunchesDropTheirCode.
  PlanExecutor(hal::Device& device, FenceTable& fences, const CoherenceRules& coherence, MemoryStats& stats,
               uint64_t max_pooled_staging_bytes, bool hold_launched_code)
      : device_(&device),
        fences_(&fences),
        coherence_(&coherence),
        stats_(&stats),
        max_pooled_staging_bytes_(max_pooled_staging_bytes),
        hold_launched_code_(hold_launched_code) {}
  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;

  // The streams synchronous transfers run on (a pool of one slot).
  void set_transfers(std::unique_ptr<exec::StreamPool> transfers) { transfers_ = std::move(transfers); }

  // A transfer plan (Planner::transfer), run synchronously: when it returns the bytes
  // moved. It first waits on the host for the work the plan waits for.
  Status transfer(const Plan& p);
  // A launch plan (Planner::kernel), enqueued on the plan's stream.
  Status launch(const Plan& p, const exec::CodeHandle& code, uint32_t grid, std::span<const LaunchArg> args);
  // A command plan (Planner::command): `enqueue` enqueues the work on the plan's stream.
  Status command(const Plan& p, std::string_view name, std::span<const MemoryContext::CommandArg> args,
                 const MemoryContext::EnqueueCommand& enqueue);

  // Lets go of what completed work held (staging memory, code), oldest first.
  void release_finished();
  // Drops everything held and closes the transfer streams; after the device work completed.
  void close();

 private:
  struct Staging {
    std::unique_ptr<uint8_t[]> data;
    uint64_t capacity = 0;
  };
  struct PendingStaging {
    FenceRef fence;
    Staging staging;
  };
  struct HeldCode {
    FenceRef fence;
    exec::CodeHandle code;
  };

  // The plan's waits and uploads, then `work` on the plan's stream, then the fence
  // and commit; `what` names the operation in errors. `code`, where the work runs
  // one, is held until the fence completes.
  Status run(const Plan& p, const std::function<std::string()>& what,
             const std::function<Status(hal::StreamId)>& work, const exec::CodeHandle* code);
  void commit(const Plan& p, FenceRef fence);

  // Dependency bookkeeping.
  void set_writer(BufferState& b, ByteRange r, FenceRef f);
  void add_reader(BufferState& b, ByteRange r, FenceRef f, hal::StreamId stream);
  void forget_writer(BufferState& b, ByteRange r);
  void prune(DepState& s) const;

  Staging take_staging(uint64_t bytes);
  void recycle_staging();

  hal::Device* const device_;
  FenceTable* const fences_;
  const CoherenceRules* const coherence_;
  MemoryStats* const stats_;
  const uint64_t max_pooled_staging_bytes_;
  const bool hold_launched_code_;

  std::unique_ptr<exec::StreamPool> transfers_;
  std::vector<Staging> staging_pool_;
  uint64_t pooled_staging_bytes_ = 0;
  std::deque<PendingStaging> pending_staging_;
  std::deque<HeldCode> held_code_;
  hal::LaunchParams params_;  // reused by every launch and command
};

}  // namespace npurt::memory_detail
