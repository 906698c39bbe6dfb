// Physical limits and library peers the operator benchmarks are reported against,
// each measured in the same process: a STREAM-style read of DRAM with every core,
// and OpenBLAS single-precision GEMV/GEMM on the same shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

namespace npurt::bench {

// Seconds for all hardware threads to read `bytes` of a buffer far larger than the
// caches once (each thread sums its own contiguous share).
class StreamRead {
 public:
  explicit StreamRead(size_t bytes = size_t{512} << 20) : words_(bytes / 8, 1) {}
  size_t bytes() const { return words_.size() * 8; }
  uint64_t run() const {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    std::vector<uint64_t> sums(n, 0);
    std::vector<std::thread> threads;
    const size_t per = words_.size() / n;
    for (unsigned t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        const uint64_t* p = words_.data() + t * per;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= per; i += 4) {
          s0 += p[i];
          s1 += p[i + 1];
          s2 += p[i + 2];
          s3 += p[i + 3];
        }
        sums[t] = s0 + s1 + s2 + s3;
      });
    }
    uint64_t total = 0;
    for (unsigned t = 0; t < n; ++t) {
      threads[t].join();
      total += sums[t];
    }
    return total;
  }

 private:
  std::vector<uint64_t> words_;
};

}  // namespace npurt::bench
