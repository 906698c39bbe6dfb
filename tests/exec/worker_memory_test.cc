// The Worker driving coherent launches: runs bind MemoryContext views on the stream
// the Worker hands them, so pipelined runs are both free of stale instructions and
// of stale data.
#include <gtest/gtest.h>

#include <vector>

#include "hal/sim_test_util.h"
#include "npurt/exec/worker.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"

namespace npurt::exec {
namespace {

using npurt::testing::random_floats;

constexpr size_t kN = 64 * 8;  // one 64-element tile per block, grid 8
constexpr uint64_t kBytes = kN * sizeof(float);

struct Rig {
  std::shared_ptr<Runtime> runtime = Runtime::create(npurt::testing::make_sim()).value();
  MemoryContext* memory = &runtime->memory();
  isa::Image image = npurt::testing::elementwise_kernel("add", isa::BinOp::kAdd).value();
  CodeHandle code = runtime->registry().register_image(image).value();
  std::shared_ptr<Worker> worker = runtime->make_worker().value();

  Buffer buffer() { return memory->create_buffer(kBytes).value(); }

  void write(const Buffer& b, const std::vector<float>& v) {
    auto guard = memory->overwrite(b.view());
    ASSERT_TRUE(guard.ok()) << guard.status().to_string();
    std::copy(v.begin(), v.end(), guard->as<float>().begin());
  }

  std::vector<float> read(const Buffer& b) {
    auto guard = memory->read(b.view());
    EXPECT_TRUE(guard.ok()) << guard.status().to_string();
    if (!guard.ok()) return {};
    auto span = guard->as<float>();
    return {span.begin(), span.end()};
  }

  RunHandle add(const Buffer& x, const Buffer& y, const Buffer& out) {
    std::vector<LaunchArg> args = {x.view(), y.view(), out.view()};
    return worker->submit(
        [this, args](RunContext& ctx) {
          return memory->launch(ctx.stream(), code, 8, args);
        },
        {code});
  }
};

void expect_sum(const std::vector<float>& out, const std::vector<float>& x, const std::vector<float>& y) {
  ASSERT_EQ(out.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(out[i], x[i] + y[i]) << "element " << i;
}

TEST(WorkerWithMemory, LoopedRunsWithHostReadsReturnEachCallsOutputAndKeepWeightsResident) {
  Rig rig;
  Buffer x = rig.buffer(), weights = rig.buffer(), out = rig.buffer();
  const auto w = random_floats(kN, 100);
  rig.write(weights, w);
  const auto before = rig.runtime->device().counters();
  for (int call = 0; call < 8; ++call) {
    const auto in = random_floats(kN, 200 + call);
    rig.write(x, in);
    rig.write(out, std::vector<float>(kN, std::nanf("")));  // poison the mirror: a skipped read-back shows
    Status st = rig.add(x, weights, out).wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
    expect_sum(rig.read(out), in, w);
  }
  const auto d = rig.runtime->device().counters() - before;
  // Per call x goes up and the output comes back; the weights go up once. The
  // poisoned output mirror is never sent: an `out` argument is written whole.
  EXPECT_EQ(d.h2d_bytes, 8 * kBytes + kBytes);
  EXPECT_EQ(d.d2h_bytes, 8 * kBytes);
  EXPECT_EQ(rig.worker->stats().streams.streams_created, 2u) << "one stream per slot, reused";
}

TEST(WorkerWithMemory, PipelinedRunsEachSeeTheirOwnInputs) {
  Rig rig;
  Buffer x = rig.buffer(), weights = rig.buffer();
  std::vector<Buffer> outs;
  for (int i = 0; i < 6; ++i) outs.push_back(rig.buffer());
  const auto w = random_floats(kN, 300);
  rig.write(weights, w);
  std::vector<std::vector<float>> inputs;
  std::vector<RunHandle> runs;
  // x is rewritten while earlier runs may still be executing on the other slot: each
  // launch must upload the bytes its call saw, and nothing may overwrite them early.
  for (int i = 0; i < 6; ++i) {
    inputs.push_back(random_floats(kN, 400 + i));
    rig.write(x, inputs.back());
    runs.push_back(rig.add(x, weights, outs[i]));
  }
  for (auto& r : runs) {
    Status st = r.wait();
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  for (int i = 0; i < 6; ++i) expect_sum(rig.read(outs[i]), inputs[i], w);
}

}  // namespace
}  // namespace npurt::exec
