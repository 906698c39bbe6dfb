#include "serve/metrics.h"

#include <cstdio>

namespace npurt::serve {
namespace {

void line(std::string& out, const std::string& name, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", value);
  out += name + buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// A metric of one value: its header, then the value.
void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  header(out, name, type, help);
  line(out, name, value);
}

}  // namespace

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(uint64_t prompt, uint64_t generated) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.add(seconds);
}

void Metrics::inter_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  inter_token_.add(seconds);
}

void Metrics::Histogram::add(double v) {
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (v <= kBuckets[i]) {
      ++counts[i];
      break;
    }
  }
  ++count;
  sum += v;
}

void Metrics::Histogram::render(std::string& out, const char* name, const char* help) const {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += counts[i];
    char le[32];
    std::snprintf(le, sizeof le, "%g", kBuckets[i]);
    line(out, std::string(name) + "_bucket{le=\"" + le + "\"}", static_cast<double>(cumulative));
  }
  line(out, std::string(name) + "_bucket{le=\"+Inf\"}", static_cast<double>(count));
  line(out, std::string(name) + "_sum", sum);
  line(out, std::string(name) + "_count", static_cast<double>(count));
}

std::string Metrics::render(std::span<const DeviceFigures> devices) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    header(out, "npurt_requests_total", "counter", "HTTP requests answered, by endpoint and status");
    for (const auto& [key, n] : requests_) {
      line(out, "npurt_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"}",
           static_cast<double>(n));
    }
    metric(out, "npurt_prompt_tokens_total", "counter", "prompt tokens of the requests answered",
           static_cast<double>(prompt_tokens_));
    metric(out, "npurt_generated_tokens_total", "counter", "tokens generated for the requests answered",
           static_cast<double>(generated_tokens_));
    ttft_.render(out, "npurt_time_to_first_token_seconds", "from a request's arrival to its first token");
    inter_token_.render(out, "npurt_inter_token_seconds", "between a request's consecutive tokens");
  }
  metric(out, "npurt_devices", "gauge", "devices serving the model, one replica each",
         static_cast<double>(devices.size()));
  using Figure = double (*)(const DeviceFigures&);
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    Figure value;
  };
  static constexpr Series kSeries[] = {
      {"npurt_queue_depth", "gauge", "requests waiting for a slot, as of the engine's last step",
       [](const DeviceFigures& f) { return double(f.engine.queued + f.engine.waiting); }},
      {"npurt_running_sequences", "gauge", "sequences decoding, as of the engine's last step",
       [](const DeviceFigures& f) { return double(f.engine.running); }},
      {"npurt_kv_blocks_used", "gauge", "KV cache blocks held by sequences",
       [](const DeviceFigures& f) { return double(f.engine.kv_blocks_used); }},
      {"npurt_kv_blocks_free", "gauge", "KV cache blocks free",
       [](const DeviceFigures& f) { return double(f.engine.kv_blocks_free); }},
      {"npurt_engine_steps_total", "counter", "engine steps since the server started",
       [](const DeviceFigures& f) { return double(f.engine.steps); }},
      {"npurt_preemptions_total", "counter", "sequences preempted for KV blocks",
       [](const DeviceFigures& f) { return double(f.engine.preemptions); }},
      {"npurt_prompt_tokens_computed_total", "counter", "prompt tokens prefilled (shared prefixes not again)",
       [](const DeviceFigures& f) { return double(f.engine.prompt_tokens_computed); }},
      {"npurt_device_streams_created_total", "counter", "device streams created",
       [](const DeviceFigures& f) { return double(f.device.streams_created); }},
      {"npurt_device_streams_destroyed_total", "counter", "device streams destroyed",
       [](const DeviceFigures& f) { return double(f.device.streams_destroyed); }},
      {"npurt_device_code_uploads_total", "counter", "code images uploaded to the device",
       [](const DeviceFigures& f) { return double(f.device.code_uploads); }},
      {"npurt_device_launches_total", "counter", "kernel launches",
       [](const DeviceFigures& f) { return double(f.device.launches); }},
      {"npurt_device_h2d_bytes_total", "counter", "bytes copied host to device",
       [](const DeviceFigures& f) { return double(f.device.h2d_bytes); }},
      {"npurt_device_d2h_bytes_total", "counter", "bytes copied device to host",
       [](const DeviceFigures& f) { return double(f.device.d2h_bytes); }},
      {"npurt_device_allocated_bytes_total", "counter", "device bytes allocated",
       [](const DeviceFigures& f) { return double(f.device.allocated_bytes); }},
      {"npurt_device_freed_bytes_total", "counter", "device bytes freed",
       [](const DeviceFigures& f) { return double(f.device.freed_bytes); }}};
  for (const Series& s : kSeries) {
    header(out, s.name, s.type, s.help);
    for (size_t d = 0; d < devices.size(); ++d) {
      line(out, std::string(s.name) + "{device=\"" + std::to_string(d) + "\"}", s.value(devices[d]));
    }
  }
  return out;
}

}  // namespace npurt::serve
