// `npurt soak`: the loop, its checks and the final leak count (soak.h).
#include "cli/soak.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "cli/soak_workloads.h"
#include "npurt/base/hazards.h"
#include "npurt/base/math.h"
#include "npurt/isa/numeric.h"

namespace npurt::cli {
namespace {

using Clock = std::chrono::steady_clock;
using soak::Bytes;
using soak::HostBuffers;
using soak::SequenceWorkload;

constexpr double kTolerance = 1e-3;           // rel-L2, f32 kernels against f32/double references
constexpr uint32_t kPoisonWord = 0x7fa5a5a5;  // a NaN that neither kernels nor faults write
constexpr int kReadAttempts = 32;             // reads of a good output while faults still hit
constexpr uint64_t kWeightCheckEvery = 64;    // iterations between checks of the shared weights
constexpr size_t kErrorsKeptPerIteration = 8;  // shown with a fault no error named
constexpr int kCleanAttempts = 2;              // of the clean pass's workloads

// Bounds every call, run and read. A blocked soak cannot report, so on expiry the
// watchdog prints what hung and ends the process. It polls rather than being woken
// per operation: arming costs one uncontended lock.
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds bound, std::FILE* log) : bound_(bound), log_(log), thread_([this] { loop(); }) {}
  // What to print about a hang besides its name (called on the watchdog's thread).
  void on_expiry(std::function<void()> explain) {
    std::lock_guard<std::mutex> lock(mu_);
    explain_ = std::move(explain);
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  template <typename F>
  auto guard(const std::string& what, F&& f) {
    arm(what);
    auto result = f();
    disarm();
    return result;
  }

 private:
  void arm(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = what;
    deadline_ = Clock::now() + bound_;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    deadline_.reset();
  }
  void loop() {
    const auto poll = std::min<std::chrono::milliseconds>(bound_ / 4 + std::chrono::milliseconds(1),
                                                          std::chrono::milliseconds(100));
    for (;;) {
      std::this_thread::sleep_for(poll);
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      if (deadline_ && Clock::now() > *deadline_) expire();
    }
  }
  [[noreturn]] void expire() {
    std::fprintf(log_, "HANG: %s did not return within %lld ms\n", what_.c_str(), static_cast<long long>(bound_.count()));
    if (explain_) explain_();
    std::fprintf(log_, "soak: FAIL (hangs 1)\n");
    std::fflush(log_);
    std::fflush(stdout);
    std::_Exit(kSoakHangExit);
  }

  const std::chrono::milliseconds bound_;
  std::FILE* const log_;
  std::mutex mu_;
  std::string what_;                       // guarded by mu_
  std::function<void()> explain_;          // guarded by mu_
  std::optional<Clock::time_point> deadline_;  // guarded by mu_
  bool stop_ = false;                      // guarded by mu_
  std::thread thread_;
};

// The ids of every "injected fault #N" in `message`.
std::vector<uint64_t> fault_ids(std::string_view message) {
  constexpr std::string_view kTag = "injected fault #";
  std::vector<uint64_t> ids;
  for (size_t at = message.find(kTag); at != std::string_view::npos; at = message.find(kTag, at + 1)) {
    size_t p = at + kTag.size();
    uint64_t id = 0;
    const size_t digits_begin = p;
    for (; p < message.size() && message[p] >= '0' && message[p] <= '9'; ++p) id = id * 10 + (message[p] - '0');
    if (p > digits_begin) ids.push_back(id);
  }
  return ids;
}

// splitmix64: a fresh, well-spread fault seed per plan.
uint64_t mix(uint64_t seed, uint64_t n) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (n + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Bytes poison(uint64_t bytes) {
  Bytes b(bytes);
  for (size_t i = 0; i + 4 <= b.size(); i += 4) std::memcpy(&b[i], &kPoisonWord, 4);
  return b;
}

// rel-L2 of two f32 byte strings; not a number (garbage) counts as infinitely wrong.
double rel_error(const Bytes& got, const Bytes& want) {
  if (got.size() != want.size()) return INFINITY;
  const double e = rel_l2(isa::to_f32(got, isa::DType::kF32), isa::to_f32(want, isa::DType::kF32));
  return std::isfinite(e) ? e : INFINITY;
}

// The Worker's run timeout, where the Worker has one (it ends hung runs).
template <typename Options>
bool set_run_timeout(Options& options, int64_t ms) {
  if constexpr (requires { options.run_timeout = std::chrono::milliseconds(ms); }) {
    options.run_timeout = std::chrono::milliseconds(ms);
    return ms > 0;
  } else {
    return false;
  }
}

// The faults injected since the soak last took the log: those of the iteration that hung.
void print_recent_faults(hal::Device& device, std::FILE* log) {
  StatusOr<std::vector<hal::InjectedFault>> faults = device.take_fault_log();
  if (!faults.ok()) return;
  std::fprintf(log, "  faults injected in its iteration:%s\n", faults->empty() ? " none" : "");
  for (const hal::InjectedFault& f : *faults) {
    std::fprintf(log, "    fault #%llu (%s): %s\n", static_cast<unsigned long long>(f.id),
                 std::string(hal::fault_site_name(f.site)).c_str(), f.what.c_str());
  }
  // A hung launch enters the log only when it ends, so count the hangs drawn instead.
  if (StatusOr<hal::FaultStats> stats = device.fault_stats(); stats.ok()) {
    std::fprintf(log, "  kernel hangs injected under the current plan: %llu\n",
                 static_cast<unsigned long long>(stats->injected[static_cast<size_t>(hal::FaultSite::kKernelHang)]));
  }
}

const char* mistake_name(SoakMistake m) {
  switch (m) {
    case SoakMistake::kNone: return "none";
    case SoakMistake::kNaiveCoherence: return "naive coherence";
    case SoakMistake::kForgetErrors: return "forget read errors";
    case SoakMistake::kLeakBuffer: return "leak a buffer";
  }
  return "?";
}

struct LoggedFault {
  hal::InjectedFault fault;
  uint64_t iteration = 0;
  std::string activity;  // what the soak was doing when it was injected
  bool reset = false;    // the Worker was reset in that iteration
  std::shared_ptr<const std::vector<std::string>> errors;  // the errors seen in that iteration
};

// One run of a Worker batch.
struct BatchRun {
  std::string what;
  Buffer x, h, y;
  Bytes x_host;
  exec::RunHandle handle;
};

class Soak {
 public:
  Soak(const SoakOptions& options, std::FILE* log)
      : o_(options), log_(log), watchdog_(std::chrono::milliseconds(options.watchdog_ms), log), rng_(options.seed) {}

  StatusOr<SoakReport> run() {
    const auto start = Clock::now();
    NPURT_RETURN_IF_ERROR(setup());
    loop();
    clean_pass();
    teardown();
    account_faults();
    r_.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r_;
  }

 private:
  // ---- setup ----
  Status setup() {
    std::optional<ScopedHazard> naive;  // read when the runtime's memory context is made
    if (o_.mistake == SoakMistake::kNaiveCoherence) naive.emplace(Hazard::kNaiveCoherence);
    NPURT_ASSIGN_OR_RETURN(runtime_, Runtime::create("sim", {.cores = o_.cores, .memory_bytes = 256ull << 20}));
    watchdog_.on_expiry([device = runtime_->shared_device(), log = log_] { print_recent_faults(*device, log); });
    NPURT_RETURN_IF_ERROR(warm_up_transfers());
    baseline_ = runtime_->device().counters();
    baseline_images_ = runtime_->registry().stats().live_images;
    baseline_pooled_events_ = static_cast<int64_t>(runtime_->memory().stats().events_live);
    NPURT_ASSIGN_OR_RETURN(weights_, soak::SharedWeights::make(runtime_->memory(), rng_));
    NPURT_ASSIGN_OR_RETURN(sequences_, soak::make_sequences(*runtime_, weights_));
    NPURT_ASSIGN_OR_RETURN(soak::RunKernels kernels, soak::RunKernels::make(*runtime_));
    kernels_.emplace(std::move(kernels));
    exec::WorkerOptions worker{.depth = o_.depth};
    r_.hangs_enabled = set_run_timeout(worker, o_.run_timeout_ms) || o_.hang_rate > 0;
    hang_rate_ = o_.hang_rate >= 0 ? o_.hang_rate : (r_.hangs_enabled ? o_.fault_rate / 10 : 0);
    NPURT_ASSIGN_OR_RETURN(worker_, runtime_->make_worker(worker));
    if (o_.mistake == SoakMistake::kLeakBuffer) {
      NPURT_ASSIGN_OR_RETURN(kept_past_teardown_, runtime_->memory().create_buffer(4096));
    }
    return ok_status();
  }

  // The memory context creates its transfer stream on first use: create it before the
  // baseline, so that only what the soak leaves behind counts.
  Status warm_up_transfers() {
    NPURT_ASSIGN_OR_RETURN(Buffer b, runtime_->memory().create_buffer(256));
    {
      NPURT_ASSIGN_OR_RETURN(WriteGuard g, runtime_->memory().overwrite(b.view()));
      std::fill(g.bytes().begin(), g.bytes().end(), uint8_t{0});
    }
    NPURT_RETURN_IF_ERROR(runtime_->memory().to_device(b.view()));
    NPURT_RETURN_IF_ERROR(b.free());
    return runtime_->memory().synchronize();
  }

  // ---- the faulted loop ----
  void loop() {
    std::fprintf(log_,
                 "soak: %llu runs, seed %llu, fault rate %g, hang rate %g, reset rate %g, depth %u, run timeout %lld "
                 "ms%s%s\n",
                 static_cast<unsigned long long>(o_.runs), static_cast<unsigned long long>(o_.seed), o_.fault_rate,
                 hang_rate_, o_.reset_rate, o_.depth, static_cast<long long>(o_.run_timeout_ms),
                 r_.hangs_enabled ? "" : " (no hang faults: the Worker has no run timeout)",
                 o_.mistake == SoakMistake::kNone ? "" : (std::string(", MISTAKE: ") + mistake_name(o_.mistake)).c_str());
    uint64_t next_progress = o_.runs / 10;
    while (r_.runs < o_.runs) {
      iteration();
      if (o_.runs >= 1000 && r_.runs >= next_progress) {
        std::fprintf(log_, "soak: %llu runs, %llu faults injected, %llu wrong\n",
                     static_cast<unsigned long long>(r_.runs), static_cast<unsigned long long>(logged_.size()),
                     static_cast<unsigned long long>(r_.wrong_results));
        next_progress += o_.runs / 10;
      }
    }
  }

  // A sequence call (four times in five) or a batch of Worker runs: about as many of each.
  void iteration() {
    ++iteration_;
    in_iteration_ = true;
    if (rng_() % 5 != 0) {
      SequenceWorkload& w = sequences_[rng_() % sequences_.size()];
      activity_ = "sequence '" + w.name + "'";
      set_plan(false);
      call_sequence(w);
    } else {
      activity_ = "worker batch";
      set_plan(r_.hangs_enabled);
      run_worker_batch(2 * o_.depth);
    }
    if (iteration_ % kWeightCheckEvery == 0) check_weights();
    in_iteration_ = false;
    collect_fault_log();
  }

  // ---- sequence calls ----
  void call_sequence(SequenceWorkload& w) {
    count(r_.runs);
    count(r_.calls);
    const std::string what = "sequence '" + w.name + "' call " + std::to_string(r_.calls);
    StatusOr<HostBuffers> inputs = write_inputs(w);
    if (!inputs.ok()) return failed_call(w, what, inputs.status());
    StatusOr<Bytes> want = soak::sequence_reference(w, weights_, *inputs);
    if (!want.ok()) return add_finding("SOAK ERROR", what + ": reference: " + want.status().to_string());
    StatusOr<View> out = w.compiled->get_buffer(w.output);
    if (!out.ok()) return add_finding("SOAK ERROR", what + ": " + out.status().to_string());
    Status st = watchdog_.guard(what, [&] { return w.compiled->call(); });
    if (!st.ok()) {
      failed_call(w, what, st);
      // Outputs of a failed call either raise or hold the poison or the right bytes.
      if (StatusOr<Bytes> got = read_once(*out, what + " output after failure"); got.ok()) {
        check_output(what + " output, read after the call failed with " + st.to_string() + ",", *got, *want, true);
      }
      return;
    }
    count(r_.calls_ok);
    w.awaiting_recovery = false;
    if (std::optional<Bytes> got = read_good_output(*out, what + " output")) check_output(what, *got, *want, false);
  }

  // Fresh inputs through declared writes; the output is poisoned so that a result the
  // call did not write shows.
  StatusOr<HostBuffers> write_inputs(const SequenceWorkload& w) {
    HostBuffers inputs;
    for (const auto& [name, elements] : w.inputs) {
      inputs[name] = soak::random_values(rng_, isa::DType::kF32, elements);
      NPURT_RETURN_IF_ERROR(write_view(w.compiled->get_buffer(name), inputs[name]));
    }
    NPURT_RETURN_IF_ERROR(write_view(w.compiled->get_buffer(w.output), poison(w.output_elements * sizeof(float))));
    return inputs;
  }

  Status write_view(StatusOr<View> view, const Bytes& bytes) {
    NPURT_RETURN_IF_ERROR(view.status());
    StatusOr<WriteGuard> guard = watchdog_.guard("write of '" + view->buffer_name() + "'",
                                                 [&] { return runtime_->memory().overwrite(*view); });
    NPURT_RETURN_IF_ERROR(guard.status());
    std::memcpy(guard->bytes().data(), bytes.data(), std::min<size_t>(bytes.size(), guard->bytes().size()));
    return ok_status();
  }

  void failed_call(SequenceWorkload& w, const std::string& what, const Status& st) {
    count(r_.calls_failed);
    note_error(what, st, false);
    w.awaiting_recovery = true;
    if (clean_) clean_failure(what + " failed with faults off: " + st.to_string());
  }

  // ---- Worker runs ----
  void run_worker_batch(uint32_t runs) {
    std::vector<BatchRun> batch(runs);
    for (BatchRun& run : batch) submit_run(run);
    if (!clean_ && std::uniform_real_distribution<double>(0, 1)(rng_) < o_.reset_rate) reset_worker();
    for (BatchRun& run : batch) {
      if (run.handle.valid()) finish_run(run);
    }
  }

  // With the batch in flight: its runs fail with kAborted (or completed before), and
  // later runs must succeed.
  void reset_worker() {
    ++r_.resets;
    reset_in_iteration_ = true;
    Status st = watchdog_.guard("worker reset", [&] { return worker_->reset(); });
    if (!st.ok()) note_error("worker reset", st, false);
  }

  // Private buffers for the run (allocations may fail too), fresh x, a poisoned y.
  void submit_run(BatchRun& run) {
    count(r_.runs);
    count(r_.worker_runs);
    run.what = "worker run " + std::to_string(r_.worker_runs);
    Status st = make_run_buffers(run);
    if (!st.ok()) return failed_run(run, st);
    View x = run.x.view(), h = run.h.view(), y = run.y.view();
    auto launch = [this, x, h, y](exec::RunContext& ctx) {
      return kernels_->launch(runtime_->memory(), ctx, weights_, x, h, y);
    };
    run.handle = watchdog_.guard(run.what + " submit", [&] { return worker_->submit(launch, kernels_->code()); });
  }

  Status make_run_buffers(BatchRun& run) {
    MemoryContext& memory = runtime_->memory();
    const uint64_t in_bytes = kernels_->input_elements() * sizeof(float);
    const uint64_t out_bytes = kernels_->output_elements() * sizeof(float);
    NPURT_ASSIGN_OR_RETURN(run.x, memory.create_buffer(in_bytes, {.name = run.what + " x"}));
    NPURT_ASSIGN_OR_RETURN(run.h, memory.create_buffer(out_bytes, {.name = run.what + " h"}));
    NPURT_ASSIGN_OR_RETURN(run.y, memory.create_buffer(out_bytes, {.name = run.what + " y"}));
    run.x_host = soak::random_values(rng_, isa::DType::kF32, kernels_->input_elements());
    NPURT_RETURN_IF_ERROR(write_view(run.x.view(), run.x_host));
    return write_view(run.y.view(), poison(out_bytes));
  }

  void finish_run(BatchRun& run) {
    Status st = watchdog_.guard(run.what, [&] { return run.handle.wait(); });
    StatusOr<Bytes> want = kernels_->reference(weights_, run.x_host);
    if (!want.ok()) return add_finding("SOAK ERROR", run.what + ": reference: " + want.status().to_string());
    if (!st.ok()) {
      failed_run(run, st);
      if (StatusOr<Bytes> got = read_once(run.y.view(), run.what + " output after failure"); got.ok()) {
        check_output(run.what + " output, read after the run failed with " + st.to_string() + ",", *got, *want, true);
      }
      return;
    }
    count(r_.runs_ok);
    if (std::optional<Bytes> got = read_good_output(run.y.view(), run.what + " output")) {
      check_output(run.what, *got, *want, false);
    }
  }

  void failed_run(const BatchRun& run, const Status& st) {
    count(r_.runs_failed);
    note_error(run.what, st, false);
    if (clean_) clean_failure(run.what + " failed with faults off: " + st.to_string());
  }

  void clean_failure(const std::string& text) {
    ++clean_failures_;
    if (last_clean_attempt_) unrecovered(text);
  }

  // ---- reads and comparisons ----
  StatusOr<Bytes> read_once(const View& view, const std::string& what) {
    count(r_.reads);
    StatusOr<ReadGuard> guard = watchdog_.guard(what, [&] { return runtime_->memory().read(view); });
    if (!guard.ok()) {
      count(r_.reads_failed);
      note_error(what, guard.status(), true);
      return guard.status();
    }
    return Bytes(guard->bytes().begin(), guard->bytes().end());
  }

  // A good output must come back: read again while faults hit its read-back, then
  // once more with faults off. Never readable means its bytes were lost.
  std::optional<Bytes> read_good_output(const View& view, const std::string& what) {
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
      if (StatusOr<Bytes> got = read_once(view, what); got.ok()) return *got;
    }
    clear_plan();
    StatusOr<Bytes> got = read_once(view, what + " (faults off)");
    if (got.ok()) return *got;
    unrecovered(what + ": unreadable after " + std::to_string(kReadAttempts) + " reads and with faults off: " +
                got.status().to_string());
    return std::nullopt;
  }

  // A result that came back is right; after a failure it may also be the poison the
  // host wrote (nothing overwrote it), never anything else.
  void check_output(const std::string& what, const Bytes& got, const Bytes& want, bool after_failure) {
    const double e = rel_error(got, want);
    if (e <= kTolerance) return;
    if (after_failure && got == poison(got.size())) return;
    ++r_.wrong_results;
    float first_got = 0, first_want = 0;
    std::memcpy(&first_got, got.data(), std::min<size_t>(4, got.size()));
    std::memcpy(&first_want, want.data(), std::min<size_t>(4, want.size()));
    add_finding("WRONG RESULT", what + " returned a result with rel-L2 error " + std::to_string(e) +
                                    " (element 0: " + std::to_string(first_got) + ", expected " +
                                    std::to_string(first_want) + ")");
  }

  // The shared weights' host bytes never change; their device bytes are checked by
  // every result that uses them.
  void check_weights() {
    for (soak::SharedWeight& w : weights_.all()) {
      StatusOr<Bytes> got = read_once(w.buffer.view(), "read of shared weight '" + w.name + "'");
      if (got.ok() && *got != w.host) {
        ++r_.wrong_results;
        add_finding("WRONG RESULT", "shared weight '" + w.name + "' reads back changed");
      }
    }
  }

  // ---- faults ----
  // A plan per iteration, each with its own seed: a plan restarts the per-site
  // operation counts, so one seed for all would fail the same operations every time.
  void set_plan(bool hangs) {
    hal::FaultPlan plan;
    plan.seed = mix(o_.seed, ++plan_serial_);
    for (size_t s = 0; s < hal::kFaultSiteCount; ++s) plan.rate[s] = o_.fault_rate;
    plan.rate[static_cast<size_t>(hal::FaultSite::kKernelHang)] = hangs ? hang_rate_ : 0;
    expect_ok(runtime_->device().set_fault_plan(plan));
  }
  void clear_plan() { expect_ok(runtime_->device().set_fault_plan(hal::FaultPlan{})); }

  // Takes the device's fault log, then prints the iteration's findings with the
  // faults injected during it: the likely causes.
  void collect_fault_log() {
    StatusOr<std::vector<hal::InjectedFault>> log = runtime_->device().take_fault_log();
    if (!log.ok()) return emit_finding({"SOAK ERROR", "take_sim_fault_log: " + log.status().to_string()});
    std::string causes;
    auto errors = std::make_shared<const std::vector<std::string>>(std::move(iteration_errors_));
    iteration_errors_.clear();
    for (hal::InjectedFault& f : *log) {
      causes += "\n    fault #" + std::to_string(f.id) + " (" + std::string(hal::fault_site_name(f.site)) + "): " + f.what;
      logged_.push_back({std::move(f), iteration_, activity_, reset_in_iteration_, errors});
    }
    for (SoakFinding& f : pending_findings_) {
      f.text += " [iteration " + std::to_string(iteration_) + "; faults injected in it:" + (causes.empty() ? " none" : causes) + "]";
      emit_finding(std::move(f));
    }
    pending_findings_.clear();
    reset_in_iteration_ = false;
  }

  void note_error(const std::string& where, const Status& st, bool is_read) {
    const std::vector<uint64_t> ids = fault_ids(st.message());
    if (ids.empty()) count(r_.errors_without_fault_id);
    if (iteration_errors_.size() < kErrorsKeptPerIteration) iteration_errors_.push_back(where + ": " + st.to_string());
    if (is_read && o_.mistake == SoakMistake::kForgetErrors) return;
    surfaced_.insert(ids.begin(), ids.end());
    if (o_.max_reported > 0 && first_errors_printed_ < o_.max_reported) {
      ++first_errors_printed_;
      std::fprintf(log_, "soak: error (expected under faults): %s: %s\n", where.c_str(), st.to_string().c_str());
    }
  }

  // Every injected fault must be named by some error; a failed destroy_stream is
  // retried by the runtime instead (the stream count at the end shows it was).
  void account_faults() {
    for (const LoggedFault& l : logged_) {
      SoakSiteFigures& site = r_.sites[static_cast<size_t>(l.fault.site)];
      ++site.injected;
      if (surfaced_.count(l.fault.id) != 0) {
        ++site.surfaced;
      } else if (l.fault.site == hal::FaultSite::kDestroyStream) {
        ++site.retried;
      } else if (l.reset) {
        ++site.abandoned;
      } else {
        ++site.unsurfaced;
        add_finding("UNSURFACED", unsurfaced_text(l));
      }
    }
    for (const SoakSiteFigures& s : r_.sites) {
      r_.faults_injected += s.injected;
      r_.faults_surfaced += s.surfaced;
      r_.faults_retried += s.retried;
      r_.faults_abandoned += s.abandoned;
      r_.faults_unsurfaced += s.unsurfaced;
    }
  }

  static std::string unsurfaced_text(const LoggedFault& l) {
    std::string text = "fault #" + std::to_string(l.fault.id) + " (" + std::string(hal::fault_site_name(l.fault.site)) +
                       ": " + l.fault.what + "), injected in iteration " + std::to_string(l.iteration) + " (" +
                       l.activity + "), named by no error; errors seen in that iteration:";
    if (l.errors->empty()) text += " none";
    for (const std::string& e : *l.errors) text += "\n    " + e;
    return text;
  }

  // ---- the end ----
  // With faults off, every workload must work again on fresh inputs. A second
  // attempt forgives a healthy run that a loaded machine made miss its run timeout.
  void clean_pass() {
    clear_plan();
    clean_ = true;
    ++iteration_;
    in_iteration_ = true;
    activity_ = "clean pass";
    for (int attempt = 1; attempt <= kCleanAttempts; ++attempt) {
      last_clean_attempt_ = attempt == kCleanAttempts;
      clean_failures_ = 0;
      for (SequenceWorkload& w : sequences_) call_sequence(w);
      run_worker_batch(2 * o_.depth);
      if (clean_failures_ == 0) break;
    }
    check_weights();
    in_iteration_ = false;
    collect_fault_log();
  }

  void teardown() {
    clear_plan();
    worker_->drain();
    worker_->close();
    worker_.reset();
    sequences_.clear();
    kernels_.reset();
    weights_.release();
    // The first failure of earlier work may come back here; it was seen before.
    runtime_->memory().synchronize().ignore();
    collect_fault_log();
    count_leaks();
  }

  void count_leaks() {
    const hal::Counters now = runtime_->device().counters();
    auto live = [](uint64_t made, uint64_t gone) { return static_cast<int64_t>(made - gone); };
    r_.leaked_bytes = live(now.allocated_bytes, now.freed_bytes) - live(baseline_.allocated_bytes, baseline_.freed_bytes);
    r_.leaked_streams =
        live(now.streams_created, now.streams_destroyed) - live(baseline_.streams_created, baseline_.streams_destroyed);
    // The memory context keeps completed fences' events for reuse (bounded by the
    // fences once in flight): those are owned, not leaked.
    r_.pooled_events = static_cast<int64_t>(runtime_->memory().stats().events_live) - baseline_pooled_events_;
    r_.leaked_events = live(now.events_created, now.events_destroyed) -
                       live(baseline_.events_created, baseline_.events_destroyed) - r_.pooled_events;
    r_.leaked_images = static_cast<int64_t>(runtime_->registry().stats().live_images) -
                       static_cast<int64_t>(baseline_images_);
  }

  // ---- bookkeeping ----
  // The clean pass checks but does not count: the figures are the faulted loop's.
  void count(uint64_t& counter) {
    if (!clean_) ++counter;
  }

  void unrecovered(const std::string& text) {
    ++r_.unrecovered;
    add_finding("UNRECOVERED", text);
  }

  // Findings of an iteration wait for its fault log (collect_fault_log).
  void add_finding(const std::string& kind, const std::string& text) {
    if (++findings_per_kind_[kind] > o_.max_reported) return;
    if (!in_iteration_) return emit_finding({kind, text});
    pending_findings_.push_back({kind, text});
  }
  void emit_finding(SoakFinding f) {
    std::fprintf(log_, "%s: %s\n", f.kind.c_str(), f.text.c_str());
    r_.findings.push_back(std::move(f));
  }

  void expect_ok(const Status& st) {
    if (!st.ok()) add_finding("SOAK ERROR", st.to_string());
  }

  const SoakOptions o_;
  std::FILE* const log_;
  SoakReport r_;
  Watchdog watchdog_;
  std::mt19937_64 rng_;
  double hang_rate_ = 0;
  std::shared_ptr<Runtime> runtime_;
  hal::Counters baseline_;
  uint64_t baseline_images_ = 0;
  int64_t baseline_pooled_events_ = 0;
  soak::SharedWeights weights_;
  std::vector<SequenceWorkload> sequences_;
  std::optional<soak::RunKernels> kernels_;
  std::shared_ptr<exec::Worker> worker_;
  Buffer kept_past_teardown_;  // SoakMistake::kLeakBuffer
  uint64_t iteration_ = 0, plan_serial_ = 0;
  std::string activity_;
  bool clean_ = false;
  bool in_iteration_ = false;
  bool last_clean_attempt_ = false;
  uint64_t clean_failures_ = 0;
  bool reset_in_iteration_ = false;
  std::vector<SoakFinding> pending_findings_;
  std::vector<std::string> iteration_errors_;
  std::vector<LoggedFault> logged_;
  std::set<uint64_t> surfaced_;
  std::map<std::string, uint64_t> findings_per_kind_;
  uint32_t first_errors_printed_ = 0;
};

}  // namespace

bool SoakReport::passed() const {
  return wrong_results == 0 && hangs == 0 && unrecovered == 0 && faults_unsurfaced == 0 && leaked_bytes == 0 &&
         leaked_streams == 0 && leaked_events == 0 && leaked_images == 0;
}

StatusOr<SoakReport> run_soak(const SoakOptions& options, std::FILE* log) {
  if (options.runs == 0) return invalid_argument("soak: --runs must be at least 1");
  if (!(options.fault_rate >= 0 && options.fault_rate <= 1)) return invalid_argument("soak: --fault-rate must be in [0, 1]");
  if (options.hang_rate > 1) return invalid_argument("soak: --hang-rate must be at most 1");
  if (!(options.reset_rate >= 0 && options.reset_rate <= 1)) return invalid_argument("soak: --reset-rate must be in [0, 1]");
  if (options.watchdog_ms <= 0) return invalid_argument("soak: --watchdog-ms must be positive");
  Soak soak(options, log);
  return soak.run();
}

}  // namespace npurt::cli
