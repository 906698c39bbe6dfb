// A test cannot go on without the value of a failed setup step: value_or_die() fails
// the test with the Status and aborts (an ASSERT cannot return a value), and
// otherwise passes the value through.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <utility>

#include "npurt/base/status.h"

namespace npurt::testing {

template <typename T>
T value_or_die(StatusOr<T> v) {
  if (!v.ok()) {
    ADD_FAILURE() << v.status().to_string();
    std::abort();
  }
  return std::move(v).value();
}

}  // namespace npurt::testing
