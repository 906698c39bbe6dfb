#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "hal/sim/allocator.h"
#include "hal/sim/core.h"
#include "hal/sim/core_claims.h"
#include "hal/sim/fault_injector.h"
#include "hal/sim/tile_kernels.h"
#include "hal/sim/host_pool.h"
#include "npurt/base/math.h"
#include "npurt/base/trace.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::hal {
namespace {

using sim::spin_until;

constexpr uint64_t kGmBase = 0x1'0000'0000ull;  // device addresses never start at 0
constexpr int kHostSpins = 20000;               // ~tens of microseconds before sleeping

// Blocks until `counter` >= target: spins briefly (completions usually come within
// microseconds), then sleeps on `cv`, which the producer notifies under `mu`.
void wait_until_reached(const std::atomic<uint64_t>& counter, uint64_t target, std::mutex& mu,
                        std::condition_variable& cv) {
  if (spin_until([&] { return counter.load(std::memory_order_acquire) >= target; }, kHostSpins)) return;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return counter.load() >= target; });
}

// A counter guarded by `mu`, read under it.
uint64_t read_under(std::mutex& mu, const uint64_t& guarded) {
  std::lock_guard<std::mutex> lock(mu);
  return guarded;
}

struct SimEvent {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;                // guarded by mu
  std::atomic<uint64_t> completed{0};
  uint64_t failed_seq = 0;              // guarded by mu: the record that saw an error
  Status failure;                       // guarded by mu
};

struct Command {
  enum class Kind { kToDevice, kToHost, kOnDevice, kToPeer, kLaunch, kRecord, kWait, kHost };
  Kind kind = Kind::kToDevice;
  DeviceAddr dst = 0, src = 0;
  const void* host_src = nullptr;
  void* host_dst = nullptr;
  uint64_t bytes = 0;
  std::shared_ptr<SimEvent> event{};
  uint64_t event_seq = 0;
  LaunchParams launch{};
  std::string kernel_name{};  // set when the launch executes (for the trace)
  std::shared_ptr<Device> peer{};     // kToPeer: the destination device, kept alive
  std::function<Status(const Status&)> host_fn{};  // kHost
};

struct SimStream {
  StreamId id = 0;
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Command> queue;           // guarded by mu
  uint64_t enqueued = 0;               // guarded by mu
  std::atomic<uint64_t> posted{0};     // mirrors enqueued for lock-free spinning
  std::atomic<uint64_t> completed{0};
  Status error;                        // guarded by mu
  bool stopping = false;               // guarded by mu
  std::atomic<bool> stop_requested{false};  // lets the idle spin notice a destroy
  bool fresh = true;                   // only the stream thread touches it
  // abort_stream: set once, never cleared (the stream is in error from then on).
  std::atomic<bool> abort_requested{false};
  std::string abort_reason;                            // guarded by mu
  std::atomic<bool>* running_launch_abort = nullptr;  // guarded by mu: the executing launch's flag
  std::shared_ptr<SimEvent> waiting_on;                // guarded by mu: the event a wait blocks on
  std::thread thread;
};

class SimDevice final : public Device {
 public:
  SimDevice(const SimOptions& o, uint8_t* gm, uint64_t* shadow)
      : opts_(o), alloc_(kGmBase, o.global_memory_bytes), core_claims_(o.num_cores), pool_(pool_workers(o)) {
    gm_.host = gm;
    gm_.base_addr = kGmBase;
    gm_.size = o.global_memory_bytes;
    gm_.shadow = shadow;
    info_ = DeviceInfo{"npurt-sim",         o.num_cores,   o.global_memory_bytes,
                       o.local_memory_bytes, o.icache_line_bytes, o.icache_sets,
                       o.icache_ways,        std::string("tile kernels: ") + sim::tile_kernels_target()};
    info_.host_addressable_memory = true;  // the device's memory is an mmap of this process
    for (uint32_t c = 0; c < o.num_cores; ++c) {
      cores_.push_back(std::make_unique<sim::Core>(c, o.local_memory_bytes, o.icache_sets, o.icache_ways,
                                                   o.icache_line_bytes));
    }
  }

  ~SimDevice() override {
    std::vector<std::shared_ptr<SimStream>> streams;
    {
      std::lock_guard<std::mutex> lock(obj_mu_);
      for (auto& [id, s] : streams_) streams.push_back(s);
      streams_.clear();
    }
    for (auto& s : streams) stop_stream(*s);
    munmap(gm_.host, gm_.size);
    if (gm_.shadow) munmap(gm_.shadow, gm_.size / 8);
  }

  const DeviceInfo& info() const override { return info_; }

  // ---- memory ----
  StatusOr<DeviceAddr> allocate(uint64_t bytes, uint64_t alignment) override {
    if (auto f = faults_.draw(FaultSite::kAllocate)) {
      return inject(*f, StatusCode::kResourceExhausted, "allocate " + std::to_string(bytes) + " bytes");
    }
    StatusOr<DeviceAddr> addr = [&] {
      std::lock_guard<std::mutex> lock(mem_mu_);
      return alloc_.allocate(bytes, alignment);
    }();
    if (addr.ok()) {
      bump([&](Counters& c) {
        ++c.allocations;
        c.allocated_bytes += bytes;
      });
    }
    return addr;
  }

  Status free(DeviceAddr addr) override {
    std::lock_guard<std::mutex> lock(mem_mu_);
    auto block = alloc_.live_block_containing(addr, 0);
    NPURT_RETURN_IF_ERROR(alloc_.free(addr));
    // Freed bytes are garbage to their next owner.
    if (block) gm_.mark_uninitialized(block->addr, block->bytes);
    bump([&](Counters& c) {
      ++c.frees;
      c.freed_bytes += block ? block->bytes : 0;
    });
    return ok_status();
  }

  // ---- streams ----
  StatusOr<StreamId> create_stream() override {
    if (auto f = faults_.draw(FaultSite::kCreateStream)) return inject(*f, StatusCode::kDeviceFault, "create_stream");
    auto s = std::make_shared<SimStream>();
    {
      std::lock_guard<std::mutex> lock(obj_mu_);
      s->id = next_id_++;
      streams_.emplace(s->id, s);
    }
    s->thread = std::thread([this, s] { stream_loop(*s); });
    bump([](Counters& c) { ++c.streams_created; });
    if (trace::enabled()) trace::instant(stream_lane(s->id), "create stream", "stream");
    return s->id;
  }

  Status destroy_stream(StreamId id) override {
    std::shared_ptr<SimStream> s;
    {
      std::lock_guard<std::mutex> lock(obj_mu_);
      auto it = streams_.find(id);
      if (it == streams_.end()) return not_found("stream " + std::to_string(id) + " does not exist");
      if (auto f = faults_.draw(FaultSite::kDestroyStream)) {
        return inject(*f, StatusCode::kDeviceFault, "destroy_stream " + std::to_string(id));
      }
      s = it->second;
      streams_.erase(it);
    }
    stop_stream(*s);
    bump([](Counters& c) { ++c.streams_destroyed; });
    if (trace::enabled()) trace::instant(stream_lane(id), "destroy stream", "stream");
    return ok_status();
  }

  Status stream_synchronize(StreamId id) override {
    NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
    const uint64_t target = read_under(s->mu, s->enqueued);
    count_if_blocking(s->completed, target);
    wait_until_reached(s->completed, target, s->mu, s->done_cv);
    std::lock_guard<std::mutex> lock(s->mu);
    return s->error;
  }

  StatusOr<bool> stream_query(StreamId id) override {
    NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
    std::lock_guard<std::mutex> lock(s->mu);
    if (!s->error.ok()) return s->error;
    return s->completed.load() >= s->enqueued;
  }

  // ---- events ----
  StatusOr<EventId> create_event() override {
    std::lock_guard<std::mutex> lock(obj_mu_);
    const EventId id = next_id_++;
    events_.emplace(id, std::make_shared<SimEvent>());
    bump([](Counters& c) { ++c.events_created; });
    return id;
  }

  Status destroy_event(EventId id) override {
    std::lock_guard<std::mutex> lock(obj_mu_);
    if (events_.erase(id) == 0) return not_found("event " + std::to_string(id) + " does not exist");
    bump([](Counters& c) { ++c.events_destroyed; });
    return ok_status();  // queued commands keep their own reference
  }

  Status record_event(StreamId stream, EventId event) override {
    NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
    if (auto f = faults_.draw(FaultSite::kRecordEvent)) {
      return inject(*f, StatusCode::kDeviceFault, "record_event on stream " + std::to_string(stream));
    }
    Command c;
    c.kind = Command::Kind::kRecord;
    {
      std::lock_guard<std::mutex> lock(e->mu);
      c.event_seq = ++e->recorded;
    }
    c.event = std::move(e);
    return enqueue(stream, std::move(c));
  }

  Status wait_event(StreamId stream, EventId event) override {
    NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
    Command c;
    c.kind = Command::Kind::kWait;
    c.event_seq = read_under(e->mu, e->recorded);
    if (c.event_seq == 0) {
      NPURT_ASSIGN_OR_RETURN(auto s, find_stream(stream));  // never recorded: nothing to wait for
      return ok_status();
    }
    c.event = std::move(e);
    return enqueue(stream, std::move(c));
  }

  Status event_synchronize(EventId event) override {
    NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
    const uint64_t target = read_under(e->mu, e->recorded);
    count_if_blocking(e->completed, target);
    wait_until_reached(e->completed, target, e->mu, e->cv);
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->failed_seq != 0 && e->failed_seq == target) return e->failure;
    return ok_status();
  }

  StatusOr<bool> event_query(EventId event) override {
    NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->completed.load() < e->recorded) return false;
    if (e->failed_seq != 0 && e->failed_seq == e->recorded) return e->failure;
    return true;
  }

  // ---- data movement ----
  Status copy_to_device(StreamId stream, DeviceAddr dst, const void* src, uint64_t bytes) override {
    if (bytes == 0) return find_stream(stream).status();
    if (!src) return invalid_argument("copy_to_device: null host source");
    NPURT_RETURN_IF_ERROR(check_range(dst, bytes, "copy_to_device destination"));
    return enqueue(stream,
                   Command{.kind = Command::Kind::kToDevice, .dst = dst, .host_src = src, .bytes = bytes});
  }

  Status copy_to_host(StreamId stream, void* dst, DeviceAddr src, uint64_t bytes) override {
    if (bytes == 0) return find_stream(stream).status();
    if (!dst) return invalid_argument("copy_to_host: null host destination");
    NPURT_RETURN_IF_ERROR(check_range(src, bytes, "copy_to_host source"));
    return enqueue(stream,
                   Command{.kind = Command::Kind::kToHost, .src = src, .host_dst = dst, .bytes = bytes});
  }

  Status copy_on_device(StreamId stream, DeviceAddr dst, DeviceAddr src, uint64_t bytes) override {
    if (bytes == 0) return find_stream(stream).status();
    NPURT_RETURN_IF_ERROR(check_range(dst, bytes, "copy_on_device destination"));
    NPURT_RETURN_IF_ERROR(check_range(src, bytes, "copy_on_device source"));
    return enqueue(stream,
                   Command{.kind = Command::Kind::kOnDevice, .dst = dst, .src = src, .bytes = bytes});
  }

  // ---- peers ----
  bool can_access_peer(const Device& peer) const override { return dynamic_cast<const SimDevice*>(&peer) != nullptr; }

  Status copy_to_peer(StreamId stream, std::shared_ptr<Device> peer, DeviceAddr dst, DeviceAddr src,
                      uint64_t bytes) override {
    auto* to = dynamic_cast<SimDevice*>(peer.get());
    if (to == nullptr) return invalid_argument("copy_to_peer: the peer is not a simulated NPU");
    if (bytes == 0) return find_stream(stream).status();
    NPURT_RETURN_IF_ERROR(check_range(src, bytes, "copy_to_peer source"));
    NPURT_RETURN_IF_ERROR(to->check_range(dst, bytes, "copy_to_peer destination (on the peer)"));
    Command c;
    c.kind = Command::Kind::kToPeer;
    c.dst = dst;
    c.src = src;
    c.bytes = bytes;
    c.peer = std::move(peer);
    return enqueue(stream, std::move(c));
  }

  Status wait_peer_event(StreamId stream, Device& peer, EventId event) override {
    auto* owner = dynamic_cast<SimDevice*>(&peer);
    if (owner == nullptr) return invalid_argument("wait_peer_event: the peer is not a simulated NPU");
    NPURT_ASSIGN_OR_RETURN(auto e, owner->find_event(event));
    Command c;
    c.kind = Command::Kind::kWait;
    c.event_seq = read_under(e->mu, e->recorded);
    if (c.event_seq == 0) return find_stream(stream).status();  // never recorded: nothing to wait for
    c.event = std::move(e);
    return enqueue(stream, std::move(c));
  }

  Status enqueue_host_function(StreamId stream, std::function<Status(const Status&)> fn) override {
    if (!fn) return invalid_argument("enqueue_host_function: empty function");
    Command c;
    c.kind = Command::Kind::kHost;
    c.host_fn = std::move(fn);
    return enqueue(stream, std::move(c));
  }

  // ---- code ----
  Status upload_code(DeviceAddr dst, const isa::Image& image) override {
    const auto bytes = image.bytes();
    NPURT_RETURN_IF_ERROR(check_range(dst, bytes.size(), "upload_code destination"));
    const double t0 = trace::enabled() ? trace::now_us() : 0;
    std::memcpy(gm_.ptr(dst), bytes.data(), bytes.size());
    gm_.mark_initialized(dst, bytes.size());
    bump([&](Counters& c) {
      ++c.code_uploads;
      c.code_upload_bytes += bytes.size();
    });
    if (trace::enabled()) {
      trace::complete("device", "upload code " + image.name(), "code", t0, trace::now_us(),
                      {{"addr", hex(dst)}, {"bytes", bytes.size()}});
    }
    return ok_status();
  }

  Status launch(StreamId stream, const LaunchParams& p) override {
    if (p.grid == 0) return invalid_argument("launch with an empty grid");
    if (p.args.size() > isa::kMaxArgs) {
      return invalid_argument("launch with " + std::to_string(p.args.size()) + " arguments (max " +
                              std::to_string(isa::kMaxArgs) + ")");
    }
    NPURT_RETURN_IF_ERROR(check_range(p.image, sizeof(isa::ImageHeader), "launch image"));
    for (size_t i = 0; i < p.args.size(); ++i) {
      const KernelArg& a = p.args[i];
      if (a.is_scalar) continue;
      NPURT_RETURN_IF_ERROR(check_range(a.addr, std::max<uint64_t>(a.bytes, 1), "launch argument " + std::to_string(i)));
    }
    Command c;
    c.kind = Command::Kind::kLaunch;
    c.launch = p;
    return enqueue(stream, std::move(c));
  }

  Counters counters() const override {
    std::lock_guard<std::mutex> lock(counters_mu_);
    return counters_;
  }

  // ---- faults ----
  Status abort_stream(StreamId id) override {
    NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
    request_abort(*s, "stream " + std::to_string(id) + " aborted");
    wait_until_reached(s->completed, read_under(s->mu, s->enqueued), s->mu, s->done_cv);
    bump([](Counters& c) { ++c.streams_aborted; });
    if (trace::enabled()) trace::instant(stream_lane(id), "abort stream", "stream");
    return ok_status();
  }

  Status reset() override {
    std::vector<std::shared_ptr<SimStream>> streams;
    {
      std::lock_guard<std::mutex> lock(obj_mu_);
      for (auto& [id, s] : streams_) streams.push_back(s);
    }
    // Every stream is told before any is waited for: one may wait on another's event.
    for (auto& s : streams) request_abort(*s, "device reset");
    for (auto& s : streams) wait_until_reached(s->completed, read_under(s->mu, s->enqueued), s->mu, s->done_cv);
    bump([&](Counters& c) {
      ++c.resets;
      c.streams_aborted += streams.size();
    });
    if (trace::enabled()) trace::instant("device", "reset", "device");
    return ok_status();
  }

  Status set_fault_plan(FaultPlan plan) override { return faults_.set_plan(std::move(plan)); }
  StatusOr<FaultStats> fault_stats() const override { return faults_.stats(); }
  StatusOr<std::vector<InjectedFault>> take_fault_log() override { return faults_.take_log(); }

 private:
  static uint32_t pool_workers(const SimOptions& o) {
    uint32_t threads = o.host_threads ? o.host_threads : std::max(1u, std::thread::hardware_concurrency());
    threads = std::min(threads, o.num_cores);
    return threads - 1;  // the launching stream thread is the remaining one
  }

  // Counted before the wait, so another thread can see that the host is blocked.
  void count_if_blocking(const std::atomic<uint64_t>& counter, uint64_t target) {
    if (counter.load(std::memory_order_acquire) < target) bump([](Counters& c) { ++c.host_blocked_waits; });
  }

  template <typename F>
  void bump(F f) {
    std::lock_guard<std::mutex> lock(counters_mu_);
    f(counters_);
  }

  StatusOr<std::shared_ptr<SimStream>> find_stream(StreamId id) {
    std::lock_guard<std::mutex> lock(obj_mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return not_found("stream " + std::to_string(id) + " does not exist");
    return it->second;
  }

  StatusOr<std::shared_ptr<SimEvent>> find_event(EventId id) {
    std::lock_guard<std::mutex> lock(obj_mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return not_found("event " + std::to_string(id) + " does not exist");
    return it->second;
  }

  // An injected fault's error, counted.
  Status inject(const sim::FaultInjector::Fault& f, StatusCode code, const std::string& what) {
    bump([](Counters& c) { ++c.faults_injected; });
    return faults_.error(f, code, what);
  }

  // Fails the stream's executing and queued commands (see abort_stream); returns at once.
  void request_abort(SimStream& s, const std::string& why) {
    std::shared_ptr<SimEvent> waiting;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      // An idle stream is in error at once; a busy one when its executing command ends,
      // with that command's own error if it has one (a hung kernel names its fault).
      if (s.error.ok() && s.completed.load() == s.enqueued) s.error = aborted(why);
      s.abort_reason = why;
      s.abort_requested.store(true, std::memory_order_release);
      if (s.running_launch_abort != nullptr) s.running_launch_abort->store(true, std::memory_order_release);
      waiting = s.waiting_on;
    }
    core_claims_.wake();  // a launch of this stream may be waiting for cores
    if (waiting) {
      // Under the event's mutex, so a waiter between its check and its sleep still wakes.
      std::lock_guard<std::mutex> lock(waiting->mu);
      waiting->cv.notify_all();
    }
  }

  StatusOr<uint8_t*> host_address(DeviceAddr addr, uint64_t bytes, bool writes) override {
    NPURT_RETURN_IF_ERROR(check_range(addr, std::max<uint64_t>(bytes, 1), "host_address"));
    if (writes) gm_.mark_initialized(addr, bytes);
    return gm_.ptr(addr);
  }

  Status check_range(DeviceAddr addr, uint64_t bytes, std::string_view what) {
    std::lock_guard<std::mutex> lock(mem_mu_);
    if (!alloc_.live_block_containing(addr, bytes)) {
      return out_of_range(std::string(what) + ": [" + hex(addr) + ", +" + std::to_string(bytes) +
                          ") is not inside one live device allocation");
    }
    return ok_status();
  }

  Status enqueue(StreamId id, Command&& c) {
    NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (!s->error.ok()) return s->error.with_context("stream " + std::to_string(id) + " is in an error state");
      if (s->stopping) return failed_precondition("stream " + std::to_string(id) + " is being destroyed");
      s->queue.push_back(std::move(c));
      ++s->enqueued;
      s->posted.store(s->enqueued, std::memory_order_release);
    }
    s->work_cv.notify_one();
    return ok_status();
  }

  void stop_stream(SimStream& s) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.stopping = true;
    }
    s.stop_requested.store(true, std::memory_order_release);
    s.work_cv.notify_one();
    s.thread.join();
  }

  void stream_loop(SimStream& s) {
    uint64_t taken = 0;
    for (;;) {
      spin_until([&] { return s.posted.load(std::memory_order_acquire) != taken || s.stop_requested.load(); },
                 kHostSpins);
      Command c;
      Status prior;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        s.work_cv.wait(lock, [&] { return !s.queue.empty() || s.stopping; });
        if (s.queue.empty()) return;  // stopping and drained
        c = std::move(s.queue.front());
        s.queue.pop_front();
        if (s.abort_requested.load() && s.error.ok()) s.error = aborted(s.abort_reason);
        prior = s.error;
      }
      ++taken;
      const bool tracing = trace::enabled();
      const double t0 = tracing ? trace::now_us() : 0;
      Status st = prior.ok() ? execute(s, c) : prior;
      if (!prior.ok() && c.kind == Command::Kind::kHost) c.host_fn(prior).ignore();  // told, never run as work
      if (tracing) trace_command(s.id, c, t0, st);
      if (c.kind == Command::Kind::kRecord) signal(*c.event, c.event_seq, st);
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (!st.ok() && s.error.ok()) s.error = st;
        if (s.abort_requested.load() && s.error.ok()) s.error = aborted(s.abort_reason);
        s.completed.fetch_add(1, std::memory_order_release);
      }
      s.done_cv.notify_all();
    }
  }

  static std::string stream_lane(StreamId id) { return "stream " + std::to_string(id); }

  // One span per executed stream command, on the stream's lane.
  static void trace_command(StreamId id, const Command& c, double t0, const Status& st) {
    const double t1 = trace::now_us();
    const std::string lane = stream_lane(id);
    const std::string status = st.to_string();
    switch (c.kind) {
      case Command::Kind::kToDevice:
        trace::complete(lane, "copy h2d", "copy", t0, t1,
                        {{"bytes", c.bytes}, {"dst", hex(c.dst)}, {"status", status}});
        return;
      case Command::Kind::kToHost:
        trace::complete(lane, "copy d2h", "copy", t0, t1,
                        {{"bytes", c.bytes}, {"src", hex(c.src)}, {"status", status}});
        return;
      case Command::Kind::kOnDevice:
        trace::complete(lane, "copy d2d", "copy", t0, t1,
                        {{"bytes", c.bytes}, {"dst", hex(c.dst)}, {"src", hex(c.src)}, {"status", status}});
        return;
      case Command::Kind::kToPeer:
        trace::complete(lane, "copy to peer", "copy", t0, t1,
                        {{"bytes", c.bytes}, {"dst", hex(c.dst)}, {"src", hex(c.src)}, {"status", status}});
        return;
      case Command::Kind::kHost:
        trace::complete(lane, "host function", "host", t0, t1, {{"status", status}});
        return;
      case Command::Kind::kLaunch:
        trace::complete(lane, "launch " + c.kernel_name, "launch", t0, t1,
                        {{"image", hex(c.launch.image)}, {"grid", c.launch.grid}, {"status", status}});
        return;
      case Command::Kind::kRecord:
        trace::complete(lane, "record event", "event", t0, t1, {{"seq", c.event_seq}});
        return;
      case Command::Kind::kWait:
        trace::complete(lane, "wait event", "event", t0, t1, {{"seq", c.event_seq}, {"status", status}});
        return;
    }
  }

  static void signal(SimEvent& e, uint64_t seq, const Status& st) {
    {
      std::lock_guard<std::mutex> lock(e.mu);
      if (!st.ok()) {
        e.failed_seq = seq;
        e.failure = st;
      }
      uint64_t cur = e.completed.load();
      if (seq > cur) e.completed.store(seq, std::memory_order_release);
    }
    e.cv.notify_all();
  }

  Status execute(SimStream& s, Command& c) {
    switch (c.kind) {
      case Command::Kind::kToDevice:
        if (auto f = faults_.draw(FaultSite::kCopyToDevice)) {
          // Half-done, as a failed DMA leaves it: the destination holds garbage.
          std::memset(gm_.ptr(c.dst), 0xff, c.bytes);
          gm_.mark_initialized(c.dst, c.bytes);
          return inject(*f, StatusCode::kDeviceFault,
                        "copy to device of " + std::to_string(c.bytes) + " bytes to " + hex(c.dst) + " on stream " +
                            std::to_string(s.id));
        }
        std::memcpy(gm_.ptr(c.dst), c.host_src, c.bytes);
        gm_.mark_initialized(c.dst, c.bytes);
        bump([&](Counters& k) { ++k.h2d_transfers; k.h2d_bytes += c.bytes; });
        return ok_status();
      case Command::Kind::kToHost:
        if (auto f = faults_.draw(FaultSite::kCopyToHost)) {
          std::memset(c.host_dst, 0xff, c.bytes);
          return inject(*f, StatusCode::kDeviceFault,
                        "copy to host of " + std::to_string(c.bytes) + " bytes from " + hex(c.src) + " on stream " +
                            std::to_string(s.id));
        }
        std::memcpy(c.host_dst, gm_.ptr(c.src), c.bytes);
        bump([&](Counters& k) { ++k.d2h_transfers; k.d2h_bytes += c.bytes; });
        return ok_status();
      case Command::Kind::kOnDevice:
        std::memmove(gm_.ptr(c.dst), gm_.ptr(c.src), c.bytes);
        gm_.mark_initialized(c.dst, c.bytes);
        bump([&](Counters& k) { ++k.d2d_transfers; k.d2d_bytes += c.bytes; });
        return ok_status();
      case Command::Kind::kToPeer: {
        auto& to = static_cast<SimDevice&>(*c.peer);
        std::memcpy(to.gm_.ptr(c.dst), gm_.ptr(c.src), c.bytes);
        to.gm_.mark_initialized(c.dst, c.bytes);
        c.peer.reset();
        bump([&](Counters& k) { ++k.peer_transfers; k.peer_bytes += c.bytes; });
        return ok_status();
      }
      case Command::Kind::kHost: {
        Status st = c.host_fn(ok_status());
        c.host_fn = nullptr;  // what it captured goes now, not when the command is overwritten
        bump([](Counters& k) { ++k.host_functions; });
        return st.ok() ? st : st.with_context("host function");
      }
      case Command::Kind::kRecord:
        return ok_status();
      case Command::Kind::kWait:
        return wait_for(s, c.event, c.event_seq);
      case Command::Kind::kLaunch:
        return run_launch(s, c.launch, c.kernel_name);
    }
    return internal_error("unknown stream command");
  }

  // Waits for the event's record `seq`, or for an abort of `s`.
  static Status wait_for(SimStream& s, const std::shared_ptr<SimEvent>& event, uint64_t seq) {
    SimEvent& e = *event;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.waiting_on = event;
    }
    auto done = [&] { return e.completed.load(std::memory_order_acquire) >= seq || s.abort_requested.load(); };
    if (!spin_until(done, kHostSpins)) {
      std::unique_lock<std::mutex> lock(e.mu);
      e.cv.wait(lock, done);
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.waiting_on.reset();
    }
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.completed.load() < seq) return aborted("stream " + std::to_string(s.id) + " aborted while waiting for an event");
    if (e.failed_seq == seq) return e.failure.with_context("waited-for event's producer failed");
    return ok_status();
  }

  // Binds a launch to the image header and argument records it finds in GM.
  Status bind_launch(const LaunchParams& p, sim::LaunchContext& ctx, std::string& name) {
    sim::GmAllocator::Block block;
    {
      std::lock_guard<std::mutex> lock(mem_mu_);
      auto b = alloc_.live_block_containing(p.image, sizeof(isa::ImageHeader));
      if (!b) return out_of_range("launch image at " + hex(p.image) + " is no longer allocated");
      block = *b;
    }
    const std::span<const uint8_t> img(gm_.ptr(p.image), block.addr + block.bytes - p.image);
    auto layout_or = isa::read_image_layout(img);
    if (!layout_or.ok()) return layout_or.status().with_context("launch image at " + hex(p.image));
    const isa::ImageLayout& layout = *layout_or;
    isa::ImageHeader h;
    std::memcpy(&h, img.data(), sizeof h);
    // read_image_layout checked that the sections lie inside the image; names are advisory.
    if (static_cast<uint64_t>(h.name_offset) + h.name_bytes <= h.strings_bytes) {
      name.assign(reinterpret_cast<const char*>(img.data() + h.strings_offset + h.name_offset), h.name_bytes);
    }
    if (p.args.size() != layout.num_args) {
      return invalid_argument("kernel '" + name + "' takes " + std::to_string(layout.num_args) +
                              " arguments, launch passed " + std::to_string(p.args.size()));
    }
    if (layout.local_bytes > opts_.local_memory_bytes) {
      return invalid_argument("kernel '" + name + "' needs " + std::to_string(layout.local_bytes) +
                              " bytes of local memory, cores have " + std::to_string(opts_.local_memory_bytes));
    }
    if ((layout.flags & isa::kImageUsesBarrier) && p.grid > opts_.num_cores) {
      return invalid_argument("kernel '" + name + "' uses a grid barrier: grid " + std::to_string(p.grid) +
                              " exceeds the " + std::to_string(opts_.num_cores) + " cores");
    }
    ctx.gm = &gm_;
    ctx.image_addr = p.image;
    ctx.code_addr = p.image + layout.code_offset;
    ctx.num_insns = layout.code_bytes / static_cast<uint32_t>(isa::kInsnBytes);
    ctx.grid = p.grid;
    ctx.num_args = layout.num_args;
    ctx.sanitize = opts_.sanitize;
    ctx.constants = sim::ArgBinding{p.image + layout.const_offset, layout.const_bytes, 0, false, true, false};
    for (uint32_t i = 0; i < layout.num_args; ++i) {
      isa::ArgRecord rec;
      std::memcpy(&rec, img.data() + sizeof(isa::ImageHeader) + i * sizeof rec, sizeof rec);
      const KernelArg& a = p.args[i];
      const bool want_scalar = rec.kind == static_cast<uint8_t>(isa::ArgKind::kScalar);
      if (a.is_scalar != want_scalar) {
        return invalid_argument("kernel '" + name + "' argument " + std::to_string(i) + " must be a " +
                                (want_scalar ? "scalar" : "buffer"));
      }
      const auto access = static_cast<isa::Access>(rec.access);
      ctx.args[i] = sim::ArgBinding{a.addr, a.bytes, a.bits, a.is_scalar,
                                    access == isa::Access::kIn || access == isa::Access::kInOut,
                                    access == isa::Access::kOut || access == isa::Access::kInOut};
    }
    return ok_status();
  }

  Status run_launch(SimStream& s, const LaunchParams& p, std::string& name) {
    sim::LaunchContext ctx;
    NPURT_RETURN_IF_ERROR(bind_launch(p, ctx, name));
    ctx.kernel_name = name;
    std::atomic<bool> abort{false};
    ctx.abort = &abort;
    std::optional<sim::FaultInjector::Fault> injected = faults_.draw(FaultSite::kKernel, p.grid);
    if (!injected) injected = faults_.draw(FaultSite::kKernelHang, p.grid);
    if (injected) {
      ctx.inject_block = injected->block;
      ctx.inject_instruction = injected->instruction;
      ctx.inject_hang = injected->site == FaultSite::kKernelHang;
      ctx.inject_id = injected->id;
    }
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.running_launch_abort = &abort;
      if (s.abort_requested.load()) abort.store(true);
    }
    struct Unregister {
      SimStream& s;
      ~Unregister() {
        std::lock_guard<std::mutex> lock(s.mu);
        s.running_launch_abort = nullptr;
      }
    } unregister{s};

    const uint32_t used = std::min(p.grid, opts_.num_cores);
    sim::CoreClaim held(core_claims_);  // in core order: no deadlock between streams
    while (held.held() < used) {
      if (!held.claim_next(abort)) {
        return aborted("kernel '" + name + "' on stream " + std::to_string(s.id) + " aborted while waiting for core " +
                       std::to_string(held.held()));
      }
    }
    if (s.fresh) {
      for (uint32_t c = 0; c < used; ++c) cores_[c]->icache().invalidate();
      s.fresh = false;
      bump([&](Counters& k) { k.icache_invalidations += used; });
    }

    std::vector<sim::CoreStats> stats(used);
    std::vector<Status> faults(used);
    std::vector<uint32_t> fault_block(used, UINT32_MAX);
    const bool phased = ctx.grid <= opts_.num_cores;  // one block per core; barriers possible
    std::vector<sim::BlockState> blocks(phased ? used : 0);
    for (uint32_t c = 0; c < blocks.size(); ++c) blocks[c].block_id = c;
    std::vector<uint8_t> exited(used, 0);

    auto run_core = [&](uint32_t c) {
      if (phased) {
        if (exited[c]) return;
        const auto r = cores_[c]->run(blocks[c], ctx, &faults[c], stats[c]);
        if (r == sim::BlockResult::kFaulted) {
          fault_block[c] = c;
          abort.store(true);
        }
        exited[c] = r != sim::BlockResult::kAtBarrier;
        return;
      }
      for (uint32_t blk = c; blk < ctx.grid && !abort.load(std::memory_order_relaxed); blk += opts_.num_cores) {
        sim::BlockState st;
        st.block_id = blk;
        const auto r = cores_[c]->run(st, ctx, &faults[c], stats[c]);
        if (r == sim::BlockResult::kFaulted) {
          fault_block[c] = blk;
          abort.store(true);
          return;
        }
      }
    };
    const bool tracing = trace::enabled();
    auto traced_core = [&](uint32_t c) {
      if (phased && exited[c]) return;
      const double t0 = trace::now_us();
      run_core(c);
      trace::complete("core " + std::to_string(c), name, "core", t0, trace::now_us(),
                      {{"stream", s.id}, {"image", hex(p.image)}, {"grid", p.grid}});
    };
    for (;;) {
      if (tracing) {
        pool_.parallel_for(used, traced_core);
      } else {
        pool_.parallel_for(used, run_core);
      }
      if (!phased || abort.load() || std::all_of(exited.begin(), exited.end(), [](uint8_t e) { return e; })) break;
    }

    sim::CoreStats total;
    for (const auto& st : stats) {
      total.icache_hits += st.icache_hits;
      total.icache_misses += st.icache_misses;
      total.stale_fetch_hazards += st.stale_fetch_hazards;
      total.uninit_read_hazards += st.uninit_read_hazards;
    }
    // Report the fault of the lowest block: deterministic whatever the thread timing.
    const auto first = std::min_element(fault_block.begin(), fault_block.end());
    const bool faulted = *first != UINT32_MAX;
    bump([&](Counters& k) {
      ++k.launches;
      k.blocks += p.grid;
      k.icache_hits += total.icache_hits;
      k.icache_misses += total.icache_misses;
      k.hazard_stale_fetch += total.stale_fetch_hazards;
      k.hazard_uninit_read += total.uninit_read_hazards;
      if (faulted) ++k.kernel_faults;
    });
    if (injected) {
      // Whatever the kernel was writing is garbage now.
      for (uint32_t i = 0; i < ctx.num_args; ++i) {
        const sim::ArgBinding& a = ctx.args[i];
        if (a.writable && !a.is_scalar && a.bytes != 0) std::memset(gm_.ptr(a.addr), 0xff, a.bytes);
      }
      const std::string what = "kernel '" + name + "' on stream " + std::to_string(s.id) + ", block " +
                               std::to_string(injected->block) + ", after " +
                               std::to_string(injected->instruction) + " instructions" +
                               (ctx.inject_hang ? ": hung" : "");
      Status reported = faulted ? faults[first - fault_block.begin()]
                                : aborted("kernel '" + name + "' on stream " + std::to_string(s.id) +
                                          " aborted before its injected fault #" + std::to_string(injected->id) +
                                          " struck");
      faults_.error(*injected, reported.code(), what).ignore();  // logged; the core's own error says the rest
      bump([](Counters& k) { ++k.faults_injected; });
      return reported;
    }
    if (faulted) return faults[first - fault_block.begin()];
    if (s.abort_requested.load()) return aborted("kernel '" + name + "' on stream " + std::to_string(s.id) + " aborted");
    return ok_status();
  }

  SimOptions opts_;
  DeviceInfo info_;
  sim::GlobalMemory gm_;

  std::mutex mem_mu_;
  sim::GmAllocator alloc_;

  std::vector<std::unique_ptr<sim::Core>> cores_;
  sim::CoreClaims core_claims_;
  sim::HostPool pool_;

  std::mutex obj_mu_;
  uint64_t next_id_ = 1;
  std::unordered_map<StreamId, std::shared_ptr<SimStream>> streams_;
  std::unordered_map<EventId, std::shared_ptr<SimEvent>> events_;

  mutable std::mutex counters_mu_;
  Counters counters_;

  sim::FaultInjector faults_;
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
  void* gm = mmap(nullptr, options.global_memory_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (gm == MAP_FAILED) return resource_exhausted("cannot reserve simulated global memory");
  // Device memory is mapped with large pages on real accelerators; here it keeps the
  // cores' weight streams from stalling on page walks (a hint: ignored where
  // transparent huge pages are off).
  madvise(gm, options.global_memory_bytes, MADV_HUGEPAGE);
  void* shadow = nullptr;
  if (options.sanitize) {
    shadow = mmap(nullptr, options.global_memory_bytes / 8, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (shadow == MAP_FAILED) {
      munmap(gm, options.global_memory_bytes);
      return resource_exhausted("cannot reserve sanitizer shadow memory");
    }
  }
  return std::shared_ptr<Device>(
      new SimDevice(options, static_cast<uint8_t*>(gm), static_cast<uint64_t*>(shadow)));
}

}  // namespace npurt::hal
