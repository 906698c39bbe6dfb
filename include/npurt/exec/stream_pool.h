// StreamPool: where every stream npurt enqueues on comes from.
//
// A Worker's pipeline slots, a compiled sequence's calls and a memory context's
// transfers each take their stream from a pool. A pool has a fixed number of slots;
// StreamSlots (stream_slots.h) decides when a slot's stream may be reused, and this
// class does the rest in one place:
//   * acquire() reads the code registry's publication epoch and takes the slot: its
//     stream is reused only if no code was published since it was created and its
//     last use ended clean; otherwise it is replaced by a fresh stream;
//   * a fresh stream is primed first: one empty kernel ("npurt.prime", the same image
//     for every pool, so a registry publishes it once) launched over every core. The
//     simulated NPU, like the hardware it models, invalidates instruction caches only
//     at a fresh stream's first launch and only on the cores that launch uses; priming
//     makes "fresh stream" mean "every core's cache invalidated after the latest
//     publication", whatever grids follow;
//   * release() with any outcome but kComplete, or finish() on a stream in error,
//     makes the slot's next acquire() replace the stream; so does a stream found in
//     error at acquire() (aborted by a device reset since its last use).
//   * a stream whose destroy fails is kept and destroyed again later (StreamSlots).
// A pool without a registry is for streams that run no code (memory transfers): they
// are neither primed nor replaced after publications, only after failures.
//
// Ownership: the pool keeps its device and registry alive. close() (or destruction)
// destroys its streams after their queued work; acquire() afterwards fails naming the
// pool. Thread-safe; slots are independent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_slots.h"
#include "npurt/hal/device.h"

namespace npurt::exec {

struct StreamPoolOptions {
  uint32_t slots = 1;  // in [1, StreamSlots::kMaxDepth]
};
// A pool reads Hazard::kUnprimedStreams and kNaiveStreamReuse (base/hazards.h), the
// wrong policies tests use to show they catch the stale-instruction hazard, when it is
// made.

class StreamPool {
 public:
  // `name` says whose streams these are in errors ("worker 3", "sequence 'swiglu'").
  // `registry` may be null (see above); otherwise it must be of `device`.
  static StatusOr<std::unique_ptr<StreamPool>> make(FactoryKey key, std::string name,
                                                    std::shared_ptr<hal::Device> device,
                                                    std::shared_ptr<CodeRegistry> registry,
                                                    StreamPoolOptions options = {});
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // Takes `slot` for one use and returns its lease; the stream is ready (primed when
  // fresh). Call it after the code the use launches is registered, so the epoch read
  // here covers it. `image_id` matters to ReusePolicy::kNaiveLastImage only.
  StatusOr<SlotLease> acquire(uint32_t slot = 0, uint64_t image_id = 0);
  // Ends the use (see StreamSlots::retire).
  Status release(const SlotLease& lease, RunOutcome outcome);
  // Records that the lease's work was seen complete (StreamSlots::mark_polled_complete).
  Status observe_complete(const SlotLease& lease);
  // Waits for the lease's stream, then releases it: kComplete if the stream finished
  // clean, kFailed otherwise. Returns the stream's status.
  Status finish(const SlotLease& lease);

  // Refuses later acquires, waits for the leases out to be released (uses in flight
  // finish on their streams; at most kCloseWait, after which their streams go anyway
  // and those uses fail on them), then destroys every stream. Idempotent; safe while
  // other threads acquire and release.
  void close();
  static constexpr std::chrono::seconds kCloseWait{10};

  const std::string& name() const { return name_; }
  hal::Device& device() const { return *device_; }
  uint32_t slot_count() const { return options_.slots; }
  // StreamSlots' snapshot of one slot, and its counters (as of close() once closed).
  StatusOr<SlotState> slot_state(uint32_t slot) const;
  StreamSlotStats stats() const;
  uint64_t prime_launches() const { return prime_launches_.load(std::memory_order_relaxed); }

 private:
  StreamPool(std::string name, std::shared_ptr<hal::Device> device,
             std::shared_ptr<CodeRegistry> registry, StreamPoolOptions options);

  const std::string name_;
  const std::shared_ptr<hal::Device> device_;
  const std::shared_ptr<CodeRegistry> registry_;
  const StreamPoolOptions options_;
  std::unique_ptr<StreamSlots> slots_;
  CodeHandle prime_;  // held while the pool lives
  mutable std::shared_mutex mu_;  // shared: a use of the slots; exclusive: close()
  bool closed_ = false;   // guarded by mu_
  bool closing_ = false;  // guarded by mu_: close() waits for the leases out
  // Leases acquired and not yet released, so close() can wait for them.
  std::mutex leases_mu_;
  std::condition_variable leases_cv_;
  int64_t leases_out_ = 0;  // guarded by leases_mu_
  StreamSlotStats final_stats_;  // guarded by mu_: the counters when closed
  std::atomic<uint64_t> prime_launches_{0};
};

}  // namespace npurt::exec
