// The host threads that execute the simulator's logical cores.
//
// parallel_for(n, fn) runs fn(0..n-1) across the pool's threads and the calling
// thread, returning when all are done. Workers spin briefly before sleeping so that
// back-to-back launches do not pay a futex wake-up each. If another launch already
// owns the pool, the caller runs its tasks itself: two streams never deadlock on it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace npurt::sim {

class HostPool {
 public:
  explicit HostPool(uint32_t workers);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  void parallel_for(uint32_t n, const std::function<void(uint32_t)>& fn);
  uint32_t workers() const { return static_cast<uint32_t>(threads_.size()); }

 private:
  struct Job {
    const std::function<void(uint32_t)>* fn;
    uint32_t n;
    std::atomic<uint32_t> next{0};
    std::atomic<uint32_t> done{0};
  };
  void worker_loop();
  static void run_tasks(Job& job);

  std::vector<std::thread> threads_;
  std::mutex owner_;  // held by the launch that owns the pool

  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<uint64_t> job_epoch_{0};
  std::atomic<uint32_t> sleepers_{0};  // workers waiting on wake_ (counted under mu_)
  bool stopping_ = false;

  // The job lives on the owner's stack; `active_` counts workers that may still touch
  // it, and the owner waits for zero before returning.
  std::atomic<Job*> job_{nullptr};
  std::atomic<uint32_t> active_{0};
};

// Spin-wait helper: true once pred() holds; gives up after `spins` iterations.
// Every 64 spins it yields the CPU: on a machine with fewer hardware threads than
// runnable threads, pure spinning would starve the very thread being waited for.
template <typename Pred>
bool spin_until(Pred pred, int spins) {
  for (int i = 0; i < spins; ++i) {
    if (pred()) return true;
    if ((i & 63) == 63) {
      std::this_thread::yield();
    } else {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  }
  return pred();
}

}  // namespace npurt::sim
