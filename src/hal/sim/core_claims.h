// Which simulated cores a launch owns: a launch claims the cores it runs on, in core
// order, and gives them back when it ends; a launch waiting for a core that another
// (perhaps hung) launch holds can be woken by an abort.
//
// One mutex and one condition variable for all cores, rather than a lock per core:
// the race detector sees every claim and release as the mutex operations they are
// (timed lock acquisition is invisible to some ThreadSanitizer versions), and an abort
// wakes a waiter at once instead of on its next poll.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace npurt::sim {

class CoreClaims {
 public:
  explicit CoreClaims(uint32_t cores) : busy_(cores, 0) {}
  CoreClaims(const CoreClaims&) = delete;
  CoreClaims& operator=(const CoreClaims&) = delete;

  // Waits until `core` is free, then owns it; false (owning nothing new) once `abort`
  // is set. Whoever sets `abort` calls wake() afterwards.
  bool claim(uint32_t core, const std::atomic<bool>& abort) {
    std::unique_lock<std::mutex> lock(mu_);
    freed_.wait(lock, [&] { return !busy_[core] || abort.load(std::memory_order_acquire); });
    if (busy_[core]) return false;
    busy_[core] = 1;
    return true;
  }

  // Gives back cores 0 .. count - 1 (those a launch claimed, in order).
  void release(uint32_t count) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (uint32_t c = 0; c < count; ++c) busy_[c] = 0;
    }
    freed_.notify_all();
  }

  // Lets every waiter look at its abort flag again.
  void wake() {
    // Under the mutex, so a waiter between its check and its sleep still wakes.
    { std::lock_guard<std::mutex> lock(mu_); }
    freed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable freed_;
  std::vector<uint8_t> busy_;  // guarded by mu_
};

// Cores 0 .. count - 1 held by one launch, given back when it goes out of scope.
class CoreClaim {
 public:
  explicit CoreClaim(CoreClaims& claims) : claims_(claims) {}
  CoreClaim(const CoreClaim&) = delete;
  CoreClaim& operator=(const CoreClaim&) = delete;
  ~CoreClaim() {
    if (held_ > 0) claims_.release(held_);
  }

  // Claims the next core in order; false if aborted while waiting.
  bool claim_next(const std::atomic<bool>& abort) {
    if (!claims_.claim(held_, abort)) return false;
    ++held_;
    return true;
  }
  uint32_t held() const { return held_; }

 private:
  CoreClaims& claims_;
  uint32_t held_ = 0;
};

}  // namespace npurt::sim
