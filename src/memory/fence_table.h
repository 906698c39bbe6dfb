// FenceTable: device events that mark "this stream has reached this point", pooled.
//
// The memory layer records one fence after each asynchronous piece of work it
// enqueues for a buffer (a launch and the input uploads before it) and remembers it
// as a writer or reader of byte ranges (DepMap). A later conflicting operation
// waits for it: on the device (wait_event on its stream) or on the host
// (event_synchronize).
//
// Events are recycled: a fence is identified by {slot, generation}; once the table
// knows a fence completed, its slot (and event) is reused under the next
// generation, so references kept in dependency maps become "done" without being
// found and erased. The number of events is bounded by the fences in flight at once,
// not by the number of fences ever recorded.
//
// Completion knowledge is per stream: fences on one stream complete in the order
// they were recorded, so learning that fence n completed proves every earlier fence
// of that stream did too, without querying them; and learning that it succeeded
// proves they succeeded (a stream's failure fails everything after it). Learning that
// it failed proves nothing about them, so they are asked then.
//
// A fence whose stream failed keeps its slot (marked failed, with the error) and is
// never reused, so a host read of bytes it should have written reports that error
// instead of returning garbage. Failures are rare; their slots are few.
//
// Not thread-safe: the owning MemoryCore serializes every call.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"

namespace npurt::memory_detail {

struct FenceRef {
  uint32_t slot = 0;
  uint32_t generation = 0;  // 0: no fence

  bool valid() const { return generation != 0; }
  friend bool operator==(const FenceRef&, const FenceRef&) = default;
  friend bool operator<(const FenceRef& a, const FenceRef& b) {
    return a.slot != b.slot ? a.slot < b.slot : a.generation < b.generation;
  }
};

struct FenceStats {
  uint64_t fences_recorded = 0;
  uint64_t events_created = 0;
  uint64_t events_live = 0;  // events the table currently owns
  uint64_t fences_failed = 0;
  uint64_t device_waits = 0;  // wait_event commands enqueued
  uint64_t host_waits = 0;    // event_synchronize calls
};

class FenceTable {
 public:
  explicit FenceTable(hal::Device& device) : device_(&device) {}
  FenceTable(const FenceTable&) = delete;
  FenceTable& operator=(const FenceTable&) = delete;

  // Records a new fence at the current end of `stream`.
  StatusOr<FenceRef> record(hal::StreamId stream);
  // A fence that has already failed with `failure`, for work whose completion could
  // not be recorded and that was then seen to fail.
  FenceRef failed(Status failure);

  // True when the fence is known to have completed (successfully or not), or is no
  // fence at all. Never queries the device.
  bool known_done(FenceRef f) const;
  // The error of a fence known to have failed; OK otherwise.
  Status failure(FenceRef f) const;
  // The stream the fence was recorded on, or 0 when it is known done.
  hal::StreamId stream_of(FenceRef f) const;

  // Makes `stream` wait for the fence, unless it is known done or on `stream` itself.
  Status device_wait(hal::StreamId stream, FenceRef f);
  // Blocks until the fence completed; the error of its stream if that failed.
  Status host_wait(FenceRef f);

  // Learns which fences completed (at most a few queries per stream) and recycles
  // their slots.
  void poll();

  // Blocks until every fence recorded so far completed; the first failure found.
  Status wait_all();
  // Destroys every event (after wait_all()); the table is unusable afterwards.
  void destroy();

  FenceStats stats() const { return stats_; }

 private:
  enum class SlotState : uint8_t { kFree, kPending, kFailed };
  struct Slot {
    hal::EventId event{};
    uint32_t generation = 1;
    uint32_t track = 0;  // index into tracks_ while pending
    uint64_t seq = 0;    // position on its stream
    SlotState state = SlotState::kFree;
    Status failure;
  };
  // What the table knows about one stream. A track whose pending list is empty may
  // be reassigned to another stream: no live fence refers to it.
  struct Track {
    hal::StreamId stream{};
    uint64_t recorded = 0;  // seq of the last fence recorded on it
    uint64_t done = 0;      // every fence with seq <= done has completed
    std::deque<uint32_t> pending;
  };

  uint32_t track_for(hal::StreamId stream);
  StatusOr<uint32_t> take_slot();
  void recycle(uint32_t slot);
  void fail(uint32_t slot, Status failure);
  // Records that the fence in `slot` completed, with `result`.
  void learn(uint32_t slot, const Status& result);

  hal::Device* device_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;
  std::vector<Track> tracks_;
  FenceStats stats_;
};

}  // namespace npurt::memory_detail
