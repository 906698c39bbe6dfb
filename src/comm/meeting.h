// Meeting: where the streams of a group's ranks wait for each other, round by round.
//
// Each rank's k-th exchange round ends with arrive(rank, k) on that rank's stream
// thread; it returns once every rank has arrived at round k. A rank whose stream
// failed before a round tells the others (fail), and a rank that never arrives makes
// the others fail after the timeout, so a broken peer never hangs a group. A failure
// is final: the ranks no longer agree on what was exchanged.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "npurt/base/status.h"

namespace npurt::comm {

class Meeting {
 public:
  Meeting(int ranks, std::chrono::milliseconds timeout) : arrived_(ranks, 0), timeout_(timeout) {}

  // `what` names the collective in errors ("all_reduce #3").
  Status arrive(int rank, uint64_t round, const std::string& what);
  void fail(int rank, const Status& why, const std::string& what);
  // Every waiting and later round fails with `why`.
  void abort(const Status& why);
  // OK, or the failure every later round reports.
  Status failure() const;

 private:
  bool all_at(uint64_t rounds) const;
  std::string missing(uint64_t rounds) const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> arrived_;  // rounds each rank has arrived at, guarded by mu_
  Status failed_;                  // guarded by mu_
  const std::chrono::milliseconds timeout_;
};

}  // namespace npurt::comm
