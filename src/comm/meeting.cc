#include "comm/meeting.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace npurt::comm {
namespace {
constexpr auto kSpinFor = std::chrono::microseconds(50);
}  // namespace

bool Meeting::all_at(uint64_t rounds) const {
  return std::all_of(arrived_.begin(), arrived_.end(), [&](uint64_t a) { return a >= rounds; });
}

std::string Meeting::missing(uint64_t rounds) const {
  std::string out;
  for (size_t r = 0; r < arrived_.size(); ++r) {
    if (arrived_[r] >= rounds) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

bool Meeting::arrived(int rank, uint64_t round) const {
  std::lock_guard<std::mutex> lock(mu_);
  return arrived_[rank] > round;
}

bool Meeting::help_missing(std::unique_lock<std::mutex>& lock, uint64_t round, const Help& help) {
  std::vector<int> missing;
  for (size_t r = 0; r < arrived_.size(); ++r) {
    if (arrived_[r] <= round) missing.push_back(static_cast<int>(r));
  }
  lock.unlock();
  bool ran = false;
  for (int r : missing) ran |= help(r, round);
  lock.lock();
  return ran;
}

Status Meeting::arrive(int rank, uint64_t round) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    arrived_[rank] = std::max(arrived_[rank], round + 1);
    if (!all_at(round + 1)) return ok_status();
  }
  cv_.notify_all();
  return ok_status();
}

Status Meeting::wait(int rank, uint64_t round, const std::string& what, const Help& help) {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (all_at(round + 1)) return ok_status();
  // One deadline for the whole wait: time spent running peers' parts counts.
  const Clock::time_point deadline = Clock::now() + timeout_;
  auto look_until = [&] { return std::min(Clock::now() + kSpinFor, deadline); };
  // Peers of a collective usually arrive within microseconds, and a sleeping thread
  // takes longer than that to wake: run their parts of the round here, up to their
  // arrivals, where their streams let us (`help` takes neither a peer's earlier work
  // nor its wait, either of which may block), and look again, yielding the core, for
  // a short while before sleeping.
  auto spin_until = look_until();
  while (failed_.ok() && !all_at(round + 1) && Clock::now() < spin_until) {
    if (help && help_missing(lock, round, help)) {
      spin_until = look_until();
      continue;
    }
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  const bool met = cv_.wait_until(lock, deadline, [&] { return !failed_.ok() || all_at(round + 1); });
  if (!failed_.ok()) return failed_;
  if (met) return ok_status();
  failed_ = deadline_exceeded(what + " on rank " + std::to_string(rank) + " of " + std::to_string(arrived_.size()) +
                              ": rank(s) " + missing(round + 1) + " did not arrive within " +
                              std::to_string(timeout_.count()) + " ms");
  lock.unlock();
  cv_.notify_all();
  return failed_;
}

void Meeting::fail(int rank, const Status& why, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return;
    failed_ = why.with_context(what + ": rank " + std::to_string(rank) + "'s stream failed before it");
  }
  cv_.notify_all();
}

void Meeting::abort(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return;
    failed_ = why.ok() ? failed_precondition("the group was aborted") : why;
  }
  cv_.notify_all();
}

Status Meeting::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

}  // namespace npurt::comm
