// The simulated NPU's fault injection (sim_device.h) and the HAL's abort_stream and
// reset: every site fails when planned, errors name the fault, the device stays
// usable, and a hung kernel ends only when its stream is aborted.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "hal/sim_test_util.h"
#include "npurt/hal/sim/sim_device.h"

namespace npurt::testing {
namespace {

using hal::FaultPlan;
using hal::FaultSite;
using hal::ScriptedFault;

constexpr uint32_t kN = 256;  // floats: 4 blocks of the elementwise kernel

struct FaultRig {
  std::shared_ptr<hal::Device> dev = make_sim({.num_cores = 4});
  hal::DeviceAddr add{}, x{}, y{}, out{};
  std::vector<float> hx = random_floats(kN, 1), hy = random_floats(kN, 2);

  FaultRig() {
    auto k = elementwise_kernel("add", isa::BinOp::kAdd);
    EXPECT_TRUE(k.ok());
    add = upload(*dev, *k);
    x = *dev->allocate(kN * 4);
    y = *dev->allocate(kN * 4);
    out = *dev->allocate(kN * 4);
  }

  // Uploads x and y, adds them and reads the sum back on a fresh stream.
  Status add_once(std::vector<float>* result) {
    NPURT_ASSIGN_OR_RETURN(hal::StreamId s, dev->create_stream());
    result->assign(kN, -1.f);
    Status st = dev->copy_to_device(s, x, hx.data(), kN * 4);
    if (st.ok()) st = dev->copy_to_device(s, y, hy.data(), kN * 4);
    if (st.ok()) {
      st = dev->launch(s, {add, kN / 64,
                           {hal::KernelArg::buffer(x, kN * 4), hal::KernelArg::buffer(y, kN * 4),
                            hal::KernelArg::buffer(out, kN * 4)}});
    }
    if (st.ok()) st = dev->copy_to_host(s, result->data(), out, kN * 4);
    if (st.ok()) st = dev->stream_synchronize(s);
    dev->destroy_stream(s).ignore();
    return st;
  }

  bool sum_is_right(const std::vector<float>& r) const {
    for (uint32_t i = 0; i < kN; ++i) {
      if (r[i] != hx[i] + hy[i]) return false;
    }
    return true;
  }
};

Status plan(hal::Device& dev, ScriptedFault f) { return dev.set_fault_plan(FaultPlan{}.fail(f)); }

class EachStreamSite : public ::testing::TestWithParam<FaultSite> {};

// Copies and kernels fail on the stream: the error names the fault, and the same
// work succeeds once the plan is off.
TEST_P(EachStreamSite, FailsTheStreamNamesTheFaultAndTheDeviceStaysUsable) {
  FaultRig rig;
  NPURT_ASSERT_OK(plan(*rig.dev, {.site = GetParam(), .nth = 1, .block = 2, .instruction = 5}));
  std::vector<float> r;
  Status s = rig.add_once(&r);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
  EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << s.to_string();
  auto log = rig.dev->take_fault_log();
  ASSERT_TRUE(log.ok());
  ASSERT_EQ(log->size(), 1u);
  EXPECT_EQ((*log)[0].site, GetParam());
  EXPECT_TRUE(contains(s, "#" + std::to_string((*log)[0].id))) << s.to_string();
  EXPECT_EQ(rig.dev->counters().faults_injected, 1u);

  NPURT_ASSERT_OK(rig.dev->set_fault_plan({}));
  NPURT_ASSERT_OK(rig.add_once(&r));
  EXPECT_TRUE(rig.sum_is_right(r));
}

INSTANTIATE_TEST_SUITE_P(Sites, EachStreamSite,
                         ::testing::Values(FaultSite::kCopyToDevice, FaultSite::kCopyToHost, FaultSite::kKernel),
                         [](const auto& info) { return std::to_string(static_cast<int>(info.param)); });

TEST(FaultInjection, AKernelFaultsAtTheChosenBlockAndInstructionAndLeavesGarbage) {
  FaultRig rig;
  NPURT_ASSERT_OK(plan(*rig.dev, {.site = FaultSite::kKernel, .nth = 1, .block = 3, .instruction = 7}));
  std::vector<float> r;
  Status s = rig.add_once(&r);
  EXPECT_TRUE(contains(s, "block 3")) << s.to_string();
  EXPECT_TRUE(contains(s, "after 7 instructions")) << s.to_string();
  // The output is not left looking right.
  std::vector<float> seen(kN);
  auto st = *rig.dev->create_stream();
  NPURT_ASSERT_OK(rig.dev->copy_to_host(st, seen.data(), rig.out, kN * 4));
  NPURT_ASSERT_OK(rig.dev->stream_synchronize(st));
  EXPECT_FALSE(rig.sum_is_right(seen));
  NPURT_ASSERT_OK(rig.dev->destroy_stream(st));
}

TEST(FaultInjection, CallSitesReturnErrorsAndAFailedDestroyKeepsTheStream) {
  FaultRig rig;
  FaultPlan p;
  p.fail({.site = FaultSite::kAllocate, .nth = 1})
      .fail({.site = FaultSite::kCreateStream, .nth = 1})
      .fail({.site = FaultSite::kDestroyStream, .nth = 1})
      .fail({.site = FaultSite::kRecordEvent, .nth = 1});
  NPURT_ASSERT_OK(rig.dev->set_fault_plan(p));
  auto a = rig.dev->allocate(4096);
  EXPECT_EQ(a.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(a.status(), "injected fault #"));
  EXPECT_TRUE(rig.dev->allocate(4096).ok());  // the 2nd allocation is not planned to fail
  EXPECT_FALSE(rig.dev->create_stream().ok());
  auto s = rig.dev->create_stream();
  ASSERT_TRUE(s.ok());
  auto e = rig.dev->create_event();
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(contains(rig.dev->record_event(*s, *e), "record_event"));
  NPURT_ASSERT_OK(rig.dev->record_event(*s, *e));
  const auto before = rig.dev->counters();
  EXPECT_FALSE(rig.dev->destroy_stream(*s).ok());
  NPURT_ASSERT_OK(rig.dev->stream_synchronize(*s));  // still alive and usable
  NPURT_ASSERT_OK(rig.dev->destroy_stream(*s));      // the retry works
  EXPECT_EQ(rig.dev->counters().streams_destroyed - before.streams_destroyed, 1u);
  auto stats = rig.dev->fault_stats();
  ASSERT_TRUE(stats.ok());
  for (FaultSite site : {FaultSite::kAllocate, FaultSite::kCreateStream, FaultSite::kDestroyStream,
                         FaultSite::kRecordEvent}) {
    EXPECT_EQ(stats->injected[static_cast<size_t>(site)], 1u) << hal::fault_site_name(site);
  }
  NPURT_ASSERT_OK(rig.dev->destroy_event(*e));
}

// The n-th operation's fate depends on the seed alone: two devices given the same
// plan and the same work fail the same operations.
TEST(FaultInjection, RatesAreSeededAndReproducible) {
  auto pattern = [](uint64_t seed) {
    FaultRig rig;
    EXPECT_TRUE(rig.dev->set_fault_plan(FaultPlan{.seed = seed, .rate = {}, .script = {}}.with_rate(FaultSite::kCopyToDevice, 0.3)).ok());
    std::string fails;
    std::vector<float> r;
    for (int i = 0; i < 40; ++i) fails += rig.add_once(&r).ok() ? '.' : 'x';
    return fails;
  };
  const std::string a = pattern(7);
  EXPECT_EQ(a, pattern(7));
  EXPECT_NE(a, pattern(8));
  EXPECT_NE(a.find('x'), std::string::npos);
  EXPECT_NE(a.find('.'), std::string::npos);
}

TEST(FaultInjection, BadPlansAreRefusedByName) {
  auto dev = make_sim();
  EXPECT_TRUE(contains(dev->set_fault_plan(FaultPlan{}.with_rate(FaultSite::kAllocate, 1.5)), "allocate"));
  EXPECT_TRUE(contains(dev->set_fault_plan(FaultPlan{}.fail({.site = FaultSite::kKernel, .nth = 0})),
                       "nth 0"));
}

// A hung kernel holds its stream until abort_stream; the stream then reports
// kAborted, and a fresh stream runs the same work.
TEST(FaultInjection, AHungKernelEndsWhenItsStreamIsAborted) {
  FaultRig rig;
  NPURT_ASSERT_OK(plan(*rig.dev, {.site = FaultSite::kKernelHang, .nth = 1, .block = 1, .instruction = 3}));
  auto s = *rig.dev->create_stream();
  NPURT_ASSERT_OK(rig.dev->launch(s, {rig.add, kN / 64,
                                      {hal::KernelArg::buffer(rig.x, kN * 4), hal::KernelArg::buffer(rig.y, kN * 4),
                                       hal::KernelArg::buffer(rig.out, kN * 4)}}));
  auto e = *rig.dev->create_event();
  NPURT_ASSERT_OK(rig.dev->record_event(s, e));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto q = rig.dev->stream_query(s);
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(*q);  // still spinning
  NPURT_ASSERT_OK(rig.dev->abort_stream(s));
  Status st = rig.dev->stream_synchronize(s);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.to_string();
  EXPECT_TRUE(contains(st, "hung")) << st.to_string();
  EXPECT_EQ(rig.dev->event_synchronize(e).code(), StatusCode::kAborted);
  EXPECT_FALSE(rig.dev->launch(s, {rig.add, 1, {}}).ok());  // in error: replace it
  NPURT_ASSERT_OK(rig.dev->destroy_stream(s));
  NPURT_ASSERT_OK(rig.dev->destroy_event(e));
  std::vector<float> r;
  NPURT_ASSERT_OK(rig.add_once(&r));
  EXPECT_TRUE(rig.sum_is_right(r));
  EXPECT_EQ(rig.dev->counters().streams_aborted, 1u);
}

// A reset aborts every stream, including one waiting for another's event, and
// keeps memory: bytes written before it are still there.
TEST(FaultInjection, AResetAbortsEveryStreamAndKeepsMemory) {
  FaultRig rig;
  auto s1 = *rig.dev->create_stream();
  auto s2 = *rig.dev->create_stream();
  NPURT_ASSERT_OK(rig.dev->copy_to_device(s1, rig.x, rig.hx.data(), kN * 4));
  NPURT_ASSERT_OK(rig.dev->stream_synchronize(s1));
  NPURT_ASSERT_OK(plan(*rig.dev, {.site = FaultSite::kKernelHang, .nth = 1}));
  NPURT_ASSERT_OK(rig.dev->launch(s1, {rig.add, kN / 64,
                                       {hal::KernelArg::buffer(rig.x, kN * 4), hal::KernelArg::buffer(rig.y, kN * 4),
                                        hal::KernelArg::buffer(rig.out, kN * 4)}}));
  auto e = *rig.dev->create_event();
  NPURT_ASSERT_OK(rig.dev->record_event(s1, e));
  NPURT_ASSERT_OK(rig.dev->wait_event(s2, e));
  auto waiter = std::async(std::launch::async, [&] { return rig.dev->stream_synchronize(s2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  NPURT_ASSERT_OK(rig.dev->reset());
  EXPECT_EQ(rig.dev->stream_synchronize(s1).code(), StatusCode::kAborted);
  EXPECT_FALSE(waiter.get().ok());
  EXPECT_EQ(rig.dev->counters().resets, 1u);
  EXPECT_EQ(rig.dev->counters().streams_aborted, 2u);
  NPURT_ASSERT_OK(rig.dev->destroy_stream(s1));
  NPURT_ASSERT_OK(rig.dev->destroy_stream(s2));
  NPURT_ASSERT_OK(rig.dev->destroy_event(e));
  auto s = *rig.dev->create_stream();
  std::vector<float> back(kN);
  NPURT_ASSERT_OK(rig.dev->copy_to_host(s, back.data(), rig.x, kN * 4));
  NPURT_ASSERT_OK(rig.dev->stream_synchronize(s));
  EXPECT_EQ(back, rig.hx);
  NPURT_ASSERT_OK(rig.dev->destroy_stream(s));
}

}  // namespace
}  // namespace npurt::testing
