// Meeting: where the streams of a group's ranks wait for each other, round by round.
//
// Each rank's k-th exchange round ends, in that rank's stream order, with
// arrive(rank, k), which never blocks, and then wait(rank, k), which returns once
// every rank has arrived at round k. While peers are missing, the waiting thread may
// run their queued parts of the round up to their arrivals itself (`help`), so one
// thread can carry a round when the peers' stream threads are asleep; those parts
// never block, and the timeout counts the time spent on them. A rank whose stream failed before a round tells the
// others (fail), and a rank that never arrives makes the others fail after the
// timeout, so a broken peer never hangs a group. A failure is final: the ranks no
// longer agree on what was exchanged.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "npurt/base/status.h"

namespace npurt::comm {

class Meeting {
 public:
  Meeting(int ranks, std::chrono::milliseconds timeout) : arrived_(ranks, 0), timeout_(timeout) {}

  // Runs some of `rank`'s queued work of `round` before its arrival (nothing that may
  // block) on the calling thread; returns whether it ran any.
  using Help = std::function<bool(int rank, uint64_t round)>;

  // Marks `rank` arrived at `round`; fails when the group has failed.
  Status arrive(int rank, uint64_t round);
  // Returns once every rank has arrived at `round` (after `rank` did), or fails once
  // the timeout has passed since the call. `what` names the collective in errors
  // ("all_reduce #3"). While ranks are missing, `help` (when set) is offered each of
  // them, without the meeting's lock held.
  Status wait(int rank, uint64_t round, const std::string& what, const Help& help = {});
  // Whether `rank` has arrived at `round`.
  bool arrived(int rank, uint64_t round) const;
  void fail(int rank, const Status& why, const std::string& what);
  // Every waiting and later round fails with `why`.
  void abort(const Status& why);
  // OK, or the failure every later round reports.
  Status failure() const;

 private:
  bool all_at(uint64_t rounds) const;
  std::string missing(uint64_t rounds) const;
  // Offers `help` every rank missing at `round` (call with `lock` held; it is
  // released meanwhile); returns whether any work ran.
  bool help_missing(std::unique_lock<std::mutex>& lock, uint64_t round, const Help& help);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> arrived_;  // rounds each rank has arrived at, guarded by mu_
  Status failed_;                  // guarded by mu_
  const std::chrono::milliseconds timeout_;
};

}  // namespace npurt::comm
