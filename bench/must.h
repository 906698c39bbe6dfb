// A benchmark cannot go on after a failed setup step: must() prints the Status and
// aborts, and otherwise passes the value through.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "npurt/base/status.h"

namespace npurt::bench {

inline void must(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "benchmark: %s\n", s.to_string().c_str());
    std::abort();
  }
}

template <typename T>
T must(StatusOr<T> v) {
  must(v.status());
  return std::move(v).value();
}

}  // namespace npurt::bench
