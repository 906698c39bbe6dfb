#include "hal/sim/host_pool.h"

namespace npurt::sim {

HostPool::HostPool(uint32_t workers) {
  threads_.reserve(workers);
  for (uint32_t i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

HostPool::~HostPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void HostPool::run_tasks(Job& job) {
  for (uint32_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
    (*job.fn)(i);
    job.done.fetch_add(1, std::memory_order_acq_rel);
  }
}

void HostPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little first: launches tend to come in bursts.
    if (!spin_until([&] { return job_epoch_.load(std::memory_order_acquire) != seen; }, 1000)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);  // before the predicate's first check of the epoch
      wake_.wait(lock, [&] { return stopping_ || job_epoch_.load() != seen; });
      sleepers_.fetch_sub(1);
      if (stopping_) return;
    }
    seen = job_epoch_.load(std::memory_order_acquire);
    active_.fetch_add(1);
    if (Job* job = job_.load()) run_tasks(*job);
    active_.fetch_sub(1);
  }
}

void HostPool::parallel_for(uint32_t n, const std::function<void(uint32_t)>& fn) {
  if (n == 0) return;
  std::unique_lock<std::mutex> own(owner_, std::try_to_lock);
  if (n == 1 || threads_.empty() || !own.owns_lock()) {
    for (uint32_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  job_.store(&job);
  // A spinning worker sees the new epoch by itself; only a sleeping one needs the
  // mutex and a notify (a launch's phases come microseconds apart, so workers seldom
  // sleep between them). Both sides' sequentially consistent operations make it
  // impossible for a worker to count itself asleep after this load and still miss
  // the new epoch.
  job_epoch_.fetch_add(1);
  if (sleepers_.load() != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    wake_.notify_all();
  }
  run_tasks(job);
  while (!spin_until([&] { return job.done.load(std::memory_order_acquire) == n; }, 256)) {
    std::this_thread::yield();
  }
  job_.store(nullptr);
  while (active_.load() != 0) std::this_thread::yield();
}

}  // namespace npurt::sim
