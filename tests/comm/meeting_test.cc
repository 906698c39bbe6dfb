// The meeting's arrivals, waits and help: one thread can carry a round by running the
// missing peers' arrivals, and only theirs.

#include "comm/meeting.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace npurt::comm {
namespace {

using std::chrono::milliseconds;

// Every rank's arrival runs on this one thread, from inside rank 0's wait: the round
// completes without a second thread. Without the help it could only time out.
TEST(Meeting, AWaitingRankRunsTheMissingPeersArrivals) {
  Meeting m(3, milliseconds(2000));
  ASSERT_TRUE(m.arrive(0, 0).ok());
  std::vector<int> helped;
  const Status s = m.wait(0, 0, "all_reduce #0", [&](int rank, uint64_t round) {
    EXPECT_EQ(round, 0u);
    helped.push_back(rank);
    return m.arrive(rank, round).ok();
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(helped, (std::vector<int>{1, 2})) << "each missing rank, once, and never the waiting one";
  EXPECT_TRUE(m.arrived(1, 0) && m.arrived(2, 0));
  EXPECT_FALSE(m.arrived(1, 1));
}

// Help that cannot run anything (the peers' streams are busy) changes nothing: the
// wait still ends with the timeout, naming the rank that never came.
TEST(Meeting, HelpThatRunsNothingStillTimesOutByName) {
  Meeting m(2, milliseconds(100));
  ASSERT_TRUE(m.arrive(0, 0).ok());
  int offers = 0;
  const Status s = m.wait(0, 0, "barrier #0", [&](int rank, uint64_t) {
    EXPECT_EQ(rank, 1);
    ++offers;
    return false;
  });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("barrier #0 on rank 0 of 2: rank(s) 1 did not arrive within 100 ms"),
            std::string::npos)
      << s.to_string();
  EXPECT_GE(offers, 1);
  EXPECT_FALSE(m.arrive(1, 0).ok()) << "the failure is final";
}

// Time spent running peers' parts counts toward the timeout: help that keeps finding
// work (here, 30 ms of it per call) cannot postpone the verdict.
TEST(Meeting, HelpDoesNotPostponeTheTimeout) {
  Meeting m(2, milliseconds(100));
  ASSERT_TRUE(m.arrive(0, 0).ok());
  const auto start = std::chrono::steady_clock::now();
  const Status s = m.wait(0, 0, "all_gather #0", [](int, uint64_t) {
    std::this_thread::sleep_for(milliseconds(30));
    return true;
  });
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_LT(took, milliseconds(1000)) << "the wait ran past its timeout while helping";
}

// A wait for a round every rank reached returns at once, without offering help.
TEST(Meeting, AWaitAfterEveryArrivalNeedsNoHelp) {
  Meeting m(2, milliseconds(100));
  ASSERT_TRUE(m.arrive(1, 0).ok());
  ASSERT_TRUE(m.arrive(0, 0).ok());
  const Status s = m.wait(1, 0, "broadcast #0", [](int, uint64_t) -> bool {
    ADD_FAILURE() << "help offered with every rank there";
    return false;
  });
  EXPECT_TRUE(s.ok()) << s.to_string();
}

}  // namespace
}  // namespace npurt::comm
