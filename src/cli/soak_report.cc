// `npurt soak`'s summary table and exit status.
#include <cstdio>

#include "cli/soak.h"

namespace npurt::cli {
namespace {

using ull = unsigned long long;

void row(std::FILE* out, const char* name, uint64_t value, const char* note = "") {
  std::fprintf(out, "  %-26s %12llu%s\n", name, static_cast<ull>(value), note);
}

void signed_row(std::FILE* out, const char* name, int64_t value) {
  std::fprintf(out, "  %-26s %12lld%s\n", name, static_cast<long long>(value), value != 0 ? "  LEAK" : "");
}

void site_table(std::FILE* out, const SoakReport& r) {
  std::fprintf(out, "\n  %-26s %12s %10s %10s %10s %11s\n", "faults by site", "injected", "surfaced", "retried",
               "abandoned", "unsurfaced");
  auto line = [out](const std::string& name, const SoakSiteFigures& f) {
    std::fprintf(out, "  %-26s %12llu %10llu %10llu %10llu %11llu\n", name.c_str(), static_cast<ull>(f.injected),
                 static_cast<ull>(f.surfaced), static_cast<ull>(f.retried), static_cast<ull>(f.abandoned),
                 static_cast<ull>(f.unsurfaced));
  };
  for (size_t s = 0; s < hal::kFaultSiteCount; ++s) {
    line(std::string(hal::fault_site_name(static_cast<hal::FaultSite>(s))), r.sites[s]);
  }
  line("all", {r.faults_injected, r.faults_surfaced, r.faults_retried, r.faults_abandoned, r.faults_unsurfaced});
  std::fprintf(out, "\n");
}

}  // namespace

void print_soak_report(const SoakOptions& o, const SoakReport& r, std::FILE* out) {
  std::fprintf(out, "\nsoak summary (seed %llu, fault rate %g)\n", static_cast<ull>(o.seed), o.fault_rate);
  row(out, "runs", r.runs, "  (sequence calls + worker runs)");
  row(out, "sequence calls", r.calls);
  row(out, "  succeeded", r.calls_ok);
  row(out, "  failed", r.calls_failed);
  row(out, "worker runs", r.worker_runs);
  row(out, "  succeeded", r.runs_ok);
  row(out, "  failed", r.runs_failed);
  row(out, "reads", r.reads);
  row(out, "  failed", r.reads_failed);
  row(out, "worker resets", r.resets);
  row(out, "errors naming no fault", r.errors_without_fault_id, "  (resets, timeouts, knock-on failures)");
  site_table(out, r);
  row(out, "wrong results", r.wrong_results);
  row(out, "unrecovered", r.unrecovered, "  (lost data, workloads failing with faults off)");
  row(out, "hangs", r.hangs, r.hangs_enabled ? "" : "  (hang faults off: no run timeout)");
  signed_row(out, "leaked bytes", r.leaked_bytes);
  signed_row(out, "leaked streams", r.leaked_streams);
  signed_row(out, "leaked events", r.leaked_events);
  signed_row(out, "leaked code images", r.leaked_images);
  std::fprintf(out, "  %-26s %12lld  (the memory context's fence pool, reused)\n", "pooled events",
               static_cast<long long>(r.pooled_events));
  std::fprintf(out, "  %-26s %12.1f s  (%.0f runs/s)\n\n", "wall time", r.wall_seconds,
               r.wall_seconds > 0 ? static_cast<double>(r.runs) / r.wall_seconds : 0.0);
  std::fprintf(out,
               "soak: %s (wrong %llu, hangs %llu, unsurfaced %llu, unrecovered %llu, leaked bytes %lld streams %lld "
               "events %lld images %lld)\n",
               r.passed() ? "PASS" : "FAIL", static_cast<ull>(r.wrong_results), static_cast<ull>(r.hangs),
               static_cast<ull>(r.faults_unsurfaced), static_cast<ull>(r.unrecovered),
               static_cast<long long>(r.leaked_bytes), static_cast<long long>(r.leaked_streams),
               static_cast<long long>(r.leaked_events), static_cast<long long>(r.leaked_images));
}

int run_soak_command(const SoakOptions& options) {
  StatusOr<SoakReport> report = run_soak(options, stdout);
  if (!report.ok()) {
    std::fprintf(stderr, "npurt soak: %s\n", report.status().to_string().c_str());
    return 2;
  }
  print_soak_report(options, *report, stdout);
  return report->passed() ? 0 : 1;
}

}  // namespace npurt::cli
