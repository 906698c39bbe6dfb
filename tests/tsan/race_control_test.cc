// The race detector's negative control: two threads increment one counter with no
// synchronization at all. Under ThreadSanitizer this test must be reported and fail;
// tsan.race_control_is_reported (CMakeLists.txt) checks that it is, so a build in which
// the detector is silently not working cannot pass `make test-tsan`.
#include <gtest/gtest.h>

#include <thread>

namespace {

// Not atomic, not guarded, on purpose; noinline so the report names this function.
[[gnu::noinline]] void bump_unsynchronized(long* counter, int times) {
  for (int i = 0; i < times; ++i) {
    *counter = *counter + 1;
    asm volatile("" ::: "memory");  // one load and one store per increment, not one add in all
  }
}

TEST(TsanControl, AnUnsynchronizedCounterIsReported) {
  long counter = 0;
  std::thread a(bump_unsynchronized, &counter, 100000);
  std::thread b(bump_unsynchronized, &counter, 100000);
  a.join();
  b.join();
  // Lost updates may or may not happen; the detector's report is what fails this test.
  EXPECT_LE(counter, 200000);
}

}  // namespace
