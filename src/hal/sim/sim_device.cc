// SimDevice: the simulated NPU (npurt/hal/sim/sim_device.h) as a hal::Device.
//
// It only composes the simulator's parts, each the owner of one concern: SimMemory
// (global memory and its allocator), StreamQueues (streams, events and the commands
// on them), LaunchScheduler (running a kernel on the cores) and the FaultInjector,
// with the counters they share. Peers are other SimDevices: a copy to one writes its
// SimMemory, a wait on one's event waits in its StreamQueues.
#include <memory>
#include <string>
#include <utility>

#include "hal/sim/fault_injector.h"
#include "hal/sim/launch_scheduler.h"
#include "hal/sim/sim_counters.h"
#include "hal/sim/sim_memory.h"
#include "hal/sim/stream_queues.h"
#include "hal/sim/tile_kernels.h"
#include "npurt/base/math.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::hal {
namespace {

class SimDevice final : public Device {
 public:
  SimDevice(const SimOptions& o, const sim::GlobalMemory& gm)
      : memory_(gm, counters_, faults_),
        launches_(o, memory_, counters_, faults_),
        streams_(memory_, launches_, counters_, faults_) {
    info_ = DeviceInfo{"npurt-sim",         o.num_cores,   o.global_memory_bytes,
                       o.local_memory_bytes, o.icache_line_bytes, o.icache_sets,
                       o.icache_ways,        std::string("tile kernels: ") + sim::tile_kernels_target()};
    info_.host_addressable_memory = true;  // the device's memory is an mmap of this process
  }

  const DeviceInfo& info() const override { return info_; }

  // ---- memory ----
  StatusOr<DeviceAddr> allocate(uint64_t bytes, uint64_t alignment) override {
    return memory_.allocate(bytes, alignment);
  }
  Status free(DeviceAddr addr) override { return memory_.free(addr); }
  StatusOr<uint8_t*> host_address(DeviceAddr addr, uint64_t bytes, bool writes) override {
    return memory_.host_address(addr, bytes, writes);
  }

  // ---- streams ----
  StatusOr<StreamId> create_stream() override { return streams_.create_stream(); }
  Status destroy_stream(StreamId id) override { return streams_.destroy_stream(id); }
  Status stream_synchronize(StreamId id) override { return streams_.stream_synchronize(id); }
  StatusOr<bool> stream_query(StreamId id) override { return streams_.stream_query(id); }

  // ---- events ----
  StatusOr<EventId> create_event() override { return streams_.create_event(); }
  Status destroy_event(EventId id) override { return streams_.destroy_event(id); }
  Status record_event(StreamId stream, EventId event) override { return streams_.record_event(stream, event); }
  Status wait_event(StreamId stream, EventId event) override { return streams_.wait_event(stream, streams_, event); }
  Status event_synchronize(EventId event) override { return streams_.event_synchronize(event); }
  StatusOr<bool> event_query(EventId event) override { return streams_.event_query(event); }

  // ---- data movement ----
  Status copy_to_device(StreamId stream, DeviceAddr dst, const void* src, uint64_t bytes) override {
    return streams_.copy_to_device(stream, dst, src, bytes);
  }
  Status copy_to_host(StreamId stream, void* dst, DeviceAddr src, uint64_t bytes) override {
    return streams_.copy_to_host(stream, dst, src, bytes);
  }
  Status copy_on_device(StreamId stream, DeviceAddr dst, DeviceAddr src, uint64_t bytes) override {
    return streams_.copy_on_device(stream, dst, src, bytes);
  }

  // ---- peers ----
  bool can_access_peer(const Device& peer) const override { return dynamic_cast<const SimDevice*>(&peer) != nullptr; }

  Status copy_to_peer(StreamId stream, std::shared_ptr<Device> peer, DeviceAddr dst, DeviceAddr src,
                      uint64_t bytes) override {
    auto* to = dynamic_cast<SimDevice*>(peer.get());
    if (to == nullptr) return invalid_argument("copy_to_peer: the peer is not a simulated NPU");
    sim::SimMemory& to_memory = to->memory_;
    return streams_.copy_to_peer(stream, std::move(peer), to_memory, dst, src, bytes);
  }

  Status wait_peer_event(StreamId stream, Device& peer, EventId event) override {
    auto* owner = dynamic_cast<SimDevice*>(&peer);
    if (owner == nullptr) return invalid_argument("wait_peer_event: the peer is not a simulated NPU");
    return streams_.wait_event(stream, owner->streams_, event);
  }

  // ---- host work, code and launches ----
  Status enqueue_host_function(StreamId stream, std::function<Status(const Status&)> fn) override {
    return streams_.enqueue_host_function(stream, std::move(fn));
  }
  StatusOr<uint64_t> stream_position(StreamId stream) override { return streams_.stream_position(stream); }
  StatusOr<bool> run_next_command(StreamId stream, const std::function<bool(uint64_t)>& wanted) override {
    return streams_.run_next_command(stream, wanted);
  }
  Status upload_code(DeviceAddr dst, const isa::Image& image) override { return memory_.upload_code(dst, image); }
  Status launch(StreamId stream, const LaunchParams& p) override { return streams_.launch(stream, p); }

  Counters counters() const override { return counters_.snapshot(); }

  // ---- faults ----
  Status abort_stream(StreamId id) override { return streams_.abort_stream(id); }
  Status reset() override { return streams_.reset(); }

  Status set_fault_plan(FaultPlan plan) override { return faults_.set_plan(std::move(plan)); }
  StatusOr<FaultStats> fault_stats() const override { return faults_.stats(); }
  StatusOr<std::vector<InjectedFault>> take_fault_log() override { return faults_.take_log(); }

 private:
  DeviceInfo info_;
  // Declared in the order they depend on each other: destroyed in reverse, the streams
  // (whose threads run launches on the cores, in the memory) stop first.
  sim::SimCounters counters_;
  sim::FaultInjector faults_;
  sim::SimMemory memory_;
  sim::LaunchScheduler launches_;
  sim::StreamQueues streams_;
};

Status validate(const SimOptions& o) {
  if (o.num_cores == 0 || o.num_cores > 1024) return invalid_argument("num_cores must be in [1, 1024]");
  if (o.global_memory_bytes < (1u << 20) || o.global_memory_bytes > (1ull << 40) ||
      o.global_memory_bytes % 4096 != 0) {
    return invalid_argument("global_memory_bytes must be a multiple of 4096 in [1 MiB, 1 TiB]");
  }
  if (o.local_memory_bytes < 1024 || o.local_memory_bytes > (64u << 20)) {
    return invalid_argument("local_memory_bytes must be in [1 KiB, 64 MiB]");
  }
  if (!is_pow2(o.icache_line_bytes) || o.icache_line_bytes < isa::kInsnBytes || o.icache_line_bytes > 4096) {
    return invalid_argument("icache_line_bytes must be a power of two in [16, 4096]");
  }
  if (!is_pow2(o.icache_sets) || o.icache_sets > (1u << 16)) {
    return invalid_argument("icache_sets must be a power of two <= 65536");
  }
  if (o.icache_ways == 0 || o.icache_ways > 64) return invalid_argument("icache_ways must be in [1, 64]");
  return ok_status();
}

}  // namespace

StatusOr<std::shared_ptr<Device>> create_sim_device(const SimOptions& options) {
  NPURT_RETURN_IF_ERROR(validate(options).with_context("simulated device options"));
  NPURT_ASSIGN_OR_RETURN(const sim::GlobalMemory gm, sim::SimMemory::reserve(options));
  return std::shared_ptr<Device>(new SimDevice(options, gm));
}

}  // namespace npurt::hal
