// Worker: pipelined runs on a device, one pipeline slot per in-flight run.
//
// A *run* is a callable that enqueues its device work (input uploads, launches,
// read-backs) on the stream it is given, plus the code handles it launches. The
// Worker
//   1. assigns run i to slot i % depth (placement is deterministic, so tests and
//      callers know which runs share a stream), waiting until that slot's previous
//      run has retired;
//   2. takes the slot under a lease {slot, generation} from StreamSlots, passing the
//      registry's publication epoch: the slot's stream is reused only if no code was
//      published since it was created, else replaced by a fresh stream;
//   3. on a fresh stream, first launches an empty kernel on every core ("priming",
//      done by the StreamPool the slots' streams come from, see stream_pool.h);
//   4. calls the run's callable on the submitting thread, which enqueues the run's
//      commands while the previous run still executes on its own slot (that is the
//      overlap depth >= 2 buys), then records the slot's completion event;
//   5. returns a RunHandle at once.
// A progress thread polls the oldest run's event (non-blocking event_query), marks it
// polled complete, and retires runs strictly in submission order: stream_synchronize
// for the final status, StreamSlots::retire (kComplete, or kFailed, which destroys
// the stream so the slot's next run gets a fresh one), release of the run's code
// handles, and completion of its RunHandle.
//
// Code lifetime. submit() keeps copies of the run's CodeHandles until retirement, so
// an image unregistered while a run uses it stays resident until the device is done
// with that run; the last holder frees the block then. Register and unregister may
// be called from any thread while runs are in flight.
//
// Cross-slot ordering. Runs on different slots run on different streams and are not
// ordered against each other. A run that touches memory the previous run also
// touches must order itself, e.g. with RunContext::wait_for_previous_run() before the
// commands that conflict. (Buffers per slot, double buffering, need nothing.)
//
// Timeouts and reset. With WorkerOptions::run_timeout, the progress thread aborts the
// stream of a run that has not finished in time and retires it with
// RunOutcome::kTimedOut (kDeadlineExceeded); runs after it on other slots are not
// affected unless they wait for it. reset() abandons every run in flight instead.
//
// Errors. A run's failure (an error returned by its callable, an enqueue refused, a
// kernel fault or sanitizer hazard on its stream) surfaces on its RunHandle as the
// device's Status with "run N (slot S)" as context. Other runs and slots are
// unaffected, except a run that explicitly waits for a failed predecessor.
//
// Threading. submit() is thread-safe (submissions are serialized; the callable runs
// under that serialization, so it must not call back into the Worker). RunHandle is
// thread-safe.
//
// Lifetime. The Worker keeps its code registry and device alive. close() (and the
// destructor) waits for every submitted run to retire, then destroys the slots'
// streams; a run submitted afterwards fails at once, naming the worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/exec/stream_slots.h"
#include "npurt/hal/device.h"
#include "npurt/hal/handles.h"

namespace npurt::exec {

class Worker;

struct WorkerOptions {
  // Pipeline slots (runs in flight), in [1, StreamSlots::kMaxDepth].
  uint32_t depth = StreamSlots::kDefaultDepth;
  // A fresh stream for every run (created at submit, destroyed at retirement, which
  // StreamSlots counts as an unproven retirement): the always-safe, slower peer that
  // benchmarks compare reuse against.
  bool stream_per_run = false;
  // A run that has not finished this long after its callable returned is stopped: its
  // stream is aborted and the run fails with kDeadlineExceeded (a hung kernel, say).
  // Zero: no limit.
  std::chrono::milliseconds run_timeout{0};
};

// What a run's callable gets: where to enqueue its work. The command helpers accept
// work only while the run's callable is executing and its lease is current: a copy
// kept past the callable is refused with kFailedPrecondition (a stale lease once the
// slot has retired the run or moved on to a later one). Such a copy must not outlive
// the Worker.
class RunContext {
 public:
  // Raw access, for commands the helpers below do not cover (events, say). Commands
  // issued this way bypass the lease and resident-code checks.
  hal::Device& device() const { return *device_; }
  hal::StreamId stream() const { return static_cast<hal::StreamId>(lease_.stream); }
  uint32_t slot() const { return lease_.slot; }
  const SlotLease& lease() const { return lease_; }
  uint64_t run_id() const { return run_id_; }

  // OK while this run's callable executes under a current lease; otherwise
  // kFailedPrecondition naming the slot and both generations (stale lease) or the run
  // (staging over).
  Status check_lease() const;

  // Lease-checked stream commands on this run's stream (see hal/device.h).
  Status copy_to_device(hal::DeviceAddr dst, const void* src, uint64_t bytes) const;
  Status copy_to_host(void* dst, hal::DeviceAddr src, uint64_t bytes) const;
  Status copy_on_device(hal::DeviceAddr dst, hal::DeviceAddr src, uint64_t bytes) const;
  // Launches `code`, which must be one of the handles passed to submit() for this run
  // (kFailedPrecondition otherwise: only those are kept resident until retirement).
  Status launch(const CodeHandle& code, uint32_t grid, std::vector<hal::KernelArg> args) const;
  // Makes this run's later commands wait until the previous run (on another slot)
  // has completed. No-op for the first run and at depth 1 (same stream, FIFO).
  // If the previous run failed, this run's stream fails too.
  Status wait_for_previous_run() const;

 private:
  friend class Worker;
  RunContext(Worker* worker, hal::Device* device, const SlotLease& lease, uint64_t run_id,
             std::vector<hal::DeviceAddr> code_addrs, hal::EventId previous_event)
      : worker_(worker),
        device_(device),
        lease_(lease),
        run_id_(run_id),
        code_addrs_(std::move(code_addrs)),
        previous_event_(previous_event) {}

  Worker* worker_;
  hal::Device* device_;
  SlotLease lease_;
  uint64_t run_id_;
  std::vector<hal::DeviceAddr> code_addrs_;  // where the run's images live (held until retirement)
  hal::EventId previous_event_;              // 0: nothing to wait for
};

// Enqueues one run's device work on ctx's stream. Returning an error fails the run
// (what was already enqueued still drains before the run retires).
using RunFn = std::function<Status(RunContext&)>;

// The caller's view of a run. Copyable; all copies observe the same run.
class RunHandle {
 public:
  RunHandle() = default;

  bool valid() const { return state_ != nullptr; }
  // Blocks until the run has retired; returns its final status.
  Status wait() const;
  // Non-blocking: true once the run has retired (wait() will not block).
  bool done() const;
  uint64_t run_id() const;
  uint32_t slot() const;

 private:
  friend class Worker;
  struct State;
  explicit RunHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

struct WorkerStats {
  uint64_t runs_submitted = 0;
  uint64_t runs_completed = 0;  // retired OK
  uint64_t runs_failed = 0;     // retired with an error
  uint64_t prime_launches = 0;
  uint64_t stale_leases_rejected = 0;  // RunContext commands refused for a stale lease
  uint64_t resets = 0;
  StreamSlotStats streams;      // created/destroyed, reuse hits, stale replacements
  CodeRegistryStats code;       // publications, dedup hits, blocks freed, live images
};

class Worker {
 public:
  // Runs on the registry's device. kInvalidArgument for bad options; device errors
  // (creating events, registering the priming kernel) with context.
  static StatusOr<std::unique_ptr<Worker>> make(FactoryKey key, std::shared_ptr<CodeRegistry> registry,
                                                WorkerOptions options = {});
  ~Worker();
  // Waits for every submitted run to retire, then destroys the slots' streams and
  // events. Idempotent; must not be called from a run's callable.
  void close();

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Submits a run that launches `code` (all handles must be valid; the first one
  // identifies the run's image for ReusePolicy::kNaiveLastImage). Blocks while the
  // run's slot (run_id % depth) is still held by an unretired run. Never fails
  // itself: every error, including an invalid handle, surfaces on the RunHandle.
  RunHandle submit(RunFn fn, std::vector<CodeHandle> code);

  // Blocks until every run submitted so far has retired.
  void drain();

  // Device reset: abandons every run in flight (each fails with kAborted, "abandoned by
  // a reset"), aborts every stream of the device (hal::Device::reset, so other users of
  // the device see their work in flight fail too), and returns once those runs have
  // retired. Each slot takes a fresh stream for its next run; the code registry and
  // the memory context's buffers stay consistent (work that failed is known as failed),
  // so later runs succeed. Must not be called from a run's callable.
  Status reset();

  WorkerStats stats() const;
  const WorkerOptions& options() const { return options_; }
  // StreamSlots snapshot of one slot (tests, traces).
  StatusOr<SlotState> slot_state(uint32_t slot) const { return pool_->slot_state(slot); }

 private:
  friend class RunContext;
  struct Run;

  Worker(std::shared_ptr<CodeRegistry> registry, WorkerOptions options);
  Status init();
  void stage(Run& run, RunFn& fn);
  void progress_loop();
  void wait_until_complete(Run& run);
  void retire(Run& run);
  Status check_lease(const SlotLease& lease) const;

  const uint64_t id_;  // process-wide serial number, names the trace lanes
  const std::shared_ptr<hal::Device> device_;
  const std::shared_ptr<CodeRegistry> registry_;
  const WorkerOptions options_;
  std::unique_ptr<StreamPool> pool_;
  std::vector<hal::Event> slot_events_;  // one completion event per slot

  std::mutex submit_mu_;  // serializes submit(); held while a callable runs
  uint64_t next_run_id_ = 0;  // guarded by submit_mu_

  mutable std::mutex mu_;
  std::condition_variable progress_cv_;  // in_flight_ grew, or stopping_
  std::condition_variable retired_cv_;   // a run retired
  std::deque<std::unique_ptr<Run>> in_flight_;  // guarded by mu_; submission order
  std::vector<uint8_t> slot_busy_;              // guarded by mu_
  uint64_t submitted_ = 0, retired_ = 0;        // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  WorkerStats stats_;                           // guarded by mu_ (runs_*)
  mutable std::atomic<uint64_t> stale_leases_rejected_{0};
  static constexpr uint64_t kNoRun = ~uint64_t{0};
  std::atomic<uint64_t> staging_run_{kNoRun};  // the run whose callable executes now

  std::thread progress_;
};

}  // namespace npurt::exec
