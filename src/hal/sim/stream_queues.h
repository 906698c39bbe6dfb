// StreamQueues: the simulated NPU's streams and events.
//
// It owns every stream (a FIFO queue of commands drained in order by the stream's own
// host thread) and every event, and implements the HAL's stream side: enqueueing
// copies, launches, host functions and event records/waits, executing them (a launch
// through the LaunchScheduler), synchronize and query, and abort_stream / reset. A
// stream's thread is what makes commands asynchronous, as on hardware: the caller
// returns once the command is queued.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "hal/sim/fault_injector.h"
#include "hal/sim/launch_scheduler.h"
#include "hal/sim/sim_counters.h"
#include "hal/sim/sim_memory.h"
#include "npurt/base/status.h"
#include "npurt/hal/device.h"
#include "npurt/hal/ids.h"

namespace npurt::sim {

struct SimStream;
struct SimEvent;
struct Command;

class StreamQueues {
 public:
  StreamQueues(SimMemory& memory, LaunchScheduler& launches, SimCounters& counters, FaultInjector& faults);
  // Stops every stream, each once its queued commands ran.
  ~StreamQueues();
  StreamQueues(const StreamQueues&) = delete;
  StreamQueues& operator=(const StreamQueues&) = delete;

  // The Device methods of the same names (device.h).
  StatusOr<hal::StreamId> create_stream();
  Status destroy_stream(hal::StreamId id);
  Status stream_synchronize(hal::StreamId id);
  StatusOr<bool> stream_query(hal::StreamId id);

  StatusOr<hal::EventId> create_event();
  Status destroy_event(hal::EventId id);
  Status record_event(hal::StreamId stream, hal::EventId event);
  // Device::wait_event and wait_peer_event: `owner` holds the event (these queues, or
  // a peer device's).
  Status wait_event(hal::StreamId stream, StreamQueues& owner, hal::EventId event);
  Status event_synchronize(hal::EventId event);
  StatusOr<bool> event_query(hal::EventId event);

  Status copy_to_device(hal::StreamId stream, hal::DeviceAddr dst, const void* src, uint64_t bytes);
  Status copy_to_host(hal::StreamId stream, void* dst, hal::DeviceAddr src, uint64_t bytes);
  Status copy_on_device(hal::StreamId stream, hal::DeviceAddr dst, hal::DeviceAddr src, uint64_t bytes);
  // `peer_memory` is `peer`'s, which the command keeps alive.
  Status copy_to_peer(hal::StreamId stream, std::shared_ptr<hal::Device> peer, SimMemory& peer_memory,
                      hal::DeviceAddr dst, hal::DeviceAddr src, uint64_t bytes);
  Status enqueue_host_function(hal::StreamId stream, std::function<Status(const Status&)> fn);
  // Counts the commands queued: an event recorded behind a command still queued rides
  // on that command (it completes with it) and takes no position of its own.
  StatusOr<uint64_t> stream_position(hal::StreamId stream);
  StatusOr<bool> run_next_command(hal::StreamId stream, const std::function<bool(uint64_t)>& wanted);
  Status launch(hal::StreamId stream, const hal::LaunchParams& p);

  Status abort_stream(hal::StreamId id);
  Status reset();

 private:
  StatusOr<std::shared_ptr<SimStream>> find_stream(hal::StreamId id);
  StatusOr<std::shared_ptr<SimEvent>> find_event(hal::EventId id);
  // Blocks until `done` reaches what `target` (guarded by `mu`) is now, and returns
  // that; a wait that blocks is counted first, so another thread can see that the
  // host is blocked.
  uint64_t wait_for_current(const std::atomic<uint64_t>& done, const uint64_t& target, std::mutex& mu,
                            std::condition_variable& cv);

  Status enqueue(hal::StreamId id, Command&& c);
  // Fails the stream's executing and queued commands (see abort_stream); returns at once.
  void request_abort(SimStream& s, const std::string& why);
  void stop_stream(SimStream& s);
  void stream_loop(SimStream& s);
  // Taking and running queued commands, by the stream's thread or a waiting one.
  static void claim_head(SimStream& s, Command& c, Status& prior);
  // Whether a thread other than the stream's may take the head now (call with s.mu
  // held): nothing is executing, and it is not a launch or an event wait.
  static bool host_may_take_head(const SimStream& s);
  // For stream_synchronize: the head command when the waiter may run it, if it is
  // among the first `target` commands.
  static bool claim_for_waiter(SimStream& s, uint64_t target, Command& c, Status& prior);
  void run_claimed(SimStream& s, Command& c, const Status& prior);
  Status execute(SimStream& s, Command& c);
  Status run_launch(SimStream& s, Command& c);

  SimMemory& memory_;
  LaunchScheduler& launches_;
  SimCounters& counters_;
  FaultInjector& faults_;

  std::mutex mu_;
  uint64_t next_id_ = 1;  // guarded by mu_; streams and events share it
  std::unordered_map<hal::StreamId, std::shared_ptr<SimStream>> streams_;  // guarded by mu_
  std::unordered_map<hal::EventId, std::shared_ptr<SimEvent>> events_;     // guarded by mu_
};

}  // namespace npurt::sim
