// The soak's checks can fail: each deliberate mistake (soak.h) must be caught by the
// check it defeats, and a soak without faults or mistakes passes.
#include "cli/soak.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace npurt::cli {
namespace {

SoakReport soak(SoakMistake mistake, double fault_rate, uint64_t runs = 200) {
  SoakOptions o;
  o.runs = runs;
  o.fault_rate = fault_rate;
  o.seed = 7;
  o.mistake = mistake;
  o.reset_rate = 0;  // resets fail runs without a fault: the tests count failures
  o.max_reported = 2;
  StatusOr<SoakReport> r = run_soak(o, stdout);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  print_soak_report(o, *r, stdout);
  return *r;
}

TEST(Soak, WithoutFaultsEverythingSucceedsAndNothingLeaks) {
  const SoakReport r = soak(SoakMistake::kNone, 0);
  EXPECT_TRUE(r.passed());
  EXPECT_EQ(r.runs, r.calls + r.worker_runs);
  EXPECT_GE(r.runs, 200u);
  EXPECT_EQ(r.calls_failed + r.runs_failed + r.reads_failed, 0u);
  EXPECT_EQ(r.faults_injected, 0u);
  EXPECT_EQ(r.leaked_bytes, 0);
  EXPECT_EQ(r.leaked_streams, 0);
  EXPECT_EQ(r.leaked_events, 0);
  EXPECT_EQ(r.leaked_images, 0);
}

TEST(Soak, NaiveCoherenceGivesWrongResults) {
  const SoakReport r = soak(SoakMistake::kNaiveCoherence, 0);
  EXPECT_GT(r.wrong_results, 0u);
  EXPECT_FALSE(r.passed());
}

TEST(Soak, ForgottenReadErrorsLeaveFaultsUnsurfaced) {
  // Read-backs fail often enough at this rate that some fault surfaces only in a read.
  const SoakReport r = soak(SoakMistake::kForgetErrors, 0.05, 400);
  EXPECT_GT(r.faults_injected, 0u);
  EXPECT_GT(r.sites[static_cast<size_t>(hal::FaultSite::kCopyToHost)].unsurfaced, 0u);
  EXPECT_FALSE(r.passed());
}

TEST(Soak, ABufferKeptPastTeardownIsALeak) {
  const SoakReport r = soak(SoakMistake::kLeakBuffer, 0, 20);
  EXPECT_EQ(r.leaked_bytes, 4096);
  EXPECT_FALSE(r.passed());
}

}  // namespace
}  // namespace npurt::cli
