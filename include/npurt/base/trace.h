// A process-wide Chrome-trace sink: what every device command, publication and run
// did, and when, as a JSON file that chrome://tracing and Perfetto open.
//
// Enabling: set NPURT_TRACE=path.json in the environment (read on the first
// enabled() call), or call trace::start(path). While disabled every hook costs one
// relaxed atomic load: callers guard argument formatting with `if (trace::enabled())`.
//
// Events: complete spans (ph "X": start and duration) and instants (ph "i"). Each
// belongs to a *lane*, a named row of the timeline ("stream 3", "core 0", "slot 1",
// "code registry"); lanes become Chrome-trace threads (tid) of one process, named by
// metadata events. Times are microseconds since the sink's origin (steady clock).
//
// Output: the file holds one JSON array of every event recorded so far. It is
// (re)written by flush(), by stop(), and once at normal process exit (std::atexit).
// Events recorded after the exit-time write are dropped. At most kMaxEvents are kept;
// later ones are counted and reported by a final instant event "events dropped".
//
// Threading: every function is thread-safe. Recording takes a mutex (only while
// enabled); lanes are interned on first use.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "npurt/base/status.h"

namespace npurt::trace {

inline constexpr uint64_t kMaxEvents = 1u << 22;

// One event argument; the value is stored already encoded as JSON.
struct Arg {
  Arg(std::string_view key, std::string_view value);
  Arg(std::string_view key, const char* value) : Arg(key, std::string_view(value)) {}
  Arg(std::string_view key, const std::string& value) : Arg(key, std::string_view(value)) {}
  template <std::integral T>
  Arg(std::string_view key, T value) : key(key), json(std::to_string(value)) {}
  // A typed id or address (hal/ids.h): its number.
  template <typename T>
    requires requires(T t) {
      { t.value() } -> std::integral;
    }
  Arg(std::string_view key, T value) : Arg(key, value.value()) {}
  Arg(std::string_view key, bool value) : key(key), json(value ? "true" : "false") {}
  Arg(std::string_view key, double value);

  std::string key;
  std::string json;
};

namespace detail {
enum : int { kUnknown = 0, kOff = 1, kOn = 2 };
extern std::atomic<int> state;
bool init_from_env();
}  // namespace detail

// True while events are being recorded.
inline bool enabled() {
  const int s = detail::state.load(std::memory_order_relaxed);
  if (s == detail::kUnknown) [[unlikely]] return detail::init_from_env();
  return s == detail::kOn;
}

// Microseconds since the sink's origin; use it for complete() start/end times.
double now_us();

// A span [start_us, end_us] on `lane`. Ignored while disabled.
void complete(std::string_view lane, std::string_view name, std::string_view category,
              double start_us, double end_us, std::initializer_list<Arg> args = {});

// A point event at now_us() on `lane`. Ignored while disabled.
void instant(std::string_view lane, std::string_view name, std::string_view category,
             std::initializer_list<Arg> args = {});

// Starts recording to `path`, replacing any earlier destination and dropping events
// not yet written. The file is first written by flush(), stop() or process exit.
// kInvalidArgument for an empty path.
Status start(std::string path);

// Writes every event recorded so far to the destination. OK (and no file) while
// nothing was ever started; the I/O error naming the path if the write fails.
Status flush();

// flush(), then stops recording and drops the recorded events.
Status stop();

// Escapes `s` as the contents of a JSON string (no surrounding quotes).
std::string json_escape(std::string_view s);

}  // namespace npurt::trace
