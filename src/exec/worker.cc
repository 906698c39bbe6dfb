#include "npurt/exec/worker.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "npurt/base/trace.h"

namespace npurt::exec {

namespace {

// Polling the oldest run: yield for kPollYieldFor after it became the oldest, then
// sleep for 1/16 of the time it has been waiting so far (within [kMinPollSleep,
// kMaxPollSleep]). Short runs are noticed within microseconds; a run is retired at
// most ~6% of its duration late, which keeps the next submission on its slot
// close behind; long runs cost a few dozen wake-ups.
constexpr auto kPollYieldFor = std::chrono::microseconds(50);
constexpr auto kMinPollSleep = std::chrono::microseconds(10);
constexpr auto kMaxPollSleep = std::chrono::microseconds(1000);

std::string run_name(uint64_t id, uint32_t slot) {
  return "run " + std::to_string(id) + " (slot " + std::to_string(slot) + ")";
}

// Trace lanes are per worker and slot: several workers may share a process.
std::string slot_lane(uint64_t worker, uint32_t slot) {
  return "worker " + std::to_string(worker) + " slot " + std::to_string(slot);
}

std::atomic<uint64_t> next_worker_id{0};

}  // namespace

// ---- RunHandle ----

struct RunHandle::State {
  State(uint64_t id, uint32_t slot) : run_id(id), slot(slot) {}
  const uint64_t run_id;
  const uint32_t slot;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  Status status;  // guarded by mu; final once done
};

Status RunHandle::wait() const {
  if (!state_) return failed_precondition("wait on an empty RunHandle");
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done.load(std::memory_order_relaxed); });
  return state_->status;
}

bool RunHandle::done() const { return state_ && state_->done.load(std::memory_order_acquire); }

uint64_t RunHandle::run_id() const { return state_ ? state_->run_id : 0; }

uint32_t RunHandle::slot() const { return state_ ? state_->slot : 0; }

// ---- one run, from submit() to retirement ----

struct Worker::Run {
  uint64_t id = 0;
  uint32_t slot = 0;
  std::vector<CodeHandle> code;     // held until retirement
  std::optional<SlotLease> lease;   // set once the slot was taken
  bool event_recorded = false;      // the slot's event marks the end of this run
  Status status;                    // first error while staging
  uint64_t epoch = 0;               // publication epoch given to begin()
  double t_submit_us = 0, t_staged_us = 0;
  std::chrono::steady_clock::time_point staged_at;  // its run timeout counts from here
  bool timed_out = false;                           // progress thread only
  std::atomic<bool> abandoned{false};               // set by reset()
  std::shared_ptr<RunHandle::State> handle;
};

// ---- RunContext ----

Status RunContext::check_lease() const {
  NPURT_RETURN_IF_ERROR(worker_->check_lease(lease_));
  if (worker_->staging_run_.load(std::memory_order_acquire) != run_id_) {
    return failed_precondition("run " + std::to_string(run_id_) +
                               " has finished staging: its commands can only be enqueued "
                               "from its callable");
  }
  return ok_status();
}

Status RunContext::copy_to_device(hal::DeviceAddr dst, const void* src, uint64_t bytes) const {
  NPURT_RETURN_IF_ERROR(check_lease());
  return device_->copy_to_device(stream(), dst, src, bytes);
}

Status RunContext::copy_to_host(void* dst, hal::DeviceAddr src, uint64_t bytes) const {
  NPURT_RETURN_IF_ERROR(check_lease());
  return device_->copy_to_host(stream(), dst, src, bytes);
}

Status RunContext::copy_on_device(hal::DeviceAddr dst, hal::DeviceAddr src, uint64_t bytes) const {
  NPURT_RETURN_IF_ERROR(check_lease());
  return device_->copy_on_device(stream(), dst, src, bytes);
}

Status RunContext::launch(const CodeHandle& code, uint32_t grid,
                          std::vector<hal::KernelArg> args) const {
  NPURT_RETURN_IF_ERROR(check_lease());
  if (!code.valid()) return invalid_argument("launch: empty code handle");
  if (std::find(code_addrs_.begin(), code_addrs_.end(), code.address()) == code_addrs_.end()) {
    return failed_precondition("launch: image '" + code.name() + "' is not among the code handles "
                               "submitted with run " + std::to_string(run_id_) +
                               ", so nothing keeps it resident until the run retires");
  }
  return device_->launch(stream(), hal::LaunchParams{code.address(), grid, std::move(args)});
}

Status RunContext::wait_for_previous_run() const {
  NPURT_RETURN_IF_ERROR(check_lease());
  if (!previous_event_) return ok_status();
  return device_->wait_event(stream(), previous_event_);
}

// ---- Worker ----

StatusOr<std::unique_ptr<Worker>> Worker::make(FactoryKey, std::shared_ptr<CodeRegistry> registry,
                                               WorkerOptions options) {
  if (!registry) return invalid_argument("Worker: no code registry");
  std::unique_ptr<Worker> worker(new Worker(std::move(registry), options));
  NPURT_RETURN_IF_ERROR(worker->init().with_context("Worker"));
  return worker;
}

Worker::Worker(std::shared_ptr<CodeRegistry> registry, WorkerOptions options)
    : id_(next_worker_id.fetch_add(1)),
      device_(registry->shared_device()),
      registry_(std::move(registry)),
      options_(options) {}

Status Worker::init() {
  NPURT_ASSIGN_OR_RETURN(pool_, StreamPool::make(FactoryKey(), "worker " + std::to_string(id_), device_, registry_,
                                                 {.slots = options_.depth}));
  for (uint32_t i = 0; i < options_.depth; ++i) {
    NPURT_ASSIGN_OR_RETURN_CTX(hal::Event event, hal::Event::create(device_), "creating slot events");
    slot_events_.push_back(std::move(event));
  }
  slot_busy_.assign(options_.depth, 0);
  progress_ = std::thread([this] { progress_loop(); });
  return ok_status();
}

Worker::~Worker() { close(); }

void Worker::close() {
  std::lock_guard submit_lock(submit_mu_);  // no submission is staging
  if (!progress_.joinable()) return;
  drain();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  progress_cv_.notify_all();
  progress_.join();
  slot_events_.clear();
  pool_->close();  // destroys the slots' streams
}

RunHandle Worker::submit(RunFn fn, std::vector<CodeHandle> code) {
  std::lock_guard submit_lock(submit_mu_);
  auto run = std::make_unique<Run>();
  run->id = next_run_id_++;
  run->slot = static_cast<uint32_t>(run->id % options_.depth);
  run->code = std::move(code);
  run->handle = std::make_shared<RunHandle::State>(run->id, run->slot);
  if (!progress_.joinable()) {  // closed: the run fails at once, nothing was enqueued
    run->status = failed_precondition("worker " + std::to_string(id_) + " is closed")
                      .with_context(run_name(run->id, run->slot));
    run->handle->status = run->status;
    run->handle->done.store(true, std::memory_order_release);
    return RunHandle(run->handle);
  }
  {
    std::unique_lock lock(mu_);
    retired_cv_.wait(lock, [&] { return slot_busy_[run->slot] == 0; });
    slot_busy_[run->slot] = 1;
    ++submitted_;
    ++stats_.runs_submitted;
  }
  if (trace::enabled()) run->t_submit_us = trace::now_us();
  stage(*run, fn);
  run->staged_at = std::chrono::steady_clock::now();
  if (trace::enabled()) run->t_staged_us = trace::now_us();

  RunHandle handle(run->handle);
  {
    std::lock_guard lock(mu_);
    in_flight_.push_back(std::move(run));
  }
  progress_cv_.notify_one();
  return handle;
}

// Takes the run's slot, primes a fresh stream, lets the callable enqueue the run's
// work and records the slot's event after it. Any error is kept in run.status; what
// was enqueued before it still drains at retirement.
void Worker::stage(Run& run, RunFn& fn) {
  std::vector<hal::DeviceAddr> code_addrs;
  for (size_t i = 0; i < run.code.size(); ++i) {
    if (!run.code[i].valid()) {
      run.status = invalid_argument("code handle " + std::to_string(i) +
                                    " is empty (unregistered before submit?)");
      return;
    }
    code_addrs.push_back(run.code[i].address());
  }
  if (!fn) {
    run.status = invalid_argument("empty run callable");
    return;
  }
  // The image identity a naive runtime would key stream reuse on; only
  // ReusePolicy::kNaiveLastImage looks at it.
  const uint64_t image_id = run.code.empty() ? 0 : run.code.front().hash().lo;
  // Acquired after the run's handles exist: the epoch it reads covers their code.
  StatusOr<SlotLease> lease = pool_->acquire(run.slot, image_id);
  if (!lease.ok()) {
    run.status = lease.status();
    return;
  }
  run.lease = *lease;
  run.epoch = lease->epoch;
  const auto stream = static_cast<hal::StreamId>(lease->stream);

  const bool has_previous = run.id > 0 && options_.depth > 1;
  const hal::EventId previous =
      has_previous ? slot_events_[(run.slot + options_.depth - 1) % options_.depth].id() : hal::EventId{};
  RunContext ctx(this, device_.get(), *lease, run.id, std::move(code_addrs), previous);
  staging_run_.store(run.id, std::memory_order_release);
  Status staged;
  try {
    staged = fn(ctx);
  } catch (const std::exception& e) {
    staged = internal_error(std::string("run callable threw: ") + e.what());
  } catch (...) {
    staged = internal_error("run callable threw a non-standard exception");
  }
  staging_run_.store(kNoRun, std::memory_order_release);
  if (!staged.ok()) {
    run.status = staged;
    return;
  }
  Status recorded = device_->record_event(stream, slot_events_[run.slot].id());
  if (!recorded.ok()) {
    run.status = recorded.with_context("recording the run's completion event");
    return;
  }
  run.event_recorded = true;
}

void Worker::progress_loop() {
#ifdef __linux__
  // Short sleeps are this thread's polling interval: ask for 1 us timer slack
  // instead of the default 50 us.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  for (;;) {
    Run* run = nullptr;
    {
      std::unique_lock lock(mu_);
      progress_cv_.wait(lock, [&] { return !in_flight_.empty() || stopping_; });
      if (in_flight_.empty()) return;  // stopping, and everything retired
      run = in_flight_.front().get();  // only this thread pops: stays valid
    }
    wait_until_complete(*run);
    retire(*run);

    std::unique_ptr<Run> retired;
    {
      std::lock_guard lock(mu_);
      retired = std::move(in_flight_.front());
      in_flight_.pop_front();
      slot_busy_[retired->slot] = 0;
      if (retired->status.ok()) {
        ++stats_.runs_completed;
      } else {
        ++stats_.runs_failed;
      }
    }
    {
      std::lock_guard lock(retired->handle->mu);
      retired->handle->status = retired->status;
      retired->handle->done.store(true, std::memory_order_release);
    }
    retired->handle->cv.notify_all();
    {
      // Counted after the handle is done: whoever drain() releases sees every retired
      // run's handle done.
      std::lock_guard lock(mu_);
      ++retired_;
    }
    retired_cv_.notify_all();
  }
}

// Polls the run's completion event (its stream when staging failed before recording
// it) without blocking in the device, until the run completes, its timeout passes
// (then its stream is aborted) or a reset abandons it.
void Worker::wait_until_complete(Run& run) {
  if (!run.lease) return;  // nothing was enqueued
  const auto stream = static_cast<hal::StreamId>(run.lease->stream);
  const hal::EventId event = slot_events_[run.slot].id();
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    StatusOr<bool> complete = run.event_recorded ? device_->event_query(event) : device_->stream_query(stream);
    if (!complete.ok() || *complete) break;  // an error completes the run too
    if (run.abandoned.load(std::memory_order_acquire)) return;
    const auto now = std::chrono::steady_clock::now();
    if (options_.run_timeout.count() > 0 && now - run.staged_at >= options_.run_timeout) {
      // Work that will not finish: stop it, so that its stream drains and its slot
      // can take a fresh one.
      run.timed_out = true;
      device_->abort_stream(stream).ignore();
      return;
    }
    const auto waited = now - start;
    if (waited < kPollYieldFor) {
      std::this_thread::yield();
    } else {
      std::chrono::steady_clock::duration nap =
          std::clamp<std::chrono::steady_clock::duration>(waited / 16, kMinPollSleep, kMaxPollSleep);
      // Wake at the deadline, not up to a poll interval after it.
      if (options_.run_timeout.count() > 0) nap = std::min(nap, run.staged_at + options_.run_timeout - now);
      std::this_thread::sleep_for(nap);
    }
  }
  // Observation only: it never makes a stream reusable.
  pool_->observe_complete(*run.lease).ignore();
}

// Final status, slot retirement, code release; in submission order.
void Worker::retire(Run& run) {
  Status final_status = run.status;
  RunOutcome outcome = RunOutcome::kFailed;
  hal::StreamId stream{};
  bool fresh = false;
  if (run.lease) {
    stream = static_cast<hal::StreamId>(run.lease->stream);
    fresh = run.lease->fresh_stream;
    // Drains whatever the run enqueued, also after a staging error, and yields the
    // stream's error if a command failed.
    Status synced = device_->stream_synchronize(stream);
    if (final_status.ok()) {
      final_status = synced;
    } else if (!synced.ok() && synced.message() != final_status.message()) {
      // Staging failed and so did work it had enqueued: both are told.
      final_status = Status(final_status.code(), final_status.message() + "; its stream failed too: " + synced.to_string());
    }
    // A staging error is kept in the message of a timeout or an abandonment.
    const std::string staging = run.status.ok() ? "" : "; staging had failed: " + run.status.to_string();
    if (run.abandoned.load(std::memory_order_acquire)) {
      final_status = aborted("abandoned by a reset of worker " + std::to_string(id_) + " (" + synced.to_string() +
                             ")" + staging);
      outcome = RunOutcome::kAbandoned;
    } else if (run.timed_out) {
      final_status = deadline_exceeded("did not finish within " + std::to_string(options_.run_timeout.count()) +
                                       " ms; its stream " + hal::to_string(stream) + " was aborted (" +
                                       synced.to_string() + ")" + staging);
      outcome = RunOutcome::kTimedOut;
    } else if (!final_status.ok()) {
      outcome = RunOutcome::kFailed;
    } else if (options_.stream_per_run) {
      outcome = RunOutcome::kAbandoned;  // given up on purpose: the next run gets a fresh one
    } else {
      outcome = RunOutcome::kComplete;
    }
    Status retired = pool_->release(*run.lease, outcome);
    if (!retired.ok() && final_status.ok()) {
      final_status = internal_error("retiring its slot lease: " + retired.to_string());
    }
  }
  std::string image = run.code.empty() ? std::string() : run.code.front().name();
  // The device is done with this run's stream: its code may be freed now.
  run.code.clear();
  if (!final_status.ok()) final_status = final_status.with_context(run_name(run.id, run.slot));
  run.status = final_status;

  if (trace::enabled() && run.t_submit_us > 0) {  // not when tracing began mid-run
    const std::string lane = slot_lane(id_, run.slot);
    const double end = trace::now_us();
    trace::complete(lane, "run " + std::to_string(run.id), "run", run.t_submit_us, end,
                    {{"image", image},
                     {"stream", stream},
                     {"fresh_stream", fresh},
                     {"epoch", run.epoch},
                     {"outcome", run_outcome_name(outcome)},
                     {"status", final_status.to_string()}});
    trace::complete(lane, "stage", "run", run.t_submit_us, run.t_staged_us,
                    {{"run", run.id}});
  }
}

Status Worker::check_lease(const SlotLease& lease) const {
  StatusOr<SlotState> state = pool_->slot_state(lease.slot);
  if (!state.ok()) return state.status();
  if (state->owned && state->generation == lease.generation && state->stream == lease.stream) {
    return ok_status();
  }
  stale_leases_rejected_.fetch_add(1, std::memory_order_relaxed);
  return failed_precondition("stale lease for stream slot " + std::to_string(lease.slot) +
                             ": lease generation " + std::to_string(lease.generation) +
                             ", slot generation " + std::to_string(state->generation) +
                             (state->owned ? "" : " (the slot is not owned by a run)"));
}

Status Worker::reset() {
  std::lock_guard submit_lock(submit_mu_);  // no run is staging
  if (!progress_.joinable()) return failed_precondition("reset: worker " + std::to_string(id_) + " is closed");
  {
    std::lock_guard lock(mu_);
    for (const std::unique_ptr<Run>& run : in_flight_) run->abandoned.store(true, std::memory_order_release);
    ++stats_.resets;
  }
  Status s = device_->reset();
  drain();  // every abandoned run retires now: its stream was aborted
  return s.with_context("reset of worker " + std::to_string(id_));
}

void Worker::drain() {
  std::unique_lock lock(mu_);
  const uint64_t target = submitted_;
  retired_cv_.wait(lock, [&] { return retired_ >= target; });
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  {
    std::lock_guard lock(mu_);
    s = stats_;
  }
  s.stale_leases_rejected = stale_leases_rejected_.load(std::memory_order_relaxed);
  s.prime_launches = pool_->prime_launches();
  s.streams = pool_->stats();
  s.code = registry_->stats();
  return s;
}

}  // namespace npurt::exec
