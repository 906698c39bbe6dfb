// MemoryCore: the state one memory context shares with its buffers, views and guards.
//
// Its parts, each in its own file:
//   BufferTable   the live buffers and their device blocks (buffer_table.h)
//   RawWrites     tracked mode's raw writes into the coherence maps (raw_writes.h)
//   Planner       a sync, launch or command checked and planned into a Plan
//   PlanExecutor  a Plan enqueued, its completion recorded, its effects committed
//   FenceTable    the device events that mark completed work (fence_table.h)
// MemoryContext (memory_context.cc) composes them for each call: plan, then execute.
// Buffers, views and guards hold the core itself, which keeps the device alive, so
// they can outlive the context: a closed core refuses every call with
// kFailedPrecondition. The calls they make without a context are here.
//
// Every part, and the mutable part of every BufferState, is guarded by `mu`.
#pragma once

#include <memory>
#include <mutex>

#include "memory/buffer_state.h"
#include "memory/buffer_table.h"
#include "memory/fence_table.h"
#include "memory/plan_executor.h"
#include "memory/planner.h"
#include "memory/raw_writes.h"
#include "memory/rules.h"
#include "npurt/memory/buffer.h"
#include "npurt/memory/host_access.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

class MemoryCore : public std::enable_shared_from_this<MemoryCore> {
 public:
  MemoryCore(std::shared_ptr<hal::Device> device, MemoryOptions options);
  MemoryCore(const MemoryCore&) = delete;
  MemoryCore& operator=(const MemoryCore&) = delete;

  Status open();  // creates the transfer streams
  // Waits for the device work, frees every buffer's block, destroys the events and
  // streams; later calls fail with kFailedPrecondition. Idempotent.
  void close();

  // The calls of buffers and guards (which may outlive the context).
  Status free_buffer(BufferState& b);
  Status enable_tracking(BufferState& b, WriteTrackingMechanism mechanism);
  // A write guard over `view`, its margins taken in tracked mode; `what` names the call.
  StatusOr<WriteGuard> open_write_guard(const View& view, const char* what);
  void release(WriteGuard& guard);

  // The handles' insides, for the memory layer's parts (the handles befriend the core).
  static BufferState* state_of(const View& view) { return view.buffer_.get(); }
  static Buffer buffer_of(std::shared_ptr<BufferState> state) { return Buffer(std::move(state)); }
  static ReadGuard read_guard(const View& view) { return ReadGuard(view); }

  // OK when `view` is attached, of this context, and its buffer is alive.
  Status check_view(const View& view) const {
    return buffers.check_view(state_of(view), {view.offset(), view.end()});
  }

  const std::shared_ptr<hal::Device> device;
  const MemoryOptions options;
  const uint64_t page;  // of the host mirrors
  // Hazard::kNaiveCoherence, as it was when the context was made (base/hazards.h).
  const bool naive_coherence;

  mutable std::mutex mu;
  MemoryStats stats;  // the counters the parts keep; see MemoryContext::stats()
  FenceTable fences;
  const std::unique_ptr<CoherenceRules> coherence;
  const std::unique_ptr<OrderingRules> ordering;
  BufferTable buffers;
  RawWrites raw_writes;
  Planner planner;
  PlanExecutor executor;
  Plan plan;  // the plan of the call in progress, reused by every call
};

}  // namespace npurt::memory_detail
