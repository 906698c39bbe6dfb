// Compiled sequences under device faults: whichever upload, kernel or event record
// of a call fails, the call fails by name and the next calls return the right result,
// shared weights included (memory_context.h, "Faults").
#include <gtest/gtest.h>

#include <memory>

#include "hal/sim_test_util.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/ops/elementwise.h"

namespace npurt::graph {
namespace {

using hal::FaultPlan;
using hal::FaultSite;
using namespace npurt::testing;

constexpr uint64_t kN = 256;

struct Params {
  Dispatch dispatch;
  FaultSite site;
  uint64_t nth;
};

class SequenceFaults : public ::testing::TestWithParam<Params> {};

// out = (x + w1) + w2 with shared weights; h is an intermediate.
TEST_P(SequenceFaults, AFailedCallIsNamedAndTheNextCallsAreRight) {
  const Params p = GetParam();
  auto rt = Runtime::create(make_sim({.num_cores = 4})).value();
  MemoryContext& mem = rt->memory();
  const auto hw1 = random_floats(kN, 1), hw2 = random_floats(kN, 2);
  auto weight = [&](const std::vector<float>& v) {
    Buffer b = mem.create_buffer(kN * 4).value();
    auto g = mem.overwrite(b.view()).value();
    std::copy(v.begin(), v.end(), g.as<float>().begin());
    return b;
  };
  Buffer w1 = weight(hw1), w2 = weight(hw2);
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = kN});
  OperatorSequence seq("two adds", {{add, {"x", "w1", "h"}}, {add, {"h", "w2", "out"}}}, {"x"}, {"out"},
                       {{"w1", kN}, {"w2", kN}, {"x", kN}, {"h", kN}, {"out", kN}}, p.dispatch);
  CompileOptions co;
  co.shared.emplace("w1", w1.view());
  co.shared.emplace("w2", w2.view());
  auto compiled = seq.compile(*rt, co);
  ASSERT_TRUE(compiled.ok()) << compiled.status().to_string();
  CompiledSequence& c = **compiled;

  ASSERT_TRUE(rt->device().set_fault_plan(FaultPlan{}.fail({.site = p.site, .nth = p.nth})).ok());
  bool failed_once = false;
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const auto hx = random_floats(kN, 10 + call);
    {
      auto g = mem.overwrite(c.get_buffer("x").value()).value();
      std::copy(hx.begin(), hx.end(), g.as<float>().begin());
    }
    Status s = c.call();
    if (!s.ok()) {
      EXPECT_TRUE(contains(s, "injected fault #")) << s.to_string();
      failed_once = true;
      continue;
    }
    auto out = mem.read(c.get_buffer("out").value());
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(out->as<float>()[i], (hx[i] + hw1[i]) + hw2[i]) << "element " << i;
  }
  EXPECT_TRUE(failed_once);
  auto stats = rt->device().fault_stats();
  EXPECT_EQ(stats->injected[static_cast<size_t>(p.site)], 1u);
}

std::vector<Params> all_params() {
  std::vector<Params> out;
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    for (uint64_t nth : {1, 2, 3}) out.push_back({d, FaultSite::kCopyToDevice, nth});
    out.push_back({d, FaultSite::kKernel, 1});
    out.push_back({d, FaultSite::kRecordEvent, 1});
  }
  out.push_back({Dispatch::kSeparate, FaultSite::kKernel, 2});
  out.push_back({Dispatch::kSeparate, FaultSite::kRecordEvent, 2});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, SequenceFaults, ::testing::ValuesIn(all_params()), [](const auto& info) {
  const Params& p = info.param;
  std::string site(hal::fault_site_name(p.site));
  for (char& ch : site) ch = ch == ' ' ? '_' : ch;
  return std::string(p.dispatch == Dispatch::kFused ? "fused_" : "separate_") + site + "_" + std::to_string(p.nth);
});

}  // namespace
}  // namespace npurt::graph
