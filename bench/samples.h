// Per-iteration wall times, so benchmarks can report medians (Google Benchmark's
// own counters are means).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace npurt::bench {

struct Samples {
  std::vector<double> seconds;
  template <typename F>
  void time(F fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double median() {
    if (seconds.empty()) return 0;
    std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
    return seconds[seconds.size() / 2];
  }
};

// Times `a` and `b` alternately, once each per benchmark iteration, so that both see
// the same machine state; returns their samples in that order.
template <typename A, typename B>
std::pair<Samples, Samples> sample_alternately(benchmark::State& state, A a, B b) {
  Samples sa, sb;
  for (auto _ : state) {
    sa.time(a);
    sb.time(b);
  }
  return {std::move(sa), std::move(sb)};
}

// Our figure next to the peer's (or limit's) measured in the same run, and their
// ratio, as the counters `ours`, `peer` and `ratio`.
inline void report_ratio(benchmark::State& state, const char* ours, double ours_value, const char* peer,
                         double peer_value, const char* ratio) {
  state.counters[ours] = ours_value;
  state.counters[peer] = peer_value;
  state.counters[ratio] = ours_value / peer_value;
}

}  // namespace npurt::bench
