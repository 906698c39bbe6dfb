// Cost of tracked mode: what the first write to a protected page costs under each
// write-tracking mechanism, what collecting and re-protecting dirty pages costs,
// and a plain write to a writable page as the baseline.
//
// Reported counters: ns_per_page (mean over the iterations of one run; run with
// --benchmark_repetitions to get medians), faults_per_page (should be 1 for the
// first-write benchmarks: proof that each write was really caught).

#include <benchmark/benchmark.h>

#include <chrono>
#include <optional>

#include "memory/page_mapping.h"
#include "npurt/memory/write_tracker.h"

namespace npurt {
namespace {

using Mechanism = WriteTrackingMechanism;
using Clock = std::chrono::steady_clock;

constexpr size_t kPages = 256;

// A mapping whose pages are populated up front, so that no zero-fill fault lands in
// a timing.
class Mapping : public testing::PageMapping {
 public:
  explicit Mapping(size_t pages) : PageMapping(pages) { touch_pages(1, 0); }

  // Writes `value` into each page with index i % stride == 0, through volatile so that
  // every store happens.
  void touch_pages(size_t stride, char value = 1) const {
    volatile char* bytes = data();
    for (size_t i = 0; i < length(); i += stride * page()) bytes[i] = value;
  }
};

// Creates an armed tracker over m, or marks the benchmark skipped and returns false.
bool start_tracking(benchmark::State& state, const Mapping& m, Mechanism mechanism,
                    std::optional<PageWriteTracker>* out) {
  auto tracker = PageWriteTracker::create(m.data(), m.length(), {mechanism});
  if (!tracker.ok()) {
    state.SkipWithError(tracker.status().to_string().c_str());
    return false;
  }
  if (Status s = tracker->arm(); !s.ok()) {
    state.SkipWithError(s.to_string().c_str());
    return false;
  }
  out->emplace(std::move(tracker).value());
  return true;
}

void report_per_page(benchmark::State& state, double total_seconds, size_t pages_per_iteration,
                     uint64_t faults) {
  const double pages =
      static_cast<double>(pages_per_iteration) * static_cast<double>(state.iterations());
  state.counters["ns_per_page"] = total_seconds * 1e9 / pages;
  state.counters["faults_per_page"] = static_cast<double>(faults) / pages;
  state.SetItemsProcessed(static_cast<int64_t>(pages));
}

// Ends the timed part of an iteration that began at t0: reports it as the
// iteration's manual time and adds it to *total.
void end_timed(benchmark::State& state, Clock::time_point t0, double* total) {
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  state.SetIterationTime(seconds);
  *total += seconds;
}

// Time to write one byte to each of kPages protected pages; the collect that
// re-protects them between iterations is not timed.
void BM_FirstWriteToProtectedPage(benchmark::State& state, Mechanism mechanism) {
  Mapping m(kPages);
  std::optional<PageWriteTracker> tracker;
  if (!start_tracking(state, m, mechanism, &tracker)) return;
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    m.touch_pages(1);
    end_timed(state, t0, &total);
    if (!tracker->take_dirty(0, m.length()).ok()) state.SkipWithError("take_dirty failed");
  }
  report_per_page(state, total, kPages, tracker->stats().faults_caught);
}

// Time for take_dirty() to collect and re-protect pages dirtied by one write each;
// the writes are not timed. Arg: stride between dirty pages (1: one contiguous run,
// 2: every other page, one run each).
void BM_CollectAndReprotect(benchmark::State& state, Mechanism mechanism) {
  const size_t stride = static_cast<size_t>(state.range(0));
  Mapping m(kPages);
  std::optional<PageWriteTracker> tracker;
  if (!start_tracking(state, m, mechanism, &tracker)) return;
  double total = 0;
  for (auto _ : state) {
    m.touch_pages(stride);
    const auto t0 = Clock::now();
    auto dirty = tracker->take_dirty(0, m.length());
    end_timed(state, t0, &total);
    if (!dirty.ok()) state.SkipWithError(dirty.status().to_string().c_str());
  }
  report_per_page(state, total, kPages / stride, tracker->stats().faults_caught);
  state.counters["syscalls_per_take"] = static_cast<double>(tracker->stats().protect_syscalls) /
                                        static_cast<double>(state.iterations());
}

// Baseline: the same writes to writable, populated, untracked pages.
void BM_PlainWrite(benchmark::State& state) {
  Mapping m(kPages);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    m.touch_pages(1);
    end_timed(state, t0, &total);
  }
  report_per_page(state, total, kPages, 0);
}

// Fixed iteration counts: with manual time, the untimed half of each iteration
// (re-protecting, or faulting the pages in again) would otherwise stretch a run to
// many times the timed budget.
constexpr int kIterations = 400;

BENCHMARK_CAPTURE(BM_FirstWriteToProtectedPage, uffd, Mechanism::kUserfaultfd)
    ->UseManualTime()
    ->Iterations(kIterations);
BENCHMARK_CAPTURE(BM_FirstWriteToProtectedPage, mprotect, Mechanism::kMprotect)
    ->UseManualTime()
    ->Iterations(kIterations);
BENCHMARK_CAPTURE(BM_CollectAndReprotect, uffd, Mechanism::kUserfaultfd)
    ->Arg(1)
    ->Arg(2)
    ->UseManualTime()
    ->Iterations(kIterations);
BENCHMARK_CAPTURE(BM_CollectAndReprotect, mprotect, Mechanism::kMprotect)
    ->Arg(1)
    ->Arg(2)
    ->UseManualTime()
    ->Iterations(kIterations);
BENCHMARK(BM_PlainWrite)->UseManualTime()->Iterations(100 * kIterations);

}  // namespace
}  // namespace npurt
