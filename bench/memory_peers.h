// Physical limits and library peers the operator benchmarks are reported against,
// each measured in the same process: a STREAM-style read of DRAM with every core,
// and OpenBLAS single-precision GEMV/GEMM on the same shapes.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace npurt::bench {

// A STREAM-style read of a buffer far larger than the caches with every hardware
// thread: each thread sums its own contiguous share as four interleaved streams (one
// sequential stream per core leaves DRAM bandwidth unused on this class of machine:
// measured 17 GB/s with one stream per thread against 28 GB/s with four).
class StreamRead {
 public:
  explicit StreamRead(size_t bytes = size_t{512} << 20) : words_(bytes / 8, 1) {}
  size_t bytes() const { return words_.size() * 8; }
  uint64_t run() const {
    constexpr size_t kStreams = 4;
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    std::vector<uint64_t> sums(n, 0);
    std::vector<std::thread> threads;
    const size_t per = words_.size() / n, segment = per / kStreams;
    for (unsigned t = 0; t < n; ++t) {
      threads.emplace_back([&, t] {
        const uint64_t* p = words_.data() + t * per;
        uint64_t s[kStreams] = {};
        for (size_t i = 0; i + 4 <= segment; i += 4) {
          for (size_t k = 0; k < kStreams; ++k) {
            const uint64_t* q = p + k * segment + i;
            s[k] += q[0] + q[1] + q[2] + q[3];
          }
        }
        sums[t] = s[0] + s[1] + s[2] + s[3];
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
