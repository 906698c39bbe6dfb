// `npurt soak`: many sequence calls and pipelined Worker runs on one simulated NPU
// while it injects faults, checking that the runtime never returns a wrong result,
// never hangs, reports every injected fault in some error and leaks nothing.
// docs/faults.md, "The soak test", describes what it does and prints.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/faults.h"

namespace npurt::cli {

// Deliberate mistakes, for tests only: each must make the soak fail, which shows the
// check it defeats works.
enum class SoakMistake : uint8_t {
  kNone,
  kNaiveCoherence,  // the runtime's memory has Hazard::kNaiveCoherence: stale outputs
  kForgetErrors,    // the soak ignores the fault ids in read errors: unsurfaced faults
  kLeakBuffer,      // the soak keeps one device buffer past teardown: leaked bytes
};

struct SoakOptions {
  uint64_t runs = 1000;      // sequence calls plus Worker runs
  double fault_rate = 0.01;  // per device operation, every site but kernel hangs
  double hang_rate = -1;     // per launch during Worker runs; < 0: fault_rate / 10
  uint64_t seed = 1;
  uint32_t cores = 4;
  uint32_t depth = 2;            // Worker pipeline slots
  int64_t run_timeout_ms = 250;  // Worker run timeout; 0: none (then hangs wait for the watchdog)
  double reset_rate = 0.02;      // probability that the Worker is reset while a batch runs
  int64_t watchdog_ms = 20000;   // bound on every call, run and read
  uint32_t max_reported = 5;     // failures printed in full per kind
  SoakMistake mistake = SoakMistake::kNone;
};

// One failure of a check, printed in full.
struct SoakFinding {
  std::string kind;  // "WRONG RESULT", "UNSURFACED", "UNRECOVERED", ...
  std::string text;
};

struct SoakSiteFigures {
  // abandoned: named by no error, in a batch a Worker reset abandoned (the reset's
  // kAborted replaces the runs' own errors).
  uint64_t injected = 0, surfaced = 0, retried = 0, abandoned = 0, unsurfaced = 0;
};

struct SoakReport {
  uint64_t runs = 0;  // sequence calls + worker runs in the faulted loop
  uint64_t calls = 0, calls_ok = 0, calls_failed = 0;
  uint64_t worker_runs = 0, runs_ok = 0, runs_failed = 0;
  uint64_t reads = 0, reads_failed = 0;
  uint64_t errors_without_fault_id = 0;  // failures naming no injected fault (timeouts, knock-ons)
  std::array<SoakSiteFigures, hal::kFaultSiteCount> sites{};
  uint64_t faults_injected = 0, faults_surfaced = 0, faults_retried = 0, faults_abandoned = 0, faults_unsurfaced = 0;
  uint64_t resets = 0;  // Worker::reset calls with a batch in flight
  uint64_t wrong_results = 0;
  uint64_t unrecovered = 0;  // data or a workload that did not come back once faults stopped
  uint64_t hangs = 0;
  int64_t leaked_bytes = 0, leaked_streams = 0, leaked_events = 0, leaked_images = 0;
  int64_t pooled_events = 0;  // kept by the memory context for reuse: not a leak
  bool hangs_enabled = false;  // hang faults are injected (into Worker runs)
  double wall_seconds = 0;
  std::vector<SoakFinding> findings;  // the first few of each kind

  bool passed() const;
};

// Runs one soak; its progress and findings go to `log` as they happen. An error is a
// setup failure (the runtime, a compile); everything the soak checks is in the report.
// A hang does not return: the watchdog prints it and ends the process with kSoakHangExit.
StatusOr<SoakReport> run_soak(const SoakOptions& options, std::FILE* log);
inline constexpr int kSoakHangExit = 3;

// The summary table.
void print_soak_report(const SoakOptions& options, const SoakReport& report, std::FILE* out);

// `npurt soak`: runs, prints, and returns the exit status (0 only when it passed).
int run_soak_command(const SoakOptions& options);

}  // namespace npurt::cli
