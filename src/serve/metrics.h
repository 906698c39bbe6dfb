// Metrics: what `npurt serve` reports at GET /metrics, in Prometheus' text format
// (version 0.0.4): counters and histograms the handlers add to, and gauges read when
// the page is made; the engine's and the device's figures one series per device
// (label device="0", "1", ...). Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "npurt/hal/counters.h"
#include "serve/engine_loop.h"

namespace npurt::serve {

// One replica's figures: its engine's and its device's.
struct DeviceFigures {
  EngineFigures engine;
  hal::Counters device;
};

class Metrics {
 public:
  // A request to `endpoint` answered with HTTP `status`.
  void request(const std::string& endpoint, int status);
  void tokens(uint64_t prompt, uint64_t generated);
  void time_to_first_token(double seconds);
  void inter_token(double seconds);

  // The page: these figures, then each device's (none while the model loads).
  std::string render(std::span<const DeviceFigures> devices) const;

 private:
  static constexpr std::array<double, 12> kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> counts{};  // per bucket, not cumulative
    uint64_t count = 0;
    double sum = 0;
    void add(double v);
    void render(std::string& out, const char* name, const char* help) const;
  };

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, inter_token_;
};

}  // namespace npurt::serve
