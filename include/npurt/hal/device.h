// The device interface (HAL): everything npurt needs from an NPU, and nothing more.
//
// Ownership: every object a Device hands out (memory blocks, streams, events) is
// identified by a value of its own type (ids.h) and owned by the caller until it frees
// it; the owning handles in hal/handles.h do that automatically and keep the device
// (held as a std::shared_ptr by everything that uses it) alive meanwhile. Handles are never reused
// within a device's lifetime except device addresses, which the allocator recycles on
// purpose (that is how real devices behave, and what the stale-instruction hazard is
// about).
//
// Asynchrony: copies, code uploads, launches and event records/waits are *stream
// commands*: they return once enqueued and execute later, in order, on their stream.
// Host memory passed to a copy must stay valid and unchanged (h2d) or untouched (d2h)
// until the command completes (stream_synchronize, event_synchronize, or a query that
// reports completion). Commands on different streams are unordered unless an event
// orders them.
//
// Errors: a call returns an error now when the request itself is malformed (bad
// handle, out-of-range address, unverified image). A failure while executing
// (a kernel fault, a sanitizer hazard) puts that stream into an error state: the
// failing command and everything queued after it report the error through
// stream_synchronize / stream_query / events recorded after it, and later enqueues on
// that stream fail with the same error. Other streams and the device stay usable; a
// failed stream is destroyed and replaced by its owner.
//
// Threading: all methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/counters.h"
#include "npurt/hal/faults.h"
#include "npurt/hal/ids.h"
#include "npurt/isa/image.h"

namespace npurt::hal {


// One launch argument. Buffers are (address, length) ranges inside one live
// allocation; the kernel can touch exactly those bytes. Scalars carry raw bits
// (int64, or an f32 in the low 32 bits).
struct KernelArg {
  static KernelArg buffer(DeviceAddr addr, uint64_t bytes) { return {false, addr, bytes, 0}; }
  static KernelArg scalar_i64(int64_t v) { return {true, DeviceAddr{}, 0, static_cast<uint64_t>(v)}; }
  static KernelArg scalar_f32(float v);

  bool is_scalar = false;
  DeviceAddr addr{};
  uint64_t bytes = 0;
  uint64_t bits = 0;
};

struct LaunchParams {
  DeviceAddr image{};     // where the image was uploaded with upload_code
  uint32_t grid = 1;      // number of blocks; block i runs on core i % num_cores
  std::vector<KernelArg> args;
};

struct DeviceInfo {
  std::string name;
  uint32_t num_cores = 0;
  uint64_t global_memory_bytes = 0;
  uint32_t local_memory_bytes = 0;  // per core
  uint32_t icache_line_bytes = 0;
  uint32_t icache_sets = 0;
  uint32_t icache_ways = 0;
  std::string details = {};  // anything else the driver tells (the simulator: its tile kernels' target)
  // Global memory is host memory this process can address (Device::host_address):
  // host code in stream order may read and write it directly (MPI, say).
  bool host_addressable_memory = false;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;

  // ---- global memory ----
  // Allocates `bytes` (> 0) aligned to `alignment` (a power of two <= 4096).
  virtual StatusOr<DeviceAddr> allocate(uint64_t bytes, uint64_t alignment = 256) = 0;
  // Frees a block returned by allocate. The caller guarantees no queued or running
  // command still uses it (the memory/ and exec/ layers track that).
  virtual Status free(DeviceAddr addr) = 0;

  // ---- streams and events ----
  virtual StatusOr<StreamId> create_stream() = 0;
  // Waits for the stream's queued commands, then destroys it.
  virtual Status destroy_stream(StreamId stream) = 0;
  // Blocks until every command enqueued so far has completed; returns the stream's
  // error, if any.
  virtual Status stream_synchronize(StreamId stream) = 0;
  // Non-blocking: true when every enqueued command has completed; the stream's
  // error if one occurred.
  virtual StatusOr<bool> stream_query(StreamId stream) = 0;

  virtual StatusOr<EventId> create_event() = 0;
  virtual Status destroy_event(EventId event) = 0;
  // Enqueue: the event completes when the stream reaches this point.
  virtual Status record_event(StreamId stream, EventId event) = 0;
  // Enqueue: the stream waits for the event's most recent record (as of this call).
  virtual Status wait_event(StreamId stream, EventId event) = 0;
  virtual Status event_synchronize(EventId event) = 0;
  virtual StatusOr<bool> event_query(EventId event) = 0;

  // ---- data movement (stream commands) ----
  virtual Status copy_to_device(StreamId stream, DeviceAddr dst, const void* src, uint64_t bytes) = 0;
  virtual Status copy_to_host(StreamId stream, void* dst, DeviceAddr src, uint64_t bytes) = 0;
  virtual Status copy_on_device(StreamId stream, DeviceAddr dst, DeviceAddr src, uint64_t bytes) = 0;

  // ---- peers: devices of one group (several NPUs driven by one process) ----
  // Whether this device can copy into `peer`'s global memory and wait for its events
  // (simulated NPUs: every other simulated NPU of the process).
  virtual bool can_access_peer(const Device& peer) const = 0;
  // Enqueue: copies `bytes` from `src` in this device's global memory to `dst` in
  // `peer`'s. Both ranges must be inside live allocations now; the caller orders the
  // copy with the peer's own use of `dst` (wait_peer_event, or a rendezvous of the
  // streams) and keeps `dst` allocated until it ran. The command keeps `peer` alive.
  virtual Status copy_to_peer(StreamId stream, std::shared_ptr<Device> peer, DeviceAddr dst, DeviceAddr src,
                              uint64_t bytes) = 0;
  // Enqueue: the stream waits for the most recent record (as of this call) of
  // `peer`'s event; a failure there fails this stream, as for wait_event.
  virtual Status wait_peer_event(StreamId stream, Device& peer, EventId event) = 0;

  // ---- host work in stream order ----
  // Enqueue: runs `fn(ok)` when the stream reaches it, and completes when `fn`
  // returns; an error it returns fails the stream like a kernel fault. The calling
  // thread does not wait (collectives run MPI this way). `fn` runs on the stream's own
  // thread, or on a thread blocked in stream_synchronize of its stream or lent to it
  // (run_next_command), which may run queued host functions and copies itself (in
  // stream order, one command at a time) rather than hand them to the stream's thread
  // and wait to be woken. `fn` may block (say, until peers' streams arrive) but must
  // not wait for later commands of its own stream. When an earlier command of the
  // stream failed, `fn` is still called, with that error, so it can tell whoever
  // waits on it (a collective's peers); the stream keeps its error and `fn`'s result
  // is ignored.
  virtual Status enqueue_host_function(StreamId stream, std::function<Status(const Status& stream_error)> fn) = 0;
  // How many commands the stream has been given since it was created: the position
  // the next command enqueued on it takes (positions count from 0). kUnimplemented
  // where the driver does not count them.
  virtual StatusOr<uint64_t> stream_position(StreamId stream);
  // Lends the calling thread to the stream: runs the stream's next command here, now,
  // when it may run on a host thread (none of the stream's commands is executing and
  // the next is a copy, a host function or an event record) and `wanted(position)`
  // holds for that command's position, and returns whether it ran one. `wanted` is
  // checked under the stream's lock, so what it tests cannot change between the check
  // and the claim; it must not block or call into the device. With the position, a
  // caller runs only commands it enqueued itself: a thread that waits for a peer's
  // stream (an in-process collective's meeting) runs the peer's part of the collective
  // instead of waiting for that stream's thread to wake, and never the peer's other
  // work. Drivers whose streams are hardware queues keep the default: nothing run.
  virtual StatusOr<bool> run_next_command(StreamId stream, const std::function<bool(uint64_t position)>& wanted);

  // ---- code ----
  // Writes a verified image into GM at `dst` (a block of at least image.bytes()
  // bytes) and returns once it is there. This is the only way code reaches GM.
  // It invalidates no instruction cache: cores that cached lines of a previous image
  // at the same addresses keep them until a fresh stream's first launch.
  virtual Status upload_code(DeviceAddr dst, const isa::Image& image) = 0;

  // Enqueue a kernel launch.
  virtual Status launch(StreamId stream, const LaunchParams& params) = 0;

  // ---- faults ----
  // Stops the stream's work: the command executing ends early (a kernel within a few
  // instructions, an event wait at once; a host function already running is waited
  // for) and fails with kAborted, as does every command queued after it; returns once
  // the stream is idle. The stream is then in error, as after a kernel fault, and its
  // owner destroys and replaces it. This is how work that would never finish (a hung
  // kernel) is abandoned. Aborting an idle stream puts it in error too.
  virtual Status abort_stream(StreamId stream) = 0;
  // Device reset: abort_stream on every stream. Memory blocks, streams (in error),
  // events and the code in memory survive; the bytes aborted work was writing are
  // undefined.
  virtual Status reset() = 0;

  // ---- host access, where DeviceInfo::host_addressable_memory ----
  // The host address of [addr, +bytes), which must lie inside one live allocation, for
  // host code that runs in stream order (a host function: what came before it on the
  // stream is done, what comes after has not started) to read or, with `writes`, write
  // directly; the device then counts the bytes as written, as after a copy into them.
  // The address stays valid while the allocation lives. kUnimplemented where memory is
  // not host-addressable; kOutOfRange for a range outside one live allocation.
  virtual StatusOr<uint8_t*> host_address(DeviceAddr addr, uint64_t bytes, bool writes);

  // ---- fault injection (faults.h), where the driver offers it ----
  // Replaces the device's plan (an empty FaultPlan turns injection off) and restarts
  // the per-site operation counts. kInvalidArgument when a rate is outside [0, 1] or a
  // scripted fault has nth 0; kUnimplemented, naming the device, where it cannot.
  virtual Status set_fault_plan(FaultPlan plan);
  virtual StatusOr<FaultStats> fault_stats() const;
  // The faults injected since the last call, oldest first.
  virtual StatusOr<std::vector<InjectedFault>> take_fault_log();

  // ---- observation ----
  virtual Counters counters() const = 0;
};

}  // namespace npurt::hal
