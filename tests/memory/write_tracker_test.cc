#include "npurt/memory/write_tracker.h"

#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memory/page_mapping.h"

namespace npurt {
namespace {

using Mechanism = WriteTrackingMechanism;

size_t page() { return PageWriteTracker::page_size(); }

using Mapping = testing::PageMapping;

// Page ranges [first, last) as byte ranges, the form take_dirty() reports.
std::vector<ByteRange> pages(std::initializer_list<std::pair<size_t, size_t>> runs) {
  std::vector<ByteRange> out;
  for (const auto& [first, last] : runs) out.push_back({first * page(), last * page()});
  return out;
}

// Coalesced page ranges covering a set of page indices.
std::vector<ByteRange> ranges_of(const std::set<size_t>& page_set) {
  std::vector<ByteRange> out;
  for (size_t p : page_set) {
    if (!out.empty() && out.back().end == p * page()) {
      out.back().end += page();
    } else {
      out.push_back({p * page(), (p + 1) * page()});
    }
  }
  return out;
}

// Lines of /proc/self/maps (one per kernel mapping) overlapping [begin, end).
int mappings_covering(const void* begin, size_t length) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t hi = lo + length;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int count = 0;
  while (std::getline(maps, line)) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &a, &b) != 2) continue;
    if (a < hi && b > lo) ++count;
  }
  return count;
}

#define ASSERT_OK(expr)                               \
  do {                                                \
    const ::npurt::Status status_ = (expr);           \
    ASSERT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)

std::vector<ByteRange> take_all(PageWriteTracker& tracker) {
  auto dirty = tracker.take_dirty(0, tracker.length());
  EXPECT_TRUE(dirty.ok()) << dirty.status().to_string();
  return dirty.ok() ? *dirty : std::vector<ByteRange>{};
}

class WriteTrackerTest : public ::testing::TestWithParam<Mechanism> {
 protected:
  void SetUp() override {
    if (GetParam() == Mechanism::kUserfaultfd) {
      const Status support = PageWriteTracker::userfaultfd_support();
      if (!support.ok()) {
        GTEST_SKIP() << "userfaultfd write tracking not offered here: " << support.to_string();
      }
    }
  }

  StatusOr<PageWriteTracker> track(const Mapping& m) {
    return PageWriteTracker::create(m.data(), m.length(), {GetParam()});
  }

  // Creates and arms a tracker over m; fails the test on error.
  PageWriteTracker armed(const Mapping& m) {
    auto tracker = track(m);
    if (!tracker.ok()) {
      ADD_FAILURE() << tracker.status().to_string();
      std::abort();
    }
    EXPECT_EQ(tracker->mechanism(), GetParam());
    const Status s = tracker->arm();
    EXPECT_TRUE(s.ok()) << s.to_string();
    return std::move(tracker).value();
  }
};

TEST_P(WriteTrackerTest, CatchesMemcpy) {
  Mapping m(16);
  PageWriteTracker tracker = armed(m);
  const std::string text(100, 'x');
  std::memcpy(m.page_ptr(2) + 10, text.data(), text.size());
  std::memcpy(m.page_ptr(2) + 500, text.data(), text.size());  // same page again
  std::memcpy(m.page_ptr(6) - 50, text.data(), text.size());   // straddles pages 5 and 6
  EXPECT_EQ(take_all(tracker), pages({{2, 3}, {5, 7}}));
  EXPECT_EQ(tracker.stats().faults_caught, 3u);
  EXPECT_EQ(m.page_ptr(2)[10], 'x');  // the write itself went through
}

TEST_P(WriteTrackerTest, CatchesStdCopy) {
  Mapping m(16);
  PageWriteTracker tracker = armed(m);
  std::vector<int> values(3 * page() / sizeof(int), 7);
  std::copy(values.begin(), values.end(), reinterpret_cast<int*>(m.page_ptr(9)));
  EXPECT_EQ(take_all(tracker), pages({{9, 12}}));
  EXPECT_EQ(reinterpret_cast<int*>(m.page_ptr(11))[0], 7);
}

// numpy-style: every third float of a sub-block of a row-major 2-D array.
TEST_P(WriteTrackerTest, CatchesStridedWritesOverA2DRegion) {
  Mapping m(64);
  PageWriteTracker tracker = armed(m);
  float* array = reinterpret_cast<float*>(m.data());
  const size_t cols = 1500;  // rows are not page multiples, so rows straddle pages
  std::set<size_t> written_pages;
  for (size_t r = 10; r < 40; r += 7) {
    for (size_t c = 100; c < 1400; c += 3) {
      array[r * cols + c] = 1.5f;
      written_pages.insert((r * cols + c) * sizeof(float) / page());
    }
  }
  ASSERT_GT(written_pages.size(), 5u);
  EXPECT_EQ(take_all(tracker), ranges_of(written_pages));
}

TEST_P(WriteTrackerTest, CatchesWritesFromAnotherThread) {
  Mapping m(16);
  PageWriteTracker tracker = armed(m);
  std::thread writer([&] { m.page_ptr(7)[123] = 1; });
  writer.join();
  EXPECT_EQ(take_all(tracker), pages({{7, 8}}));
}

// Writes the kernel makes on the process's behalf: caught by userfaultfd, refused
// with EFAULT under mprotect (as the header documents).
TEST_P(WriteTrackerTest, KernelWritesIntoTheRegion) {
  Mapping m(4);
  PageWriteTracker tracker = armed(m);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "kernel", 6), 6);
  const ssize_t n = read(fds[0], m.page_ptr(2) + 8, 6);
  const int err = errno;
  close(fds[0]);
  close(fds[1]);
  if (GetParam() == Mechanism::kUserfaultfd) {
    ASSERT_EQ(n, 6);
    EXPECT_EQ(std::string(m.page_ptr(2) + 8, 6), "kernel");
    EXPECT_EQ(take_all(tracker), pages({{2, 3}}));
  } else {
    EXPECT_EQ(n, -1);
    EXPECT_EQ(err, EFAULT);
    EXPECT_TRUE(take_all(tracker).empty());
  }
}

TEST_P(WriteTrackerTest, ReadsAndUnwrittenPagesAreNotReported) {
  Mapping m(8);
  PageWriteTracker tracker = armed(m);
  long sum = 0;
  for (size_t i = 0; i < m.length(); i += 64) sum += m.data()[i];
  EXPECT_EQ(sum, 0);
  EXPECT_TRUE(take_all(tracker).empty());
  m.page_ptr(4)[0] = 1;
  EXPECT_EQ(take_all(tracker), pages({{4, 5}}));
  EXPECT_EQ(tracker.stats().faults_caught, 1u);
}

TEST_P(WriteTrackerTest, TakeReprotectsSoTheNextWriteIsCaughtAgain) {
  Mapping m(8);
  PageWriteTracker tracker = armed(m);
  m.page_ptr(1)[0] = 1;
  m.page_ptr(1)[1] = 2;  // no second fault: the page is writable until taken
  EXPECT_EQ(take_all(tracker), pages({{1, 2}}));
  EXPECT_TRUE(take_all(tracker).empty());
  m.page_ptr(1)[2] = 3;
  EXPECT_EQ(take_all(tracker), pages({{1, 2}}));
  EXPECT_EQ(tracker.stats().faults_caught, 2u);
  EXPECT_EQ(tracker.stats().pages_reprotected, 2u);
}

TEST_P(WriteTrackerTest, PartialRangesTakeOnlyTheirPages) {
  Mapping m(8);
  PageWriteTracker tracker = armed(m);
  for (size_t p : {1, 3, 5}) m.page_ptr(p)[0] = 1;
  // Any byte of a page selects the whole page.
  auto middle = tracker.take_dirty(3 * page() + 10, 3 * page() + 20);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ(*middle, pages({{3, 4}}));
  EXPECT_EQ(take_all(tracker), pages({{1, 2}, {5, 6}}));
  m.page_ptr(3)[7] = 1;  // re-protected by the partial take
  EXPECT_EQ(take_all(tracker), pages({{3, 4}}));
  auto empty = tracker.take_dirty(page(), page());
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

// The dirty bitmap has 64 pages per word: runs must join across words.
TEST_P(WriteTrackerTest, RunsSpanBitmapWords) {
  Mapping m(200);
  PageWriteTracker tracker = armed(m);
  auto write_pages = [&](size_t first, size_t last) {
    for (size_t p = first; p < last; ++p) m.page_ptr(p)[5] = 1;
  };
  write_pages(60, 71);
  write_pages(127, 130);
  write_pages(190, 200);
  auto middle = tracker.take_dirty(65 * page(), 128 * page() - 1);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ(*middle, pages({{65, 71}, {127, 128}}));
  EXPECT_EQ(take_all(tracker), pages({{60, 65}, {128, 130}, {190, 200}}));
  ASSERT_OK(tracker.mark_all_dirty());
  EXPECT_EQ(take_all(tracker), pages({{0, 200}}));
}

TEST_P(WriteTrackerTest, RejectsRangesOutsideTheRegion) {
  Mapping m(4);
  PageWriteTracker tracker = armed(m);
  EXPECT_EQ(tracker.take_dirty(0, m.length() + 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tracker.take_dirty(2 * page(), page()).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(tracker.clear(0, m.length() + page()).code(), StatusCode::kOutOfRange);
}

TEST_P(WriteTrackerTest, WritesBeforeArmAreNotSeen) {
  Mapping m(4);
  auto tracker = track(m);
  ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
  m.page_ptr(0)[0] = 1;
  ASSERT_OK(tracker->arm());
  EXPECT_TRUE(take_all(*tracker).empty());
  m.page_ptr(0)[0] = 2;
  EXPECT_EQ(take_all(*tracker), pages({{0, 1}}));
}

TEST_P(WriteTrackerTest, MarkAllDirtyThenClear) {
  Mapping m(8);
  PageWriteTracker tracker = armed(m);
  ASSERT_OK(tracker.mark_all_dirty());
  m.page_ptr(2)[0] = 1;  // already dirty and writable
  EXPECT_EQ(take_all(tracker), pages({{0, 8}}));

  ASSERT_OK(tracker.mark_all_dirty());
  ASSERT_OK(tracker.clear(0, 4 * page()));
  EXPECT_EQ(take_all(tracker), pages({{4, 8}}));
  m.page_ptr(0)[0] = 1;  // clear() protected the forgotten pages
  EXPECT_EQ(take_all(tracker), pages({{0, 1}}));

  m.page_ptr(5)[0] = 1;
  ASSERT_OK(tracker.clear());
  EXPECT_TRUE(take_all(tracker).empty());
}

TEST_P(WriteTrackerTest, ReprotectsEachDirtyRunWithOneCall) {
  constexpr size_t kPages = 64;
  Mapping m(kPages);
  PageWriteTracker tracker = armed(m);
  // Every other page: mprotect leaves one mapping per page until re-protected.
  for (size_t p = 0; p < kPages; p += 2) m.page_ptr(p)[0] = 1;
  if (GetParam() == Mechanism::kMprotect) {
    EXPECT_EQ(mappings_covering(m.data(), m.length()), static_cast<int>(kPages));
  } else {
    EXPECT_EQ(mappings_covering(m.data(), m.length()), 1);  // protection lives in page tables
  }
  uint64_t calls = tracker.stats().protect_syscalls;
  EXPECT_EQ(take_all(tracker).size(), kPages / 2);
  if (GetParam() == Mechanism::kMprotect) {
    EXPECT_EQ(tracker.stats().protect_syscalls - calls, kPages / 2);
  }
  EXPECT_EQ(mappings_covering(m.data(), m.length()), 1);

  // Every page: one contiguous run, re-protected by a single call.
  for (size_t p = 0; p < kPages; ++p) m.page_ptr(p)[0] = 2;
  calls = tracker.stats().protect_syscalls;
  EXPECT_EQ(take_all(tracker), pages({{0, kPages}}));
  EXPECT_EQ(tracker.stats().protect_syscalls - calls, 1u);
  EXPECT_EQ(tracker.stats().pages_reprotected, kPages / 2 + kPages);
  EXPECT_EQ(mappings_covering(m.data(), m.length()), 1);
}

TEST_P(WriteTrackerTest, DestructionLeavesTheRegionWritable) {
  Mapping m(4);
  {
    PageWriteTracker tracker = armed(m);
    m.page_ptr(1)[0] = 1;
  }
  for (size_t p = 0; p < 4; ++p) m.page_ptr(p)[1] = 1;  // would crash if still protected
  EXPECT_EQ(m.page_ptr(3)[1], 1);
}

TEST_P(WriteTrackerTest, MovedTrackerKeepsTracking) {
  Mapping m(4);
  PageWriteTracker first = armed(m);
  PageWriteTracker second = std::move(first);
  m.page_ptr(2)[0] = 1;
  EXPECT_EQ(take_all(second), pages({{2, 3}}));
}

// Concurrent writer vs. repeated take_dirty: an "upload" copies every reported page
// into a shadow. Once the writer stops and a final take is done, the shadow must
// equal the region: a write reported by no take would leave a stale shadow page.
TEST_P(WriteTrackerTest, NoWriteIsLostWhileTakingConcurrently) {
  constexpr size_t kPages = 32;
  Mapping m(kPages);
  PageWriteTracker tracker = armed(m);
  const size_t words = m.length() / sizeof(uint64_t);
  auto* region = reinterpret_cast<uint64_t*>(m.data());
  std::vector<uint64_t> shadow(words, 0);
  std::atomic<uint64_t> writes{0};
  std::atomic<bool> stop{false};

  std::thread writer([&] {
    uint64_t x = 88172645463325252ull;
    for (uint64_t n = 1; !stop.load(std::memory_order_relaxed); ++n) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::atomic_ref<uint64_t>(region[x % words]).store(n, std::memory_order_relaxed);
      writes.store(n, std::memory_order_relaxed);
    }
  });
  auto upload = [&](const std::vector<ByteRange>& dirty) {
    for (const ByteRange& r : dirty) {
      for (size_t w = r.begin / sizeof(uint64_t); w < r.end / sizeof(uint64_t); ++w) {
        shadow[w] = std::atomic_ref<uint64_t>(region[w]).load(std::memory_order_relaxed);
      }
    }
  };
  // Keep taking until pages have been caught, re-protected and caught again many
  // times, i.e. the takes really overlapped the writes (bounded in time in case
  // the machine starves the writer).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tracker.stats().faults_caught < 20 * kPages &&
         std::chrono::steady_clock::now() < deadline) {
    upload(take_all(tracker));
  }
  stop = true;
  writer.join();
  upload(take_all(tracker));
  size_t stale = 0;
  for (size_t w = 0; w < words; ++w) stale += shadow[w] != region[w];
  EXPECT_EQ(stale, 0u);
  EXPECT_GE(tracker.stats().faults_caught, 20 * kPages);
  EXPECT_GT(writes.load(), 0u);
}

// ---- Signals: faults that are not the tracker's keep their usual fate ------------

sigjmp_buf g_recover;
volatile sig_atomic_t g_user_handler_ran = 0;

void user_segv_handler(int, siginfo_t*, void*) {
  g_user_handler_ran = 1;
  siglongjmp(g_recover, 1);
}

void (*current_segv_action())(int, siginfo_t*, void*) {
  struct sigaction now {};
  sigaction(SIGSEGV, nullptr, &now);
  return now.sa_sigaction;
}

// Runs in a fresh process (death-test child): the user installs a SIGSEGV
// handler first, then a tracker is created, then an unrelated page faults.
void chain_scenario(Mechanism mechanism) {
  struct sigaction user {};
  user.sa_sigaction = user_segv_handler;
  user.sa_flags = SA_SIGINFO;
  sigemptyset(&user.sa_mask);
  if (sigaction(SIGSEGV, &user, nullptr) != 0) std::_Exit(10);

  Mapping tracked(4);
  auto tracker = PageWriteTracker::create(tracked.data(), tracked.length(), {mechanism});
  if (!tracker.ok() || !tracker->arm().ok()) std::_Exit(11);
  // The mprotect mechanism must sit in front of the user's handler; userfaultfd
  // needs no handler and must leave the user's in place.
  const bool ours_in_front = current_segv_action() != user_segv_handler;
  if (ours_in_front != (mechanism == Mechanism::kMprotect)) std::_Exit(12);

  tracked.page_ptr(1)[0] = 1;  // caught by the tracker, not the user
  if (g_user_handler_ran) std::_Exit(13);

  void* guard = mmap(nullptr, page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (guard == MAP_FAILED) std::_Exit(14);
  if (sigsetjmp(g_recover, 1) == 0) {
    *static_cast<volatile char*>(guard) = 1;
    std::_Exit(15);  // the write cannot have succeeded
  }
  if (!g_user_handler_ran) std::_Exit(16);
  auto dirty = tracker->take_dirty(0, tracked.length());
  if (!dirty.ok() || dirty->size() != 1 || (*dirty)[0].begin != page()) std::_Exit(17);
  std::fprintf(stderr, "user handler ran\n");
  std::_Exit(0);
}

TEST_P(WriteTrackerTest, ForeignFaultsReachAHandlerInstalledBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, no handler yet
  EXPECT_EXIT(chain_scenario(GetParam()), ::testing::ExitedWithCode(0), "user handler ran");
}

void write_to_untracked_protected_page(Mechanism mechanism) {
  Mapping tracked(2);
  auto tracker = PageWriteTracker::create(tracked.data(), tracked.length(), {mechanism});
  if (!tracker.ok() || !tracker->arm().ok()) std::_Exit(11);
  Mapping other(1);
  mprotect(other.data(), page(), PROT_READ);
  *static_cast<volatile char*>(other.data()) = 1;
}

TEST_P(WriteTrackerTest, WriteToAnUntrackedProtectedPageStillCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizer's handler, installed before ours, reports the crash.
  EXPECT_DEATH(write_to_untracked_protected_page(GetParam()), "SEGV");
#else
  EXPECT_EXIT(write_to_untracked_protected_page(GetParam()), ::testing::KilledBySignal(SIGSEGV),
              "");
#endif
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, WriteTrackerTest,
                         ::testing::Values(Mechanism::kUserfaultfd, Mechanism::kMprotect),
                         [](const ::testing::TestParamInfo<Mechanism>& info) {
                           return std::string(write_tracking_mechanism_name(info.param));
                         });

// ---- Creation and mechanism choice --------------------------------------------------

TEST(PageWriteTracker, RejectsRegionsThatAreNotWholePages) {
  Mapping m(2);
  const Status misaligned = PageWriteTracker::create(m.data() + 1, page()).status();
  EXPECT_EQ(misaligned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(misaligned.message().find("page-aligned"), std::string::npos) << misaligned.to_string();
  EXPECT_EQ(PageWriteTracker::create(m.data(), page() + 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PageWriteTracker::create(m.data(), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PageWriteTracker::create(nullptr, page()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PageWriteTracker, ForcedUserfaultfdThatCannotRegisterIsUnimplemented) {
  if (!PageWriteTracker::userfaultfd_support().ok()) GTEST_SKIP() << "no userfaultfd here";
  // Addresses with nothing mapped cannot be registered.
  void* hole = mmap(nullptr, 2 * page(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  munmap(hole, 2 * page());
  auto forced = PageWriteTracker::create(hole, 2 * page(), {Mechanism::kUserfaultfd});
  EXPECT_EQ(forced.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(forced.status().message().find("UFFDIO_REGISTER"), std::string::npos)
      << forced.status().to_string();
}

// Sets an environment variable for a scope, restoring what was there before.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(PageWriteTracker, AutoPrefersUserfaultfd) {
  ScopedEnv env("NPURT_WRITE_TRACKING", "auto");
  Mapping m(2);
  auto tracker = PageWriteTracker::create(m.data(), m.length());
  ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
  const bool have_uffd = PageWriteTracker::userfaultfd_support().ok();
  EXPECT_EQ(tracker->mechanism(), have_uffd ? Mechanism::kUserfaultfd : Mechanism::kMprotect);
}

TEST(PageWriteTracker, EnvironmentForcesTheMechanism) {
  Mapping m(2);
  {
    ScopedEnv env("NPURT_WRITE_TRACKING", "mprotect");
    auto tracker = PageWriteTracker::create(m.data(), m.length());
    ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
    EXPECT_EQ(tracker->mechanism(), Mechanism::kMprotect);
  }
  {
    ScopedEnv env("NPURT_WRITE_TRACKING", "uffd");
    auto tracker = PageWriteTracker::create(m.data(), m.length());
    if (PageWriteTracker::userfaultfd_support().ok()) {
      ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
      EXPECT_EQ(tracker->mechanism(), Mechanism::kUserfaultfd);
    } else {
      EXPECT_EQ(tracker.status().code(), StatusCode::kUnimplemented);
    }
  }
  {
    ScopedEnv env("NPURT_WRITE_TRACKING", "sometimes");
    auto tracker = PageWriteTracker::create(m.data(), m.length());
    EXPECT_EQ(tracker.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(tracker.status().message().find("NPURT_WRITE_TRACKING"), std::string::npos);
  }
  {
    // An explicit option wins over the environment.
    ScopedEnv env("NPURT_WRITE_TRACKING", "uffd");
    auto tracker = PageWriteTracker::create(m.data(), m.length(), {Mechanism::kMprotect});
    ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
    EXPECT_EQ(tracker->mechanism(), Mechanism::kMprotect);
  }
}

}  // namespace
}  // namespace npurt
