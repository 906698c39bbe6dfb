#include "npurt/exec/stream_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace npurt::exec {
namespace {

// A fake device that knows nothing but streams. It records every live handle and
// which handles a run is currently launching on (the test says so with run_takes /
// run_releases), and it records misuse as violations: destroying a stream that a run
// owns, destroying an unknown or already destroyed stream, handing a dead stream to
// a run, or one stream to two runs at once. Knobs make creates or destroys fail.
class FakeStreams {
 public:
  static constexpr StreamHandle kFirstHandle{1001};

  StreamOps ops() {
    return StreamOps{[this] { return create(); },
                     [this](StreamHandle h) { return destroy(h); }};
  }

  // ---- knobs ----
  void fail_next_creates(int n) {
    std::lock_guard lock(mu_);
    creates_to_fail_ = n;
  }
  void fail_next_destroys(int n) {
    std::lock_guard lock(mu_);
    destroys_to_fail_ = n;
  }
  // Every destroy of `h` fails until stop_failing_destroys_of(h).
  void fail_destroys_of(StreamHandle h) {
    std::lock_guard lock(mu_);
    wedged_.insert(h);
  }
  void stop_failing_destroys_of(StreamHandle h) {
    std::lock_guard lock(mu_);
    wedged_.erase(h);
  }

  // ---- the test's runs ----
  void run_takes(StreamHandle h) {
    std::lock_guard lock(mu_);
    if (live_.count(h) == 0) {
      violation("run got stream " + std::to_string(h.value()) + ", which is not live");
    }
    if (!owned_by_run_.insert(h).second) {
      violation("stream " + std::to_string(h.value()) + " handed to two runs at once");
    }
  }
  void run_releases(StreamHandle h) {
    std::lock_guard lock(mu_);
    owned_by_run_.erase(h);
  }

  // ---- observations ----
  uint64_t creates() const { return locked(creates_); }            // successful
  uint64_t destroys() const { return locked(destroys_); }          // successful
  uint64_t create_calls() const { return locked(create_calls_); }
  uint64_t destroy_calls() const { return locked(destroy_calls_); }
  uint64_t live() const {
    std::lock_guard lock(mu_);
    return live_.size();
  }
  bool is_live(StreamHandle h) const {
    std::lock_guard lock(mu_);
    return live_.count(h) != 0;
  }
  int destroyed_times(StreamHandle h) const { return count_of(destroyed_, h); }
  int destroy_attempts(StreamHandle h) const { return count_of(destroy_attempts_, h); }
  std::vector<std::string> violations() const {
    std::lock_guard lock(mu_);
    return violations_;
  }

 private:
  StatusOr<StreamHandle> create() {
    std::lock_guard lock(mu_);
    ++create_calls_;
    if (creates_to_fail_ > 0) {
      --creates_to_fail_;
      return resource_exhausted("fake: out of streams");
    }
    const StreamHandle h = next_;
    next_ = StreamHandle(next_.value() + 1);
    live_.insert(h);
    ++creates_;
    return h;
  }

  Status destroy(StreamHandle h) {
    std::lock_guard lock(mu_);
    ++destroy_calls_;
    ++destroy_attempts_[h];
    if (owned_by_run_.count(h) != 0) {
      violation("destroy of stream " + std::to_string(h.value()) + " while a run owns it");
    }
    if (live_.count(h) == 0) {
      violation("destroy of stream " + std::to_string(h.value()) + ", which is not live");
      return not_found("fake: no stream " + std::to_string(h.value()));
    }
    if (destroys_to_fail_ > 0) {
      --destroys_to_fail_;
      return device_fault("fake: stream " + std::to_string(h.value()) + " is wedged");
    }
    if (wedged_.count(h) != 0) {
      return device_fault("fake: stream " + std::to_string(h.value()) + " is wedged");
    }
    live_.erase(h);
    ++destroys_;
    ++destroyed_[h];
    return ok_status();
  }

  void violation(std::string what) { violations_.push_back(std::move(what)); }

  uint64_t locked(const uint64_t& v) const {
    std::lock_guard lock(mu_);
    return v;
  }
  int count_of(const std::map<StreamHandle, int>& m, StreamHandle h) const {
    std::lock_guard lock(mu_);
    auto it = m.find(h);
    return it == m.end() ? 0 : it->second;
  }

  mutable std::mutex mu_;
  StreamHandle next_ = kFirstHandle;
  std::set<StreamHandle> live_;
  std::set<StreamHandle> owned_by_run_;
  std::set<StreamHandle> wedged_;
  std::map<StreamHandle, int> destroyed_;
  std::map<StreamHandle, int> destroy_attempts_;
  int creates_to_fail_ = 0;
  int destroys_to_fail_ = 0;
  uint64_t creates_ = 0, destroys_ = 0, create_calls_ = 0, destroy_calls_ = 0;
  std::vector<std::string> violations_;
};

constexpr uint64_t kImageA = 0xA;
constexpr uint64_t kImageB = 0xB;

std::unique_ptr<StreamSlots> make_slots(FakeStreams& fake, uint32_t depth = 2,
                                        ReusePolicy policy = ReusePolicy::kPublicationAware) {
  StatusOr<std::unique_ptr<StreamSlots>> slots = StreamSlots::make(fake.ops(), depth, policy);
  if (!slots.ok()) {
    ADD_FAILURE() << slots.status().to_string();
    return nullptr;
  }
  return std::move(slots).value();
}

// One whole run, begin to retire, as the executor drives it.
SlotLease run_once(StreamSlots& slots, FakeStreams& fake, uint32_t slot, uint64_t epoch,
                   uint64_t image, RunOutcome outcome = RunOutcome::kComplete) {
  StatusOr<SlotLease> lease = slots.begin(slot, epoch, image);
  if (!lease.ok()) {
    ADD_FAILURE() << "begin on slot " << slot << ": " << lease.status().to_string();
    return SlotLease{};
  }
  fake.run_takes(lease->stream);
  fake.run_releases(lease->stream);
  Status retired = slots.retire(*lease, outcome);
  EXPECT_TRUE(retired.ok()) << retired.to_string();
  return *lease;
}

SlotState state_of(const StreamSlots& slots, uint32_t slot) {
  StatusOr<SlotState> state = slots.slot_state(slot);
  if (!state.ok()) {
    ADD_FAILURE() << state.status().to_string();
    return SlotState{};
  }
  return *state;
}

bool would_reuse(const StreamSlots& slots, uint32_t slot, uint64_t epoch, uint64_t image) {
  StatusOr<bool> reuse = slots.would_reuse(slot, epoch, image);
  EXPECT_TRUE(reuse.ok()) << reuse.status().to_string();
  return reuse.ok() && *reuse;
}

::testing::AssertionResult has_substr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

void expect_no_violations(const FakeStreams& fake) {
  for (const std::string& v : fake.violations()) ADD_FAILURE() << "fake device: " << v;
}

// The error of a begin that must fail (a failure is reported when it succeeds).
Status failed_begin(StreamSlots& slots, uint32_t slot, uint64_t epoch, uint64_t image) {
  StatusOr<SlotLease> lease = slots.begin(slot, epoch, image);
  if (lease.ok()) {
    ADD_FAILURE() << "begin on slot " << slot << " succeeded";
    return ok_status();
  }
  return lease.status();
}

// One slot whose stream ran at epoch 0, then a begin at epoch 1 (which must replace
// that stream, stale now) that fails because `inject` made the fake's next create or
// destroy fail.
struct FailedStaleBegin {
  explicit FailedStaleBegin(void (FakeStreams::*inject)(int)) {
    (fake.*inject)(1);
    failed = failed_begin(*slots, 0, 1, kImageA);
  }

  FakeStreams fake;
  std::unique_ptr<StreamSlots> slots = make_slots(fake, 1);
  StreamHandle old = run_once(*slots, fake, 0, 0, kImageA).stream;
  Status failed;
};

// ---------------------------------------------------------------------------
// Construction

TEST(StreamSlots, MakeValidatesConfiguration) {
  FakeStreams fake;

  auto zero = StreamSlots::make(fake.ops(), 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has_substr(zero.status().message(), "depth 0"));

  auto too_deep = StreamSlots::make(fake.ops(), StreamSlots::kMaxDepth + 1);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_EQ(too_deep.status().code(), StatusCode::kInvalidArgument);

  StreamOps no_create = fake.ops();
  no_create.create = nullptr;
  auto missing_create = StreamSlots::make(no_create);
  ASSERT_FALSE(missing_create.ok());
  EXPECT_TRUE(has_substr(missing_create.status().message(), "create"));

  StreamOps no_destroy = fake.ops();
  no_destroy.destroy = nullptr;
  auto missing_destroy = StreamSlots::make(no_destroy);
  ASSERT_FALSE(missing_destroy.ok());
  EXPECT_TRUE(has_substr(missing_destroy.status().message(), "destroy"));

  auto defaults = StreamSlots::make(fake.ops());
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ((*defaults)->depth(), 2u);
  EXPECT_EQ((*defaults)->policy(), ReusePolicy::kPublicationAware);
  EXPECT_EQ(fake.create_calls(), 0u);  // streams are made lazily, by begin()
}

TEST(StreamSlots, NamesOfPoliciesAndOutcomes) {
  EXPECT_EQ(reuse_policy_name(ReusePolicy::kPublicationAware), "publication-aware");
  EXPECT_EQ(reuse_policy_name(ReusePolicy::kNaiveLastImage), "naive-last-image");
  EXPECT_EQ(run_outcome_name(RunOutcome::kComplete), "complete");
  EXPECT_EQ(run_outcome_name(RunOutcome::kFailed), "failed");
  EXPECT_EQ(run_outcome_name(RunOutcome::kTimedOut), "timed out");
  EXPECT_EQ(run_outcome_name(RunOutcome::kAbandoned), "abandoned");
}

// ---------------------------------------------------------------------------
// Reuse and publication

TEST(StreamSlots, ReusesStreamWhileNothingIsPublished) {
  FakeStreams fake;
  auto slots = make_slots(fake);

  SlotLease first = run_once(*slots, fake, 0, /*epoch=*/7, /*image=*/0);
  EXPECT_TRUE(first.fresh_stream);
  for (uint64_t i = 1; i < 10; ++i) {
    // Different images each time: without a publication the image does not matter.
    SlotLease lease = run_once(*slots, fake, 0, 7, i);
    EXPECT_EQ(lease.stream, first.stream);
    EXPECT_FALSE(lease.fresh_stream);
  }

  EXPECT_EQ(fake.creates(), 1u);
  EXPECT_EQ(fake.destroy_calls(), 0u);
  StreamSlotStats stats = slots->stats();
  EXPECT_EQ(stats.streams_created, 1u);
  EXPECT_EQ(stats.reuse_hits, 9u);
  EXPECT_EQ(stats.stale_replacements, 0u);
  expect_no_violations(fake);
}

class StreamSlotsDepth : public ::testing::TestWithParam<uint32_t> {};

TEST_P(StreamSlotsDepth, ExactCreateCountsFirstRunSteadyStateAndPublication) {
  const uint32_t depth = GetParam();
  FakeStreams fake;
  auto slots = make_slots(fake, depth);

  // First run on each slot: one create per slot.
  for (uint32_t s = 0; s < depth; ++s) run_once(*slots, fake, s, 0, kImageA);
  EXPECT_EQ(fake.creates(), depth);

  // Steady state: 100 runs cycling over the slots create nothing.
  for (uint32_t i = 0; i < 100; ++i) {
    run_once(*slots, fake, i % depth, 0, i % 2 ? kImageA : kImageB);
  }
  EXPECT_EQ(fake.creates(), depth);
  EXPECT_EQ(fake.destroy_calls(), 0u);
  EXPECT_EQ(slots->stats().reuse_hits, 100u);

  // One publication: nothing happens until a slot is launched again...
  for (uint32_t s = 0; s < depth; ++s) EXPECT_FALSE(would_reuse(*slots, s, 1, kImageA));
  EXPECT_EQ(fake.creates(), depth);
  EXPECT_EQ(fake.destroy_calls(), 0u);

  // ...then each slot replaces its stream exactly once, at its next begin.
  for (uint32_t s = 0; s < depth; ++s) {
    SlotLease lease = run_once(*slots, fake, s, 1, kImageA);
    EXPECT_TRUE(lease.fresh_stream);
    EXPECT_EQ(fake.creates(), depth + s + 1);
    EXPECT_EQ(fake.destroys(), s + 1);
  }
  for (uint32_t i = 0; i < 100; ++i) run_once(*slots, fake, i % depth, 1, kImageB);
  EXPECT_EQ(fake.creates(), 2u * depth);
  EXPECT_EQ(fake.destroys(), depth);
  EXPECT_EQ(slots->stats().stale_replacements, depth);
  EXPECT_EQ(fake.live(), depth);
  expect_no_violations(fake);
}

INSTANTIATE_TEST_SUITE_P(Depths, StreamSlotsDepth, ::testing::Values(1u, 2u, 3u, 4u));

TEST(StreamSlots, PublicationInvalidatesEverySlot) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  StreamHandle old0 = run_once(*slots, fake, 0, 0, kImageA).stream;
  StreamHandle old1 = run_once(*slots, fake, 1, 0, kImageB).stream;
  ASSERT_EQ(fake.creates(), 2u);

  // Publication: epoch 0 -> 1.
  SlotLease new0 = run_once(*slots, fake, 0, 1, kImageA);
  SlotLease new1 = run_once(*slots, fake, 1, 1, kImageB);
  EXPECT_TRUE(new0.fresh_stream);
  EXPECT_TRUE(new1.fresh_stream);
  EXPECT_NE(new0.stream, old0);
  EXPECT_NE(new1.stream, old1);
  EXPECT_EQ(fake.destroyed_times(old0), 1);
  EXPECT_EQ(fake.destroyed_times(old1), 1);
  EXPECT_EQ(fake.creates(), 4u);

  // Each slot was replaced once; more runs at the new epoch reuse.
  for (int i = 0; i < 10; ++i) run_once(*slots, fake, i % 2, 1, kImageA);
  EXPECT_EQ(fake.creates(), 4u);
  EXPECT_EQ(fake.destroys(), 2u);
  EXPECT_EQ(slots->stats().stale_replacements, 2u);
  EXPECT_EQ(state_of(*slots, 0).stream_epoch, 1u);
  EXPECT_EQ(state_of(*slots, 1).stream_epoch, 1u);
  expect_no_violations(fake);
}

TEST(StreamSlots, PublicationDuringRunReplacesStreamOnlyAfterRetirement) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);

  StatusOr<SlotLease> running = slots->begin(0, 0, kImageA);
  ASSERT_TRUE(running.ok()) << running.status().to_string();
  fake.run_takes(running->stream);

  // While slot 0's run executes, image B is published (epoch 1) and runs on slot 1.
  for (int i = 0; i < 5; ++i) run_once(*slots, fake, 1, 1, kImageB);
  EXPECT_TRUE(fake.is_live(running->stream));
  EXPECT_EQ(fake.destroy_attempts(running->stream), 0);
  EXPECT_TRUE(state_of(*slots, 0).owned);
  EXPECT_EQ(state_of(*slots, 0).stream, running->stream);

  // Retiring complete does not destroy it either: replacement is lazy.
  fake.run_releases(running->stream);
  ASSERT_TRUE(slots->retire(*running, RunOutcome::kComplete).ok());
  EXPECT_TRUE(fake.is_live(running->stream));
  EXPECT_FALSE(would_reuse(*slots, 0, 1, kImageA));

  // The next launch on slot 0 replaces the stale stream.
  SlotLease next = run_once(*slots, fake, 0, 1, kImageA);
  EXPECT_TRUE(next.fresh_stream);
  EXPECT_NE(next.stream, running->stream);
  EXPECT_EQ(fake.destroyed_times(running->stream), 1);
  EXPECT_EQ(fake.creates(), 3u);  // slot 0 twice, slot 1 once
  expect_no_violations(fake);     // in particular: nothing destroyed while owned
}

TEST(StreamSlots, EpochThatWentBackwardsIsStale) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1);
  StreamHandle h = run_once(*slots, fake, 0, 5, kImageA).stream;
  EXPECT_FALSE(would_reuse(*slots, 0, 4, kImageA));
  SlotLease lease = run_once(*slots, fake, 0, 4, kImageA);
  EXPECT_TRUE(lease.fresh_stream);
  EXPECT_EQ(fake.destroyed_times(h), 1);
  EXPECT_EQ(fake.creates(), 2u);
}

// ---------------------------------------------------------------------------
// Only retirement proves a run

class StreamSlotsUnproven : public ::testing::TestWithParam<RunOutcome> {};

TEST_P(StreamSlotsUnproven, PolledCompleteThenRetiredUnprovenDestroysStream) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1);

  StatusOr<SlotLease> lease = slots->begin(0, 0, kImageA);
  ASSERT_TRUE(lease.ok());
  fake.run_takes(lease->stream);
  ASSERT_TRUE(slots->mark_polled_complete(*lease).ok());
  EXPECT_TRUE(state_of(*slots, 0).polled_complete);
  EXPECT_FALSE(state_of(*slots, 0).last_run_retired_complete);

  // Polled complete is not retired: the slot is still owned.
  const Status early = failed_begin(*slots, 0, 0, kImageA);
  ASSERT_EQ(early.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has_substr(early.message(), "stream slot 0 is owned"));

  // The executor then retires it unproven (it timed out or was abandoned after the
  // poll): the observed completion does not save the stream.
  fake.run_releases(lease->stream);
  ASSERT_TRUE(slots->retire(*lease, GetParam()).ok());
  EXPECT_FALSE(fake.is_live(lease->stream));
  EXPECT_EQ(fake.destroyed_times(lease->stream), 1);
  EXPECT_EQ(state_of(*slots, 0).stream, kNoStream);

  SlotLease next = run_once(*slots, fake, 0, 0, kImageA);
  EXPECT_TRUE(next.fresh_stream);
  EXPECT_EQ(fake.creates(), 2u);
  StreamSlotStats stats = slots->stats();
  EXPECT_EQ(stats.unproven_retirements, 1u);
  EXPECT_EQ(stats.stale_replacements, 0u);
  EXPECT_EQ(stats.reuse_hits, 0u);
  expect_no_violations(fake);
}

TEST_P(StreamSlotsUnproven, UnprovenRunDestroysStreamAtRetirement) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  run_once(*slots, fake, 1, 0, kImageB);  // a peer slot, left alone

  SlotLease lease = run_once(*slots, fake, 0, 0, kImageA, GetParam());
  // Destroyed by retire itself, before any further begin.
  EXPECT_FALSE(fake.is_live(lease.stream));
  EXPECT_EQ(fake.destroyed_times(lease.stream), 1);
  EXPECT_EQ(fake.destroys(), 1u);
  EXPECT_FALSE(would_reuse(*slots, 0, 0, kImageA));
  EXPECT_TRUE(would_reuse(*slots, 1, 0, kImageB));

  SlotLease next = run_once(*slots, fake, 0, 0, kImageA);
  EXPECT_TRUE(next.fresh_stream);
  EXPECT_EQ(fake.creates(), 3u);
  EXPECT_EQ(fake.destroys(), 1u);
  EXPECT_EQ(slots->stats().unproven_retirements, 1u);
  expect_no_violations(fake);
}

INSTANTIATE_TEST_SUITE_P(Outcomes, StreamSlotsUnproven,
                         ::testing::Values(RunOutcome::kFailed, RunOutcome::kTimedOut,
                                           RunOutcome::kAbandoned));

TEST(StreamSlots, PolledCompleteThenRetiredCompleteReuses) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1);
  StatusOr<SlotLease> lease = slots->begin(0, 0, kImageA);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(slots->mark_polled_complete(*lease).ok());
  ASSERT_TRUE(slots->retire(*lease, RunOutcome::kComplete).ok());
  SlotLease next = run_once(*slots, fake, 0, 0, kImageA);
  EXPECT_FALSE(next.fresh_stream);
  EXPECT_EQ(next.stream, lease->stream);
  EXPECT_EQ(fake.creates(), 1u);
  EXPECT_FALSE(state_of(*slots, 0).polled_complete);  // reset by the new run
}

// ---------------------------------------------------------------------------
// Failing creates and destroys

TEST(StreamSlots, FailedCreateSurfacesErrorAndSlotStaysUsable) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  fake.fail_next_creates(1);

  const Status failed = failed_begin(*slots, 1, 0, kImageA);
  ASSERT_EQ(failed.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(has_substr(failed.message(), "stream slot 1"));
  EXPECT_TRUE(has_substr(failed.message(), "fake: out of streams"));
  SlotState state = state_of(*slots, 1);
  EXPECT_FALSE(state.owned);
  EXPECT_EQ(state.stream, kNoStream);
  EXPECT_EQ(state.generation, 0u);
  EXPECT_EQ(slots->stats().create_failures, 1u);
  EXPECT_EQ(slots->stats().streams_created, 0u);

  SlotLease lease = run_once(*slots, fake, 1, 0, kImageA);
  EXPECT_TRUE(lease.fresh_stream);
  EXPECT_EQ(lease.generation, 1u);
  EXPECT_EQ(fake.creates(), 1u);
  EXPECT_EQ(fake.create_calls(), 2u);
  expect_no_violations(fake);
}

TEST(StreamSlots, FailedCreateAfterStaleDestroyLeavesEmptyUsableSlot) {
  FailedStaleBegin s(&FakeStreams::fail_next_creates);
  ASSERT_EQ(s.failed.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.fake.destroyed_times(s.old), 1);
  EXPECT_EQ(state_of(*s.slots, 0).stream, kNoStream);

  SlotLease lease = run_once(*s.slots, s.fake, 0, 1, kImageA);
  EXPECT_TRUE(lease.fresh_stream);
  EXPECT_EQ(s.fake.creates(), 2u);
  EXPECT_EQ(s.fake.destroys(), 1u);
  EXPECT_EQ(s.slots->stats().stale_replacements, 1u);
}

TEST(StreamSlots, CreateReturningNullHandleIsInternalError) {
  StreamOps ops{[]() -> StatusOr<StreamHandle> { return kNoStream; },
                [](StreamHandle) { return ok_status(); }};
  auto slots = StreamSlots::make(ops, 1);
  ASSERT_TRUE(slots.ok());
  StatusOr<SlotLease> lease = (*slots)->begin(0, 0, kImageA);
  ASSERT_FALSE(lease.ok());
  EXPECT_EQ(lease.status().code(), StatusCode::kInternal);
  EXPECT_FALSE(state_of(**slots, 0).owned);
  EXPECT_EQ((*slots)->stats().create_failures, 1u);
}

TEST(StreamSlots, FailedStaleDestroyKeepsHandleAndIsRetriedAtNextBegin) {
  FailedStaleBegin s(&FakeStreams::fail_next_destroys);
  FakeStreams& fake = s.fake;
  StreamSlots* slots = s.slots.get();
  const StreamHandle old = s.old;
  ASSERT_EQ(s.failed.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has_substr(s.failed.message(), "stream slot 0 is stranded"));
  EXPECT_TRUE(has_substr(s.failed.message(), std::to_string(old.value())));
  EXPECT_TRUE(has_substr(s.failed.message(), "DEVICE_FAULT: fake: stream"));

  // The handle is kept, marked stale, and nothing was created in its place.
  SlotState state = state_of(*slots, 0);
  EXPECT_EQ(state.stream, old);
  EXPECT_TRUE(state.pending_destroy);
  EXPECT_EQ(state.last_destroy_error.code(), StatusCode::kDeviceFault);
  EXPECT_FALSE(state.owned);
  EXPECT_FALSE(would_reuse(*slots, 0, 0, kImageA));  // stale even at its own epoch
  EXPECT_TRUE(fake.is_live(old));
  EXPECT_EQ(fake.creates(), 1u);
  EXPECT_EQ(slots->stats().destroy_failures, 1u);

  // The next begin retries the destroy, which now succeeds, exactly once.
  SlotLease lease = run_once(*slots, fake, 0, 1, kImageA);
  EXPECT_TRUE(lease.fresh_stream);
  EXPECT_NE(lease.stream, old);
  EXPECT_EQ(fake.destroy_attempts(old), 2);
  EXPECT_EQ(fake.destroyed_times(old), 1);
  EXPECT_FALSE(fake.is_live(old));
  EXPECT_EQ(fake.creates(), 2u);
  state = state_of(*slots, 0);
  EXPECT_FALSE(state.pending_destroy);
  EXPECT_TRUE(state.last_destroy_error.ok());
  StreamSlotStats stats = slots->stats();
  EXPECT_EQ(stats.stale_replacements, 1u);  // one stale stream, however many attempts
  EXPECT_EQ(stats.streams_destroyed, 1u);
  EXPECT_EQ(stats.destroy_failures, 1u);

  run_once(*slots, fake, 0, 1, kImageA);
  EXPECT_EQ(fake.destroy_attempts(old), 2);  // never touched again
  expect_no_violations(fake);
}

TEST(StreamSlots, FailedUnprovenDestroyIsRetriedByRetryPendingDestroys) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1);
  StatusOr<SlotLease> lease = slots->begin(0, 0, kImageA);
  ASSERT_TRUE(lease.ok());
  const StreamHandle h = lease->stream;
  fake.fail_destroys_of(h);

  // The run is retired even though its stream could not be destroyed.
  ASSERT_TRUE(slots->retire(*lease, RunOutcome::kFailed).ok());
  SlotState state = state_of(*slots, 0);
  EXPECT_FALSE(state.owned);
  EXPECT_EQ(state.stream, h);
  EXPECT_TRUE(state.pending_destroy);
  EXPECT_TRUE(fake.is_live(h));

  Status still = slots->retry_pending_destroys();
  EXPECT_EQ(still.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has_substr(still.message(), "stream slot 0 is stranded"));
  EXPECT_TRUE(has_substr(still.message(), std::to_string(h.value())));
  EXPECT_EQ(fake.destroy_attempts(h), 2);

  fake.stop_failing_destroys_of(h);
  EXPECT_TRUE(slots->retry_pending_destroys().ok());
  EXPECT_EQ(fake.destroyed_times(h), 1);
  EXPECT_EQ(state_of(*slots, 0).stream, kNoStream);
  EXPECT_FALSE(state_of(*slots, 0).pending_destroy);

  // Nothing left to retry; the next begin only creates.
  EXPECT_TRUE(slots->retry_pending_destroys().ok());
  SlotLease next = run_once(*slots, fake, 0, 0, kImageA);
  EXPECT_TRUE(next.fresh_stream);
  EXPECT_EQ(fake.destroy_attempts(h), 3);
  EXPECT_EQ(fake.destroy_calls(), 3u);
  EXPECT_EQ(fake.creates(), 2u);
  EXPECT_EQ(slots->stats().destroy_failures, 2u);
  expect_no_violations(fake);
}

TEST(StreamSlots, StrandedSlotDoesNotBlockItsPeer) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  const StreamHandle wedged = run_once(*slots, fake, 0, 0, kImageA).stream;
  const StreamHandle peer_old = run_once(*slots, fake, 1, 0, kImageB).stream;
  fake.fail_destroys_of(wedged);

  // Publication: slot 0 cannot get rid of its stale stream, again and again.
  for (int i = 0; i < 3; ++i) {
    const Status failed = failed_begin(*slots, 0, 1, kImageA);
    ASSERT_EQ(failed.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(has_substr(failed.message(), "stream slot 0 is stranded"));
    EXPECT_TRUE(has_substr(failed.message(), "is wedged"));
  }
  // Slot 1 replaces its own stale stream and keeps running, across another publication.
  SlotLease peer = run_once(*slots, fake, 1, 1, kImageB);
  EXPECT_TRUE(peer.fresh_stream);
  EXPECT_EQ(fake.destroyed_times(peer_old), 1);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(run_once(*slots, fake, 1, 1, kImageB).fresh_stream);
  EXPECT_TRUE(run_once(*slots, fake, 1, 2, kImageB).fresh_stream);
  EXPECT_EQ(fake.destroyed_times(peer.stream), 1);

  Status retry = slots->retry_pending_destroys();
  EXPECT_EQ(retry.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has_substr(retry.message(), "stream slot 0"));
  EXPECT_FALSE(has_substr(retry.message(), "stream slot 1"));
  EXPECT_TRUE(state_of(*slots, 0).pending_destroy);
  EXPECT_EQ(state_of(*slots, 0).stream, wedged);

  // Once the device lets go, slot 0 recovers at its next begin.
  fake.stop_failing_destroys_of(wedged);
  SlotLease recovered = run_once(*slots, fake, 0, 2, kImageA);
  EXPECT_TRUE(recovered.fresh_stream);
  EXPECT_EQ(fake.destroyed_times(wedged), 1);
  EXPECT_EQ(fake.destroy_attempts(wedged), 5);  // 3 begins + 1 retry failed, 1 succeeded
  EXPECT_EQ(slots->stats().destroy_failures, 4u);
  EXPECT_EQ(fake.creates(), 5u);  // slot 0: 2, slot 1: 3
  EXPECT_EQ(fake.live(), 2u);
  expect_no_violations(fake);
}

// ---------------------------------------------------------------------------
// Device reset and leases

TEST(StreamSlots, AbandonAllForgetsHandlesWithoutDestroyingAndStalesLeases) {
  FakeStreams fake;
  auto slots = make_slots(fake, 3);

  StatusOr<SlotLease> running = slots->begin(0, 0, kImageA);  // owned by a run
  ASSERT_TRUE(running.ok());
  run_once(*slots, fake, 1, 0, kImageA);                        // idle with a stream
  StatusOr<SlotLease> doomed = slots->begin(2, 0, kImageB);   // pending destroy
  ASSERT_TRUE(doomed.ok());
  fake.fail_destroys_of(doomed->stream);
  ASSERT_TRUE(slots->retire(*doomed, RunOutcome::kFailed).ok());
  ASSERT_TRUE(state_of(*slots, 2).pending_destroy);
  const uint64_t destroy_calls_before = fake.destroy_calls();

  slots->abandon_all();

  EXPECT_EQ(fake.destroy_calls(), destroy_calls_before);  // the device is gone
  EXPECT_EQ(fake.live(), 3u);
  EXPECT_EQ(slots->stats().streams_abandoned, 3u);
  for (uint32_t s = 0; s < 3; ++s) {
    SlotState state = state_of(*slots, s);
    EXPECT_FALSE(state.owned);
    EXPECT_EQ(state.stream, kNoStream);
    EXPECT_FALSE(state.pending_destroy);
    EXPECT_EQ(state.generation, 2u);  // one begin, one reset
  }

  Status retired = slots->retire(*running, RunOutcome::kComplete);
  EXPECT_EQ(retired.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(has_substr(retired.message(), "stale lease for stream slot 0"));
  EXPECT_TRUE(has_substr(retired.message(), "lease generation 1, slot generation 2"));
  EXPECT_EQ(slots->mark_polled_complete(*running).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(slots->stats().stale_leases_rejected, 2u);

  // Nothing pending survives the reset; every slot starts over with a fresh stream.
  EXPECT_TRUE(slots->retry_pending_destroys().ok());
  for (uint32_t s = 0; s < 3; ++s) {
    SlotLease lease = run_once(*slots, fake, s, 0, kImageA);
    EXPECT_TRUE(lease.fresh_stream);
    EXPECT_EQ(lease.generation, 3u);
  }
  EXPECT_EQ(fake.destroy_calls(), destroy_calls_before);
  EXPECT_EQ(fake.creates(), 6u);
  expect_no_violations(fake);
}

TEST(StreamSlots, StaleLeasesAreRejectedAndChangeNothing) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);

  SlotLease retired_once = run_once(*slots, fake, 1, 0, kImageA);
  Status twice = slots->retire(retired_once, RunOutcome::kComplete);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(twice.message(),
            "retire: stale lease for stream slot 1: lease generation 1, slot generation 1 "
            "(the slot is not owned by a run)");
  // A stale failure report must not destroy the stream the slot keeps.
  EXPECT_EQ(slots->retire(retired_once, RunOutcome::kFailed).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fake.is_live(retired_once.stream));

  StatusOr<SlotLease> current = slots->begin(1, 0, kImageA);
  ASSERT_TRUE(current.ok());
  Status old = slots->retire(retired_once, RunOutcome::kAbandoned);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(),
            "retire: stale lease for stream slot 1: lease generation 1, slot generation 2");
  EXPECT_EQ(slots->mark_polled_complete(retired_once).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(state_of(*slots, 1).owned);  // the current run keeps its slot
  EXPECT_FALSE(state_of(*slots, 1).polled_complete);

  SlotLease out_of_range = *current;
  out_of_range.slot = 2;
  Status range = slots->retire(out_of_range, RunOutcome::kComplete);
  EXPECT_EQ(range.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(has_substr(range.message(), "stream slot 2 out of range: depth is 2"));

  SlotLease forged = *current;
  forged.stream = StreamHandle(current->stream.value() + 1000);
  EXPECT_EQ(slots->retire(forged, RunOutcome::kFailed).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(fake.is_live(current->stream));

  EXPECT_TRUE(slots->retire(*current, RunOutcome::kComplete).ok());
  EXPECT_EQ(slots->stats().stale_leases_rejected, 4u);
  EXPECT_EQ(fake.destroy_calls(), 0u);
  expect_no_violations(fake);
}

TEST(StreamSlots, BeginRejectsOwnedAndOutOfRangeSlots) {
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  StatusOr<SlotLease> first = slots->begin(0, 0, kImageA);
  ASSERT_TRUE(first.ok());

  const Status second = failed_begin(*slots, 0, 0, kImageA);
  ASSERT_EQ(second.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.message(), "begin: stream slot 0 is owned by an unretired run (generation 1)");
  EXPECT_TRUE(slots->retire(*first, RunOutcome::kComplete).ok());  // still valid

  const Status beyond = failed_begin(*slots, 2, 0, kImageA);
  ASSERT_EQ(beyond.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(beyond.message(), "begin: stream slot 2 out of range: depth is 2");
  EXPECT_EQ(slots->slot_state(2).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(slots->would_reuse(2, 0, kImageA).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(fake.creates(), 1u);
}

TEST(StreamSlots, DestructorDestroysEveryHeldStreamBestEffort) {
  FakeStreams fake;
  auto slots = make_slots(fake, 3);
  StreamHandle idle = run_once(*slots, fake, 0, 0, kImageA).stream;
  StatusOr<SlotLease> unretired = slots->begin(1, 0, kImageA);
  ASSERT_TRUE(unretired.ok());
  StatusOr<SlotLease> doomed = slots->begin(2, 0, kImageA);
  ASSERT_TRUE(doomed.ok());
  fake.fail_destroys_of(doomed->stream);
  ASSERT_TRUE(slots->retire(*doomed, RunOutcome::kTimedOut).ok());

  slots.reset();

  EXPECT_EQ(fake.destroyed_times(idle), 1);
  EXPECT_EQ(fake.destroyed_times(unretired->stream), 1);
  EXPECT_EQ(fake.destroy_attempts(doomed->stream), 2);  // at retire, and once more here
  EXPECT_EQ(fake.live(), 1u);
  expect_no_violations(fake);
}

// ---------------------------------------------------------------------------
// The naive policy: wrong on purpose

// slot 0 runs A; B is published and runs on slot 1; A is published again and runs on
// slot 0, as `again`.
struct ABAAcrossTwoSlots {
  explicit ABAAcrossTwoSlots(ReusePolicy policy) : slots(make_slots(fake, 2, policy)) {
    first_a = run_once(*slots, fake, 0, /*epoch=*/0, kImageA).stream;
    run_once(*slots, fake, 1, /*epoch=*/1, kImageB);
    again = run_once(*slots, fake, 0, /*epoch=*/2, kImageA);
  }

  FakeStreams fake;
  std::unique_ptr<StreamSlots> slots;
  StreamHandle first_a = kNoStream;
  SlotLease again;
};

TEST(StreamSlotsNaivePolicy, ReusesStaleStreamAcrossABA) {
  ABAAcrossTwoSlots aba(ReusePolicy::kNaiveLastImage);
  // The bug: slot 0 "remembers" A and launches on a stream created before B and the
  // re-publication of A.
  EXPECT_FALSE(aba.again.fresh_stream);
  EXPECT_EQ(aba.again.stream, aba.first_a);
  EXPECT_EQ(aba.fake.creates(), 2u);
  EXPECT_EQ(aba.fake.destroy_calls(), 0u);
}

TEST(StreamSlotsPublicationAwarePolicy, RecreatesStreamAcrossABA) {
  ABAAcrossTwoSlots aba(ReusePolicy::kPublicationAware);
  EXPECT_TRUE(aba.again.fresh_stream);
  EXPECT_NE(aba.again.stream, aba.first_a);
  EXPECT_EQ(aba.fake.destroyed_times(aba.first_a), 1);
  EXPECT_EQ(aba.fake.creates(), 3u);
}

// Two resident images alternate on one slot; nothing is published.
uint64_t creates_for_alternating_images(ReusePolicy policy) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1, policy);
  for (int i = 0; i < 10; ++i) run_once(*slots, fake, 0, 0, i % 2 ? kImageB : kImageA);
  expect_no_violations(fake);
  EXPECT_EQ(fake.creates() - fake.destroys(), 1u);
  return fake.creates();
}

TEST(StreamSlotsNaivePolicy, RecreatesNeedlesslyWhenImagesAlternate) {
  EXPECT_EQ(creates_for_alternating_images(ReusePolicy::kNaiveLastImage), 10u);
}

TEST(StreamSlotsPublicationAwarePolicy, KeepsStreamWhenImagesAlternate) {
  EXPECT_EQ(creates_for_alternating_images(ReusePolicy::kPublicationAware), 1u);
}

TEST(StreamSlotsNaivePolicy, StillDestroysStreamsOfUnprovenRuns) {
  FakeStreams fake;
  auto slots = make_slots(fake, 1, ReusePolicy::kNaiveLastImage);
  SlotLease failed = run_once(*slots, fake, 0, 0, kImageA, RunOutcome::kFailed);
  EXPECT_EQ(fake.destroyed_times(failed.stream), 1);
  EXPECT_TRUE(run_once(*slots, fake, 0, 0, kImageA).fresh_stream);
  EXPECT_FALSE(run_once(*slots, fake, 0, 5, kImageA).fresh_stream);  // ignores epochs
  EXPECT_EQ(fake.creates(), 2u);
}

// ---------------------------------------------------------------------------
// Concurrency: a submitter-like and a retirer-like thread per slot

size_t held_streams(const StreamSlots& slots) {
  size_t held = 0;
  for (uint32_t s = 0; s < slots.depth(); ++s) held += state_of(slots, s).stream != kNoStream;
  return held;
}

RunOutcome outcome_for(int i) {
  if (i % 89 == 5) return RunOutcome::kFailed;
  if (i % 211 == 7) return RunOutcome::kTimedOut;
  if (i % 307 == 11) return RunOutcome::kAbandoned;
  return RunOutcome::kComplete;
}

TEST(StreamSlotsConcurrency, TwoThreadsOnSeparateSlotsKeepInvariants) {
  constexpr int kIterations = 10000;
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  std::atomic<uint64_t> epoch{0};
  std::atomic<uint64_t> publications{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> done{false};

  auto runner = [&](uint32_t slot) {
    for (int i = 0; i < kIterations; ++i) {
      StatusOr<SlotLease> lease = slots->begin(slot, epoch.load(), i % 3);
      if (!lease.ok()) {
        ++errors;
        continue;
      }
      fake.run_takes(lease->stream);
      if (i % 97 == static_cast<int>(13 * slot)) {  // a publication while the run executes
        epoch.fetch_add(1);
        ++publications;
      }
      if (i % 2 == 0 && !slots->mark_polled_complete(*lease).ok()) ++errors;
      fake.run_releases(lease->stream);
      if (!slots->retire(*lease, outcome_for(i)).ok()) ++errors;
    }
  };
  // Readers of the introspection API race with both runners.
  auto observer = [&] {
    while (!done.load()) {
      StreamSlotStats stats = slots->stats();
      // Snapshots hold whole operations only.
      EXPECT_LE(stats.streams_destroyed, stats.streams_created);
      EXPECT_EQ(stats.streams_destroyed, stats.stale_replacements + stats.unproven_retirements);
      for (uint32_t s = 0; s < 2; ++s) {
        SlotState state = state_of(*slots, s);
        if (state.owned) {
          EXPECT_NE(state.stream, kNoStream);
        }
        would_reuse(*slots, s, epoch.load(), 0);
      }
    }
  };
  std::thread observer_thread(observer);
  std::thread slot0(runner, 0);
  std::thread slot1(runner, 1);
  slot0.join();
  slot1.join();
  done = true;
  observer_thread.join();

  EXPECT_EQ(errors.load(), 0u);
  expect_no_violations(fake);  // no destroy while owned, no double destroy
  StreamSlotStats stats = slots->stats();
  EXPECT_EQ(stats.streams_created, fake.creates());
  EXPECT_EQ(stats.streams_destroyed, fake.destroys());
  EXPECT_EQ(fake.creates() - fake.destroys(), fake.live());
  EXPECT_EQ(fake.live(), held_streams(*slots));
  EXPECT_EQ(stats.reuse_hits + stats.streams_created, 2u * kIterations);
  // Every destroy was either a stale replacement or an unproven run.
  EXPECT_EQ(stats.streams_destroyed, stats.stale_replacements + stats.unproven_retirements);
  // A slot replaces a stream at most once per publication.
  EXPECT_LE(stats.stale_replacements, 2u * publications.load());
  EXPECT_GT(stats.stale_replacements, 0u);
  EXPECT_GT(stats.reuse_hits, 0u);
}

TEST(StreamSlotsConcurrency, AbandonAllRacingWithRunsKeepsAccounting) {
  constexpr int kIterations = 5000;
  constexpr int kResets = 20;
  FakeStreams fake;
  auto slots = make_slots(fake, 2);
  std::atomic<uint64_t> epoch{0};
  std::atomic<uint64_t> begin_errors{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> other_errors{0};
  std::atomic<bool> resets_done{false};
  std::atomic<uint64_t> begins[2] = {0, 0};

  auto count = [&](const Status& s) {
    if (s.ok()) return;
    if (s.code() == StatusCode::kFailedPrecondition) {
      ++rejected;
    } else {
      ++other_errors;
    }
  };
  auto runner = [&](uint32_t slot) {
    for (int i = 0; i < kIterations || !resets_done.load(); ++i) {
      StatusOr<SlotLease> lease = slots->begin(slot, epoch.load(), 0);
      if (!lease.ok()) {
        ++begin_errors;
        continue;
      }
      ++begins[slot];
      fake.run_takes(lease->stream);
      if (i % 500 == static_cast<int>(slot)) epoch.fetch_add(1);
      count(slots->mark_polled_complete(*lease));
      fake.run_releases(lease->stream);
      count(slots->retire(*lease, outcome_for(i)));
    }
  };
  std::thread slot0(runner, 0);
  std::thread slot1(runner, 1);
  // Resets must race with running slots, not with thread start-up on a loaded machine.
  while (begins[0].load() == 0 || begins[1].load() == 0) std::this_thread::yield();
  for (int r = 0; r < kResets; ++r) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    slots->abandon_all();
  }
  resets_done = true;
  slot0.join();
  slot1.join();

  EXPECT_EQ(begin_errors.load(), 0u);
  EXPECT_EQ(other_errors.load(), 0u);
  expect_no_violations(fake);
  StreamSlotStats stats = slots->stats();
  EXPECT_EQ(stats.stale_leases_rejected, rejected.load());
  EXPECT_GT(stats.streams_abandoned, 0u);
  EXPECT_EQ(stats.streams_created, fake.creates());
  EXPECT_EQ(stats.streams_destroyed, fake.destroys());
  EXPECT_EQ(fake.creates() - fake.destroys(), fake.live());
  // Every stream ever created is destroyed, held, or was forgotten by a reset.
  EXPECT_EQ(fake.live(), held_streams(*slots) + stats.streams_abandoned);
  for (uint32_t s = 0; s < 2; ++s) {
    SlotState state = state_of(*slots, s);
    EXPECT_EQ(state.generation, begins[s].load() + kResets);
    EXPECT_FALSE(state.owned);
  }
}

}  // namespace
}  // namespace npurt::exec
