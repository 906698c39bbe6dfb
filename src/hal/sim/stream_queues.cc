#include "hal/sim/stream_queues.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "hal/sim/host_pool.h"
#include "npurt/base/hazards.h"
#include "npurt/base/trace.h"

namespace npurt::sim {

using hal::Counters;
using hal::DeviceAddr;
using hal::EventId;
using hal::FaultSite;
using hal::LaunchParams;
using hal::StreamId;

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
  DeviceAddr dst{}, src{};
  const void* host_src = nullptr;
  void* host_dst = nullptr;
  uint64_t bytes = 0;
  std::shared_ptr<SimEvent> event{};
  uint64_t event_seq = 0;
  LaunchParams launch{};
  std::string kernel_name{};  // set when the launch executes (for the trace)
  std::shared_ptr<hal::Device> peer{};  // kToPeer: the destination device, kept alive
  SimMemory* peer_memory = nullptr;     // kToPeer: its memory
  std::function<Status(const Status&)> host_fn{};  // kHost
  // An event recorded right behind this command while it was still queued: signaled
  // when the command completes, as a record command queued after it would be, without
  // a command of its own to queue, claim and complete.
  std::shared_ptr<SimEvent> signals{};
  uint64_t signal_seq = 0;
};

struct SimStream {
  StreamId id{};
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Command> queue;           // guarded by mu
  uint64_t enqueued = 0;               // guarded by mu
  std::atomic<uint64_t> posted{0};     // mirrors enqueued for lock-free spinning
  std::atomic<uint64_t> completed{0};
  Status error;                        // guarded by mu
  bool stopping = false;               // guarded by mu
  std::atomic<bool> stop_requested{false};  // lets the idle spin notice a destroy
  std::atomic<uint64_t> claimed{0};    // commands taken off the queue (under mu) to execute
  bool executing = false;              // guarded by mu: a taken command has not completed yet
  bool fresh = true;                   // only the stream thread touches it (launches run there)
  // abort_stream: set once, never cleared (the stream is in error from then on).
  std::atomic<bool> abort_requested{false};
  std::string abort_reason;                            // guarded by mu
  std::atomic<bool>* running_launch_abort = nullptr;  // guarded by mu: the executing launch's flag
  std::shared_ptr<SimEvent> waiting_on;                // guarded by mu: the event a wait blocks on
  std::thread thread;
};

namespace {

constexpr int kHostSpins = 20000;  // ~tens of microseconds before sleeping

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

std::string stream_lane(StreamId id) { return "stream " + std::to_string(id.value()); }

// One span per executed stream command, on the stream's lane.
void trace_command(StreamId id, const Command& c, double t0, const Status& st) {
  const double t1 = trace::now_us();
  const std::string lane = stream_lane(id);
  const std::string status = st.to_string();
  switch (c.kind) {
    case Command::Kind::kToDevice:
      trace::complete(lane, "copy h2d", "copy", t0, t1, {{"bytes", c.bytes}, {"dst", hex(c.dst)}, {"status", status}});
      return;
    case Command::Kind::kToHost:
      trace::complete(lane, "copy d2h", "copy", t0, t1, {{"bytes", c.bytes}, {"src", hex(c.src)}, {"status", status}});
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

void signal(SimEvent& e, uint64_t seq, const Status& st) {
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

// Waits for the event's record `seq`, or for an abort of `s`.
Status wait_for(SimStream& s, const std::shared_ptr<SimEvent>& event, uint64_t seq) {
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
  if (e.completed.load() < seq) {
    return aborted("stream " + hal::to_string(s.id) + " aborted while waiting for an event");
  }
  if (e.failed_seq == seq) return e.failure.with_context("waited-for event's producer failed");
  return ok_status();
}

}  // namespace

StreamQueues::StreamQueues(SimMemory& memory, LaunchScheduler& launches, SimCounters& counters,
                           FaultInjector& faults)
    : memory_(memory), launches_(launches), counters_(counters), faults_(faults) {}

StreamQueues::~StreamQueues() {
  std::vector<std::shared_ptr<SimStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : streams_) streams.push_back(s);
    streams_.clear();
  }
  for (auto& s : streams) stop_stream(*s);
}

// ---- streams ----

StatusOr<StreamId> StreamQueues::create_stream() {
  if (auto f = faults_.draw(FaultSite::kCreateStream)) {
    return injected_error(counters_, faults_, *f, StatusCode::kDeviceFault, "create_stream");
  }
  auto s = std::make_shared<SimStream>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s->id = StreamId(next_id_++);
    streams_.emplace(s->id, s);
  }
  s->thread = std::thread([this, s] { stream_loop(*s); });
  counters_.bump([](Counters& c) { ++c.streams_created; });
  if (trace::enabled()) trace::instant(stream_lane(s->id), "create stream", "stream");
  return s->id;
}

Status StreamQueues::destroy_stream(StreamId id) {
  std::shared_ptr<SimStream> s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return not_found("stream " + std::to_string(id.value()) + " does not exist");
    if (auto f = faults_.draw(FaultSite::kDestroyStream)) {
      return injected_error(counters_, faults_, *f, StatusCode::kDeviceFault,
                            "destroy_stream " + std::to_string(id.value()));
    }
    s = it->second;
    streams_.erase(it);
  }
  stop_stream(*s);
  counters_.bump([](Counters& c) { ++c.streams_destroyed; });
  if (trace::enabled()) trace::instant(stream_lane(id), "destroy stream", "stream");
  return ok_status();
}

// The waiting thread runs the stream's queued host-side commands itself while the
// stream's thread is not running one: a host function (a collective's MPI, say) then
// costs no hand-off to the stream's thread and back, and no second thread spins on a
// core the work needs. Stream order holds: one command executes at a time, in queue
// order. Launches stay on the stream's thread.
Status StreamQueues::stream_synchronize(StreamId id) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  const uint64_t target = read_under(s->mu, s->enqueued);
  if (s->completed.load(std::memory_order_acquire) < target) counters_.bump([](Counters& c) { ++c.host_blocked_waits; });
  for (;;) {
    const uint64_t completed = s->completed.load(std::memory_order_acquire);
    if (completed >= target) break;
    Command c;
    Status prior;
    if (claim_for_waiter(*s, target, c, prior)) {
      run_claimed(*s, c, prior);
      continue;
    }
    wait_until_reached(s->completed, completed + 1, s->mu, s->done_cv);
  }
  std::lock_guard<std::mutex> lock(s->mu);
  return s->error;
}

StatusOr<bool> StreamQueues::stream_query(StreamId id) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  std::lock_guard<std::mutex> lock(s->mu);
  if (!s->error.ok()) return s->error;
  return s->completed.load() >= s->enqueued;
}

// ---- events ----

StatusOr<EventId> StreamQueues::create_event() {
  std::lock_guard<std::mutex> lock(mu_);
  const EventId id(next_id_++);
  events_.emplace(id, std::make_shared<SimEvent>());
  counters_.bump([](Counters& c) { ++c.events_created; });
  return id;
}

Status StreamQueues::destroy_event(EventId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(id) == 0) return not_found("event " + std::to_string(id.value()) + " does not exist");
  counters_.bump([](Counters& c) { ++c.events_destroyed; });
  return ok_status();  // queued commands keep their own reference
}

Status StreamQueues::record_event(StreamId stream, EventId event) {
  NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
  if (auto f = faults_.draw(FaultSite::kRecordEvent)) {
    return injected_error(counters_, faults_, *f, StatusCode::kDeviceFault,
                          "record_event on stream " + hal::to_string(stream));
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

Status StreamQueues::wait_event(StreamId stream, StreamQueues& owner, EventId event) {
  NPURT_ASSIGN_OR_RETURN(auto e, owner.find_event(event));
  Command c;
  c.kind = Command::Kind::kWait;
  c.event_seq = read_under(e->mu, e->recorded);
  if (c.event_seq == 0) return find_stream(stream).status();  // never recorded: nothing to wait for
  c.event = std::move(e);
  return enqueue(stream, std::move(c));
}

Status StreamQueues::event_synchronize(EventId event) {
  NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
  const uint64_t target = wait_for_current(e->completed, e->recorded, e->mu, e->cv);
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->failed_seq != 0 && e->failed_seq == target) return e->failure;
  return ok_status();
}

StatusOr<bool> StreamQueues::event_query(EventId event) {
  NPURT_ASSIGN_OR_RETURN(auto e, find_event(event));
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->completed.load() < e->recorded) return false;
  if (e->failed_seq != 0 && e->failed_seq == e->recorded) return e->failure;
  return true;
}

// ---- enqueueing commands ----

Status StreamQueues::copy_to_device(StreamId stream, DeviceAddr dst, const void* src, uint64_t bytes) {
  if (bytes == 0) return find_stream(stream).status();
  if (!src) return invalid_argument("copy_to_device: null host source");
  NPURT_RETURN_IF_ERROR(memory_.check_range(dst, bytes, "copy_to_device destination"));
  return enqueue(stream, Command{.kind = Command::Kind::kToDevice, .dst = dst, .host_src = src, .bytes = bytes});
}

Status StreamQueues::copy_to_host(StreamId stream, void* dst, DeviceAddr src, uint64_t bytes) {
  if (bytes == 0) return find_stream(stream).status();
  if (!dst) return invalid_argument("copy_to_host: null host destination");
  NPURT_RETURN_IF_ERROR(memory_.check_range(src, bytes, "copy_to_host source"));
  return enqueue(stream, Command{.kind = Command::Kind::kToHost, .src = src, .host_dst = dst, .bytes = bytes});
}

Status StreamQueues::copy_on_device(StreamId stream, DeviceAddr dst, DeviceAddr src, uint64_t bytes) {
  if (bytes == 0) return find_stream(stream).status();
  NPURT_RETURN_IF_ERROR(memory_.check_range(dst, bytes, "copy_on_device destination"));
  NPURT_RETURN_IF_ERROR(memory_.check_range(src, bytes, "copy_on_device source"));
  return enqueue(stream, Command{.kind = Command::Kind::kOnDevice, .dst = dst, .src = src, .bytes = bytes});
}

Status StreamQueues::copy_to_peer(StreamId stream, std::shared_ptr<hal::Device> peer, SimMemory& peer_memory,
                                  DeviceAddr dst, DeviceAddr src, uint64_t bytes) {
  if (bytes == 0) return find_stream(stream).status();
  NPURT_RETURN_IF_ERROR(memory_.check_range(src, bytes, "copy_to_peer source"));
  NPURT_RETURN_IF_ERROR(peer_memory.check_range(dst, bytes, "copy_to_peer destination (on the peer)"));
  Command c;
  c.kind = Command::Kind::kToPeer;
  c.dst = dst;
  c.src = src;
  c.bytes = bytes;
  c.peer = std::move(peer);
  c.peer_memory = &peer_memory;
  return enqueue(stream, std::move(c));
}

Status StreamQueues::enqueue_host_function(StreamId stream, std::function<Status(const Status&)> fn) {
  if (!fn) return invalid_argument("enqueue_host_function: empty function");
  Command c;
  c.kind = Command::Kind::kHost;
  c.host_fn = std::move(fn);
  return enqueue(stream, std::move(c));
}

Status StreamQueues::launch(StreamId stream, const LaunchParams& p) {
  NPURT_RETURN_IF_ERROR(launches_.check(p));
  Command c;
  c.kind = Command::Kind::kLaunch;
  c.launch = p;
  return enqueue(stream, std::move(c));
}

// ---- faults ----

Status StreamQueues::abort_stream(StreamId id) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  request_abort(*s, "stream " + std::to_string(id.value()) + " aborted");
  wait_until_reached(s->completed, read_under(s->mu, s->enqueued), s->mu, s->done_cv);
  counters_.bump([](Counters& c) { ++c.streams_aborted; });
  if (trace::enabled()) trace::instant(stream_lane(id), "abort stream", "stream");
  return ok_status();
}

Status StreamQueues::reset() {
  std::vector<std::shared_ptr<SimStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : streams_) streams.push_back(s);
  }
  // Every stream is told before any is waited for: one may wait on another's event.
  for (auto& s : streams) request_abort(*s, "device reset");
  for (auto& s : streams) wait_until_reached(s->completed, read_under(s->mu, s->enqueued), s->mu, s->done_cv);
  counters_.bump([&](Counters& c) {
    ++c.resets;
    c.streams_aborted += streams.size();
  });
  if (trace::enabled()) trace::instant("device", "reset", "device");
  return ok_status();
}

// ---- private ----

StatusOr<std::shared_ptr<SimStream>> StreamQueues::find_stream(StreamId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(id);
  if (it == streams_.end()) return not_found("stream " + std::to_string(id.value()) + " does not exist");
  return it->second;
}

StatusOr<std::shared_ptr<SimEvent>> StreamQueues::find_event(EventId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(id);
  if (it == events_.end()) return not_found("event " + std::to_string(id.value()) + " does not exist");
  return it->second;
}

uint64_t StreamQueues::wait_for_current(const std::atomic<uint64_t>& done, const uint64_t& target, std::mutex& mu,
                                        std::condition_variable& cv) {
  const uint64_t now = read_under(mu, target);
  if (done.load(std::memory_order_acquire) < now) counters_.bump([](Counters& c) { ++c.host_blocked_waits; });
  wait_until_reached(done, now, mu, cv);
  return now;
}

void StreamQueues::request_abort(SimStream& s, const std::string& why) {
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
  launches_.wake_core_waiters();  // a launch of this stream may be waiting for cores
  if (waiting) {
    // Under the event's mutex, so a waiter between its check and its sleep still wakes.
    std::lock_guard<std::mutex> lock(waiting->mu);
    waiting->cv.notify_all();
  }
}

Status StreamQueues::enqueue(StreamId id, Command&& c) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (!s->error.ok()) return s->error.with_context("stream " + std::to_string(id.value()) + " is in an error state");
    if (s->stopping) return failed_precondition("stream " + std::to_string(id.value()) + " is being destroyed");
    if (c.kind == Command::Kind::kRecord && !s->queue.empty() && !s->queue.back().signals && !trace::enabled()) {
      Command& last = s->queue.back();
      last.signals = std::move(c.event);
      last.signal_seq = c.event_seq;
      return ok_status();  // nothing new to run: no one to wake
    }
    s->queue.push_back(std::move(c));
    ++s->enqueued;
    s->posted.store(s->enqueued, std::memory_order_release);
  }
  s->work_cv.notify_one();
  return ok_status();
}

void StreamQueues::stop_stream(SimStream& s) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  s.stop_requested.store(true, std::memory_order_release);
  s.work_cv.notify_one();
  s.thread.join();
}

// Takes the queue's head to execute; call with s.mu held and no command executing.
void StreamQueues::claim_head(SimStream& s, Command& c, Status& prior) {
  c = std::move(s.queue.front());
  s.queue.pop_front();
  s.executing = true;
  s.claimed.fetch_add(1, std::memory_order_release);
  if (s.abort_requested.load() && s.error.ok()) s.error = aborted(s.abort_reason);
  prior = s.error;
}

bool StreamQueues::host_may_take_head(const SimStream& s) {
  if (s.queue.empty()) return false;
  if (s.executing && !hazard_on(Hazard::kWaitersIgnoreStreamOrder)) return false;
  const Command::Kind kind = s.queue.front().kind;
  return kind != Command::Kind::kLaunch && kind != Command::Kind::kWait;
}

bool StreamQueues::claim_for_waiter(SimStream& s, uint64_t target, Command& c, Status& prior) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.claimed.load() >= target || !host_may_take_head(s)) return false;
  claim_head(s, c, prior);
  return true;
}

StatusOr<uint64_t> StreamQueues::stream_position(StreamId id) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  return read_under(s->mu, s->enqueued);
}

StatusOr<bool> StreamQueues::run_next_command(StreamId id, const std::function<bool(uint64_t)>& wanted) {
  NPURT_ASSIGN_OR_RETURN(auto s, find_stream(id));
  // Nothing queued (the usual answer while a peer's thread keeps up): say so without
  // taking the lock the stream's thread claims under. A stale read only skips a turn.
  if (s->posted.load(std::memory_order_relaxed) == s->claimed.load(std::memory_order_relaxed)) return false;
  Command c;
  Status prior;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    // The head's position: every command before it has been taken.
    if (!host_may_take_head(*s) || !wanted(s->claimed.load())) return false;
    claim_head(*s, c, prior);
  }
  counters_.bump([](Counters& k) { ++k.lent_thread_commands; });
  run_claimed(*s, c, prior);
  return true;
}

void StreamQueues::run_claimed(SimStream& s, Command& c, const Status& prior) {
  const bool tracing = trace::enabled();
  const double t0 = tracing ? trace::now_us() : 0;
  Status st = prior.ok() ? execute(s, c) : prior;
  if (!prior.ok() && c.kind == Command::Kind::kHost) c.host_fn(prior).ignore();  // told, never run as work
  if (tracing) trace_command(s.id, c, t0, st);
  if (c.kind == Command::Kind::kRecord) signal(*c.event, c.event_seq, st);
  bool more = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!st.ok() && s.error.ok()) s.error = st;
    if (s.abort_requested.load() && s.error.ok()) s.error = aborted(s.abort_reason);
    // Under the lock: the record counts as done no later than the command does.
    if (c.signals) signal(*c.signals, c.signal_seq, s.error);
    s.executing = false;
    more = !s.queue.empty() || s.stopping;
    s.completed.fetch_add(1, std::memory_order_release);
  }
  s.done_cv.notify_all();
  if (more) s.work_cv.notify_one();  // the stream's thread may be waiting for this one to end
}

void StreamQueues::stream_loop(SimStream& s) {
  for (;;) {
    spin_until(
        [&] {
          return s.posted.load(std::memory_order_acquire) != s.claimed.load(std::memory_order_acquire) ||
                 s.stop_requested.load();
        },
        kHostSpins);
    Command c;
    Status prior;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.work_cv.wait(lock, [&] { return !s.executing && (!s.queue.empty() || s.stopping); });
      if (s.queue.empty()) return;  // stopping and drained
      claim_head(s, c, prior);
    }
    run_claimed(s, c, prior);
  }
}

Status StreamQueues::execute(SimStream& s, Command& c) {
  const GlobalMemory& gm = memory_.gm();
  switch (c.kind) {
    case Command::Kind::kToDevice:
      if (auto f = faults_.draw(FaultSite::kCopyToDevice)) {
        // Half-done, as a failed DMA leaves it: the destination holds garbage.
        std::memset(gm.ptr(c.dst), 0xff, c.bytes);
        gm.mark_initialized(c.dst, c.bytes);
        return injected_error(counters_, faults_, *f, StatusCode::kDeviceFault,
                              "copy to device of " + std::to_string(c.bytes) + " bytes to " + hex(c.dst) +
                                  " on stream " + hal::to_string(s.id));
      }
      std::memcpy(gm.ptr(c.dst), c.host_src, c.bytes);
      gm.mark_initialized(c.dst, c.bytes);
      counters_.bump([&](Counters& k) { ++k.h2d_transfers; k.h2d_bytes += c.bytes; });
      return ok_status();
    case Command::Kind::kToHost:
      if (auto f = faults_.draw(FaultSite::kCopyToHost)) {
        std::memset(c.host_dst, 0xff, c.bytes);
        return injected_error(counters_, faults_, *f, StatusCode::kDeviceFault,
                              "copy to host of " + std::to_string(c.bytes) + " bytes from " + hex(c.src) +
                                  " on stream " + hal::to_string(s.id));
      }
      std::memcpy(c.host_dst, gm.ptr(c.src), c.bytes);
      counters_.bump([&](Counters& k) { ++k.d2h_transfers; k.d2h_bytes += c.bytes; });
      return ok_status();
    case Command::Kind::kOnDevice:
      std::memmove(gm.ptr(c.dst), gm.ptr(c.src), c.bytes);
      gm.mark_initialized(c.dst, c.bytes);
      counters_.bump([&](Counters& k) { ++k.d2d_transfers; k.d2d_bytes += c.bytes; });
      return ok_status();
    case Command::Kind::kToPeer: {
      const GlobalMemory& to = c.peer_memory->gm();
      std::memcpy(to.ptr(c.dst), gm.ptr(c.src), c.bytes);
      to.mark_initialized(c.dst, c.bytes);
      c.peer_memory = nullptr;
      c.peer.reset();
      counters_.bump([&](Counters& k) { ++k.peer_transfers; k.peer_bytes += c.bytes; });
      return ok_status();
    }
    case Command::Kind::kHost: {
      Status st = c.host_fn(ok_status());
      c.host_fn = nullptr;  // what it captured goes now, not when the command is overwritten
      counters_.bump([](Counters& k) { ++k.host_functions; });
      return st.ok() ? st : st.with_context("host function");
    }
    case Command::Kind::kRecord:
      return ok_status();
    case Command::Kind::kWait:
      return wait_for(s, c.event, c.event_seq);
    case Command::Kind::kLaunch:
      return run_launch(s, c);
  }
  return internal_error("unknown stream command");
}

// A launch, with its abort flag registered for request_abort to set while it runs.
Status StreamQueues::run_launch(SimStream& s, Command& c) {
  std::atomic<bool> abort{false};
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
  return launches_.run(c.launch, LaunchStream{s.id, s.fresh, abort, s.abort_requested}, c.kernel_name);
}

}  // namespace npurt::sim
