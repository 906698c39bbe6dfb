#include "npurt/base/trace.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace npurt::trace {

namespace detail {
std::atomic<int> state{kUnknown};
}  // namespace detail

namespace {

constexpr int kPid = 1;

std::string format_us(double us) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", us);
  return buf;
}

// The recorded events, never destroyed: threads still running during static
// destruction (device stream threads owned by statics) may record until the
// exit-time write, which then closes the sink.
struct Sink {
  std::mutex mu;
  std::string path;                    // guarded by mu
  std::vector<std::string> events;     // guarded by mu: one JSON object each
  std::unordered_map<std::string, int> lane_ids;  // guarded by mu
  std::vector<std::string> lane_names;            // guarded by mu: index = tid - 1
  uint64_t dropped = 0;                // guarded by mu
  bool closed = false;                 // guarded by mu: written at exit
  std::once_flag atexit_once;
};

Sink& sink() {
  static Sink* s = new Sink;
  return *s;
}

std::chrono::steady_clock::time_point origin() {
  static const auto t = std::chrono::steady_clock::now();
  return t;
}

// Caller holds sink().mu.
int lane_id(Sink& s, std::string_view lane) {
  auto it = s.lane_ids.find(std::string(lane));
  if (it != s.lane_ids.end()) return it->second;
  s.lane_names.emplace_back(lane);
  const int id = static_cast<int>(s.lane_names.size());
  s.lane_ids.emplace(std::string(lane), id);
  return id;
}

void append_args(std::string& out, std::initializer_list<Arg> args) {
  if (args.size() == 0) return;
  out += ",\"args\":{";
  bool first = true;
  for (const Arg& a : args) {
    if (!first) out += ',';
    first = false;
    out += '"';
    out += json_escape(a.key);
    out += "\":";
    out += a.json;
  }
  out += '}';
}

// Caller holds sink().mu.
void record(Sink& s, std::string event) {
  if (s.closed) return;
  if (s.events.size() >= kMaxEvents) {
    ++s.dropped;
    return;
  }
  s.events.push_back(std::move(event));
}

std::string event_head(std::string_view name, std::string_view category, char phase,
                       double ts_us, int tid) {
  std::string e;
  e.reserve(160);
  e += "{\"name\":\"";
  e += json_escape(name);
  e += "\",\"cat\":\"";
  e += json_escape(category);
  e += "\",\"ph\":\"";
  e += phase;
  e += "\",\"ts\":";
  e += format_us(ts_us);
  e += ",\"pid\":";
  e += std::to_string(kPid);
  e += ",\"tid\":";
  e += std::to_string(tid);
  return e;
}

// Caller holds sink().mu.
Status write_locked(Sink& s) {
  if (s.path.empty()) return ok_status();
  std::FILE* f = std::fopen(s.path.c_str(), "w");
  if (!f) {
    return failed_precondition("trace: cannot open '" + s.path + "' for writing: " +
                               std::strerror(errno));
  }
  std::string out = "[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"npurt\"}}";
  for (size_t i = 0; i < s.lane_names.size(); ++i) {
    const std::string tid = std::to_string(i + 1);
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + tid +
           ",\"args\":{\"name\":\"" + json_escape(s.lane_names[i]) + "\"}}";
    out += ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":" + tid +
           ",\"args\":{\"sort_index\":" + tid + "}}";
  }
  for (const std::string& e : s.events) {
    out += ",\n";
    out += e;
  }
  if (s.dropped > 0) {
    out += ",\n" + event_head("events dropped", "trace", 'i', 0, 0) +
           ",\"s\":\"g\",\"args\":{\"count\":" + std::to_string(s.dropped) + "}}";
  }
  out += "\n]\n";
  const size_t written = std::fwrite(out.data(), 1, out.size(), f);
  const bool closed_ok = std::fclose(f) == 0;
  if (written != out.size() || !closed_ok) {
    return failed_precondition("trace: writing '" + s.path + "' failed");
  }
  return ok_status();
}

void write_at_exit() {
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  if (detail::state.load(std::memory_order_relaxed) != detail::kOn) return;
  Status st = write_locked(s);
  if (!st.ok()) std::fprintf(stderr, "npurt: %s\n", st.to_string().c_str());
  s.closed = true;
  detail::state.store(detail::kOff, std::memory_order_relaxed);
}

void register_exit_write(Sink& s) {
  std::call_once(s.atexit_once, [] { std::atexit(write_at_exit); });
}

}  // namespace

namespace detail {

bool init_from_env() {
  static const bool on = [] {
    const char* path = std::getenv("NPURT_TRACE");
    int expected = kUnknown;
    if (path == nullptr || *path == '\0') {
      state.compare_exchange_strong(expected, kOff);
      return false;
    }
    Sink& s = sink();
    std::lock_guard lock(s.mu);
    origin();
    // A start() that raced ahead of us wins.
    if (!state.compare_exchange_strong(expected, kOn)) return false;
    s.path = path;
    register_exit_write(s);
    return true;
  }();
  (void)on;
  return state.load(std::memory_order_relaxed) == kOn;
}

}  // namespace detail

Arg::Arg(std::string_view key, std::string_view value)
    : key(key), json("\"" + json_escape(value) + "\"") {}

Arg::Arg(std::string_view key, double value) : key(key), json(format_us(value)) {}

std::string json_escape(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (const char ch : in) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin())
      .count();
}

void complete(std::string_view lane, std::string_view name, std::string_view category,
              double start_us, double end_us, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  std::string e = event_head(name, category, 'X', start_us, lane_id(s, lane));
  e += ",\"dur\":";
  e += format_us(end_us > start_us ? end_us - start_us : 0.0);
  append_args(e, args);
  e += '}';
  record(s, std::move(e));
}

void instant(std::string_view lane, std::string_view name, std::string_view category,
             std::initializer_list<Arg> args) {
  if (!enabled()) return;
  const double ts = now_us();
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  std::string e = event_head(name, category, 'i', ts, lane_id(s, lane));
  e += ",\"s\":\"t\"";
  append_args(e, args);
  e += '}';
  record(s, std::move(e));
}

Status start(std::string path) {
  if (path.empty()) return invalid_argument("trace::start: empty path");
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  origin();
  s.path = std::move(path);
  s.events.clear();
  s.dropped = 0;
  s.closed = false;
  register_exit_write(s);
  detail::state.store(detail::kOn, std::memory_order_relaxed);
  return ok_status();
}

Status flush() {
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  return write_locked(s);
}

Status stop() {
  Sink& s = sink();
  std::lock_guard lock(s.mu);
  Status st = write_locked(s);
  detail::state.store(detail::kOff, std::memory_order_relaxed);
  s.path.clear();
  s.events.clear();
  s.lane_ids.clear();
  s.lane_names.clear();
  s.dropped = 0;
  return st;
}

}  // namespace npurt::trace
