#include "comm/meeting.h"

#include <algorithm>
#include <chrono>
#include <thread>

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

Status Meeting::arrive(int rank, uint64_t round, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  arrived_[rank] = std::max(arrived_[rank], round + 1);
  if (all_at(round + 1)) {
    lock.unlock();
    cv_.notify_all();
    return ok_status();
  }
  // Peers of a collective usually arrive within microseconds, and a sleeping thread
  // takes longer than that to wake: look again, yielding the core, for a short while
  // before sleeping.
  const auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
  while (failed_.ok() && !all_at(round + 1) && std::chrono::steady_clock::now() < spin_until) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  const bool met = cv_.wait_for(lock, timeout_, [&] { return !failed_.ok() || all_at(round + 1); });
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
