// Operator sequences on the simulated device: layout, fused and separate dispatch,
// residency, in-place steps and compile-time errors, each checked against the
// sequence's host reference on fresh random data.
#include "npurt/graph/operator_sequence.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <unistd.h>

#include "npurt/base/hazards.h"
#include "npurt/base/math.h"
#include "npurt/exec/worker.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "ops/random_inputs.h"
#include "value_or_die.h"

namespace npurt::graph {
namespace {

using isa::DType;
using HostBuffers = std::map<std::string, std::vector<uint8_t>>;

#define ASSERT_OK(expr)                                              \
  do {                                                               \
    const ::npurt::Status s_ = (expr);                               \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.to_string();         \
  } while (0)

using npurt::testing::value_or_die;


// A runtime on a simulated device (a test turns on Hazard::kNaiveCoherence before
// making one to show the stale-data tests can fail).
class Rig {
 public:
  explicit Rig(MemoryOptions mo = {}, bool sanitize = false, uint32_t host_threads = 0) {
    hal::SimOptions o;
    o.global_memory_bytes = 256ull << 20;
    o.sanitize = sanitize;
    o.host_threads = host_threads;
    runtime = value_or_die(Runtime::create(value_or_die(hal::create_sim_device(o)), {.memory = mo}));
    dev = runtime->shared_device();
    memory = &runtime->memory();
    registry = runtime->shared_registry();
  }
  CompiledSequence& compile(const OperatorSequence& s, CompileOptions options = {}) {
    seqs.push_back(value_or_die(s.compile(*runtime, options)));
    return *seqs.back();
  }
  // Writes `bytes` into buffer `name` through a raw pointer into its tracked view.
  void write_raw(CompiledSequence& seq, const std::string& name, const std::vector<uint8_t>& bytes) {
    View v = value_or_die(seq.get_buffer(name));
    ASSERT_EQ(v.size(), bytes.size()) << name;
    std::memcpy(v.data(), bytes.data(), bytes.size());
  }
  std::vector<uint8_t> read(CompiledSequence& seq, const std::string& name) {
    View v = value_or_die(seq.get_buffer(name));
    ReadGuard g = value_or_die(memory->read(v));
    return {g.bytes().begin(), g.bytes().end()};
  }
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<hal::Device> dev;
  MemoryContext* memory = nullptr;
  std::shared_ptr<exec::CodeRegistry> registry;
  std::vector<std::unique_ptr<CompiledSequence>> seqs;
};

std::vector<uint8_t> random_for(DType t, uint64_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  return testing::random_bytes_for(isa::ArgSpec::buffer("r", isa::Access::kIn, t, elements), rng);
}

std::vector<float> as_f32(const std::vector<uint8_t>& b, DType t) { return isa::to_f32(b, t); }

// Writes the inputs `host` holds, calls `seq` once and expects its "y" within 1e-5
// (relative L2) of what `reference` computes on the host from the same inputs.
void expect_call_matches_reference(Rig& rig, CompiledSequence& seq, const OperatorSequence& reference,
                                   HostBuffers host) {
  for (const auto& [name, bytes] : host) rig.write_raw(seq, name, bytes);
  ASSERT_OK(seq.call());
  const auto y = rig.read(seq, "y");
  ASSERT_OK(reference.run_reference(host));
  EXPECT_LT(rel_l2(as_f32(y, DType::kF32), as_f32(host["y"], DType::kF32)), 1e-5);
}

// ---- the user-facing one-step patterns ------------------------------------------

OperatorSequence gemv_sequence(Dispatch d) {
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 64, .k = 640, .weight = DType::kBF16});
  return OperatorSequence("gemv", {{gemv, {"A", "x", "out"}}}, {"A", "x"}, {"out"},
                          {{"A", 64 * 640}, {"x", 640}, {"out", 64}}, d);
}

// Inputs written through get_buffer views (raw pointers), one call, output read back.
std::vector<uint8_t> run_gemv_once(Rig& rig, HostBuffers* host) {
  CompiledSequence& seq = rig.compile(gemv_sequence(Dispatch::kFused));
  (*host)["A"] = random_for(DType::kBF16, 64 * 640, 1);
  (*host)["x"] = random_for(DType::kF32, 640, 2);
  rig.write_raw(seq, "A", (*host)["A"]);
  rig.write_raw(seq, "x", (*host)["x"]);
  EXPECT_TRUE(seq.call().ok());
  return rig.read(seq, "out");
}

TEST(OperatorSequence, OneStepFusedGemvMatchesHost) {
  Rig rig;
  HostBuffers host;
  const auto out = run_gemv_once(rig, &host);
  ASSERT_OK(gemv_sequence(Dispatch::kFused).run_reference(host));
  EXPECT_LT(rel_l2(as_f32(out, DType::kF32), as_f32(host["out"], DType::kF32)), 1e-2);
}

// Fresh processes give identical bytes: the child prints a digest of the output.
TEST(OperatorSequence, GemvDigestForChildProcess) {
  const char* path = std::getenv("NPURT_SEQUENCE_DIGEST");
  if (path == nullptr) GTEST_SKIP() << "run by OneStepFusedGemvIsIdenticalAcrossProcesses";
  Rig rig;
  HostBuffers host;
  const auto out = run_gemv_once(rig, &host);
  FILE* f = std::fopen(path, "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(out.data(), 1, out.size(), f);
  std::fclose(f);
}

TEST(OperatorSequence, OneStepFusedGemvIsIdenticalAcrossProcesses) {
  std::vector<std::vector<uint8_t>> outputs;
  for (int p = 0; p < 5; ++p) {
    const std::string file = ::testing::TempDir() + "npurt_digest_" + std::to_string(p);
    const std::string cmd = "NPURT_SEQUENCE_DIGEST=" + file +
                            " /proc/" + std::to_string(getpid()) +
                            "/exe --gtest_filter=OperatorSequence.GemvDigestForChildProcess >/dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    FILE* f = std::fopen(file.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    std::vector<uint8_t> bytes(64 * 4);
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
    std::remove(file.c_str());
    outputs.push_back(bytes);
  }
  for (int p = 1; p < 5; ++p) EXPECT_EQ(outputs[p], outputs[0]) << "process " << p;
  bool any_nonzero = false;
  for (uint8_t b : outputs[0]) any_nonzero |= b != 0;
  EXPECT_TRUE(any_nonzero);
}

OperatorSequence rmsnorm_sequence(Dispatch d) {
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 640});
  return OperatorSequence("rmsnorm", {{norm, {"x", "w", "out"}}}, {"x"}, {"out"},
                          {{"x", 640}, {"w", 640}, {"out", 640}}, d);
}

TEST(OperatorSequence, WeightedRmsNormFusedIsCorrectAndDeterministic) {
  std::vector<uint8_t> first;
  for (int run = 0; run < 2; ++run) {
    Rig rig;
    CompiledSequence& seq = rig.compile(rmsnorm_sequence(Dispatch::kFused));
    HostBuffers host{{"x", random_for(DType::kF32, 640, 5)}, {"w", random_for(DType::kF32, 640, 6)}};
    rig.write_raw(seq, "x", host["x"]);
    rig.write_raw(seq, "w", host["w"]);
    ASSERT_OK(seq.call());
    const auto out = rig.read(seq, "out");
    ASSERT_OK(rmsnorm_sequence(Dispatch::kFused).run_reference(host));
    EXPECT_LT(rel_l2(as_f32(out, DType::kF32), as_f32(host["out"], DType::kF32)), 1e-2);
    if (run == 0) first = out;
    else EXPECT_EQ(out, first);
  }
}

// Looped dispatch with a host read in between: every call sees its new input and
// every read sees that call's output. Returns how many of the 8 were right.
int looped_rmsnorm_correct(bool naive) {
  const ScopedHazard wrong(Hazard::kNaiveCoherence, naive);
  Rig rig;
  CompiledSequence& seq = rig.compile(rmsnorm_sequence(Dispatch::kFused));
  HostBuffers host{{"w", random_for(DType::kF32, 640, 9)}};
  rig.write_raw(seq, "w", host["w"]);
  int correct = 0;
  for (uint32_t call = 0; call < 8; ++call) {
    host["x"] = random_for(DType::kF32, 640, 100 + call);
    rig.write_raw(seq, "x", host["x"]);
    if (!seq.call().ok()) continue;
    const auto out = rig.read(seq, "out");
    host.erase("out");
    if (!rmsnorm_sequence(Dispatch::kFused).run_reference(host).ok()) continue;
    correct += rel_l2(as_f32(out, DType::kF32), as_f32(host["out"], DType::kF32)) < 1e-2;
  }
  return correct;
}

TEST(OperatorSequence, LoopedRmsNormSeesEveryNewInput) { EXPECT_EQ(looped_rmsnorm_correct(false), 8); }

// The same loop under the naive residency-flag policy (the production bug) goes wrong:
// the test above can fail.
TEST(OperatorSequence, LoopedRmsNormFailsUnderNaiveResidencyFlags) { EXPECT_LT(looped_rmsnorm_correct(true), 8); }

// ---- SwiGLU decode block with resident weights ----------------------------------

constexpr uint64_t kHidden = 640, kFfn = 2048;

OperatorSequence swiglu_sequence(Dispatch d, DType weight = DType::kQ8_0) {
  auto gate = std::make_shared<ops::Gemv>(ops::GemvParams{.m = kFfn, .k = kHidden, .weight = weight});
  auto up = std::make_shared<ops::Gemv>(ops::GemvParams{.m = kFfn, .k = kHidden, .weight = weight});
  auto silu = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kSilu, .n = kFfn});
  auto mul = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kMul, .n = kFfn});
  auto down = std::make_shared<ops::Gemv>(ops::GemvParams{.m = kHidden, .k = kFfn, .weight = weight});
  return OperatorSequence("swiglu",
                          {{gate, {"w_gate", "x", "left"}},
                           {up, {"w_up", "x", "right"}},
                           {silu, {"left", "act"}},
                           {mul, {"act", "right", "h"}},
                           {down, {"w_down", "h", "y"}}},
                          {"x"}, {"y"},
                          {{"x", kHidden}, {"y", kHidden}, {"w_gate", kFfn * kHidden}, {"w_up", kFfn * kHidden},
                           {"w_down", kHidden * kFfn}, {"left", kFfn}, {"right", kFfn}, {"act", kFfn}, {"h", kFfn}},
                          d);
}

HostBuffers swiglu_weights(DType weight) {
  return {{"w_gate", random_for(weight, kFfn * kHidden, 21)},
          {"w_up", random_for(weight, kFfn * kHidden, 22)},
          {"w_down", random_for(weight, kHidden * kFfn, 23)}};
}

TEST(OperatorSequence, SwigluWithResidentWeightsUploadsOnlyTheInput) {
  Rig rig;
  CompiledSequence& seq = rig.compile(swiglu_sequence(Dispatch::kFused));
  HostBuffers host = swiglu_weights(DType::kQ8_0);
  for (const char* w : {"w_gate", "w_up", "w_down"}) rig.write_raw(seq, w, host[w]);
  View x = value_or_die(seq.get_buffer("x"));
  for (uint32_t call = 0; call < 10; ++call) {
    host["x"] = random_for(DType::kF32, kHidden, 300 + call);
    {
      WriteGuard g = value_or_die(rig.memory->overwrite(x));
      std::memcpy(g.bytes().data(), host["x"].data(), host["x"].size());
    }
    const uint64_t h2d_before = rig.dev->counters().h2d_bytes;
    ASSERT_OK(seq.call());
    const uint64_t uploaded = rig.dev->counters().h2d_bytes - h2d_before;
    if (call == 0) {
      EXPECT_EQ(uploaded, kHidden * 4 + 3 * isa::dtype_bytes(DType::kQ8_0, kFfn * kHidden)) << "first call: weights too";
    } else {
      EXPECT_EQ(uploaded, kHidden * 4) << "call " << call;
    }
    const auto y = rig.read(seq, "y");
    HostBuffers ref = host;
    ASSERT_OK(swiglu_sequence(Dispatch::kFused).run_reference(ref));
    EXPECT_LT(rel_l2(as_f32(y, DType::kF32), as_f32(ref["y"], DType::kF32)), 1e-3) << "call " << call;
  }
}

TEST(OperatorSequence, FusedAndSeparateGiveIdenticalBytes) {
  std::vector<uint8_t> results[2];
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    Rig rig;
    CompiledSequence& seq = rig.compile(swiglu_sequence(d, DType::kBF16));
    EXPECT_EQ(seq.launches_per_call(), d == Dispatch::kFused ? 1u : 5u);
    HostBuffers host = swiglu_weights(DType::kBF16);
    host["x"] = random_for(DType::kF32, kHidden, 7);
    for (const char* n : {"w_gate", "w_up", "w_down", "x"}) rig.write_raw(seq, n, host[n]);
    ASSERT_OK(seq.call());
    results[d == Dispatch::kFused ? 0 : 1] = rig.read(seq, "y");
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(OperatorSequence, RunsThroughTheWorker) {
  Rig rig;
  CompiledSequence& seq = rig.compile(swiglu_sequence(Dispatch::kFused));
  auto worker = value_or_die(rig.runtime->make_worker());
  HostBuffers host = swiglu_weights(DType::kQ8_0);
  for (const char* w : {"w_gate", "w_up", "w_down"}) rig.write_raw(seq, w, host[w]);
  for (uint32_t call = 0; call < 3; ++call) {
    host["x"] = random_for(DType::kF32, kHidden, 400 + call);
    rig.write_raw(seq, "x", host["x"]);
    exec::RunHandle run =
        worker->submit([&](exec::RunContext& ctx) { return seq.enqueue(ctx.stream()); }, seq.code_handles());
    ASSERT_OK(run.wait());
    const auto y = rig.read(seq, "y");
    HostBuffers ref = host;
    ASSERT_OK(swiglu_sequence(Dispatch::kFused).run_reference(ref));
    EXPECT_LT(rel_l2(as_f32(y, DType::kF32), as_f32(ref["y"], DType::kF32)), 1e-3) << "call " << call;
  }
}

// ---- registers between fused steps ----------------------------------------------

// A step that stores r7 + 1 into 16 floats of y: it reads r7 before writing it, so it
// relies on a block's registers starting at zero (or on the fused code clearing them).
class ReadsRegisterFirst : public ops::Operator {
 public:
  explicit ReadsRegisterFirst(int64_t set_to) : set_to_(set_to) {}
  std::string name() const override { return set_to_ < 0 ? "reads_r7_first" : "sets_r7"; }
  Status validate() const override { return ok_status(); }
  std::vector<isa::ArgSpec> signature() const override {
    return {isa::ArgSpec::buffer("y", isa::Access::kOut, DType::kF32, 16)};
  }
  StatusOr<uint32_t> emit(ops::EmitContext& ctx) const override {
    isa::KernelBuilder& b = ctx.builder;
    const isa::Reg r7{7}, value{8}, offset{9};
    if (set_to_ >= 0) {
      b.li(r7, set_to_);  // leaves r7 set for the next step's code
    } else {
      b.alui(isa::AluOp::kAdd, r7, r7, 1);
    }
    b.i2f(value, r7);
    b.tdef(isa::Tile{0}, DType::kF32, 1, 16, 0);
    b.tfill(isa::Tile{0}, value);
    b.li(offset, 0);
    b.tst(isa::Tile{0}, ctx.arg("y"), offset, DType::kF32);
    return 1u;
  }

 protected:
  void compute_reference(std::span<const ops::HostArg> args) const override {
    const float v = set_to_ < 0 ? 1.0f : static_cast<float>(set_to_);
    ops::write_f32(args[0], DType::kF32, std::vector<float>(16, v));
  }

 private:
  int64_t set_to_;
};

TEST(OperatorSequence, AFusedStepSeesZeroInTheRegistersItReadsFirst) {
  auto sets = std::make_shared<ReadsRegisterFirst>(41);
  auto reads = std::make_shared<ReadsRegisterFirst>(-1);
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    Rig rig;
    CompiledSequence& seq = rig.compile(
        OperatorSequence("regs", {{sets, {"s"}}, {reads, {"y"}}}, {}, {"s", "y"}, {{"s", 16}, {"y", 16}}, d));
    ASSERT_OK(seq.call());
    const std::vector<float> s = as_f32(rig.read(seq, "s"), DType::kF32);
    const std::vector<float> y = as_f32(rig.read(seq, "y"), DType::kF32);
    EXPECT_EQ(s, std::vector<float>(16, 41.0f));
    EXPECT_EQ(y, std::vector<float>(16, 1.0f)) << (d == Dispatch::kFused ? "fused" : "separate")
                                               << ": the step read r7 as " << y[0] - 1;
  }
}

// ---- barriers between fused steps ---------------------------------------------

// Runs the sequence `make` builds, fused and separate, on the inputs `host`: fused it
// has one barrier per call (`phases` says where), and both dispatches give the same
// bytes of "y", which match the reference.
void expect_fused_as_separate(OperatorSequence (*make)(Dispatch), const HostBuffers& host, bool sanitize,
                              const char* phases) {
  std::vector<uint8_t> results[2];
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    Rig rig({}, sanitize);
    CompiledSequence& seq = rig.compile(make(d));
    if (d == Dispatch::kFused) {
      EXPECT_EQ(seq.barriers_per_call(), 1u) << phases;
    }
    for (const auto& [name, bytes] : host) rig.write_raw(seq, name, bytes);
    ASSERT_OK(seq.call());
    results[d == Dispatch::kFused ? 0 : 1] = rig.read(seq, "y");
  }
  EXPECT_EQ(results[0], results[1]);
  HostBuffers ref = host;
  ASSERT_OK(make(Dispatch::kFused).run_reference(ref));
  EXPECT_LT(rel_l2(as_f32(results[0], DType::kF32), as_f32(ref["y"], DType::kF32)), 1e-5);
}

// Two GEMVs of the same x into q and k share a phase; the add of q and k waits for
// both; the add is the launch's last step, so the kernel holds one barrier.
OperatorSequence independent_gemvs(Dispatch d) {
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 512, .k = 640, .weight = DType::kQ8_0});
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 512});
  return OperatorSequence("qk", {{gemv, {"wq", "x", "q"}}, {gemv, {"wk", "x", "k"}}, {add, {"q", "k", "y"}}},
                          {"wq", "wk", "x"}, {"y"},
                          {{"wq", 512 * 640}, {"wk", 512 * 640}, {"x", 640}, {"q", 512}, {"k", 512}, {"y", 512}}, d);
}

TEST(OperatorSequence, FusedStepsThatTouchNoSharedBytesShareAPhase) {
  const HostBuffers host{{"wq", random_for(DType::kQ8_0, 512 * 640, 11)},
                         {"wk", random_for(DType::kQ8_0, 512 * 640, 12)},
                         {"x", random_for(DType::kF32, 640, 13)}};
  expect_fused_as_separate(independent_gemvs, host, /*sanitize=*/false, "q and k in one phase, then the add");
}

// A GEMV on 8 blocks, then a norm on block 0 of all its rows. With the planned
// barrier the norm waits for every block; without (the WRONG test-only policy) block
// 0 runs it right after its own rows, and reads rows blocks 1..7 have not written:
// the sanitizer reports the read of never-written memory. One host thread runs the
// cores in order, so the outcome does not depend on thread timing.
Status gemv_then_norm(bool plan_barriers, double* rel) {
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 512, .k = 640, .weight = DType::kQ8_0});
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 512});
  const OperatorSequence s("gn", {{gemv, {"w", "x", "y"}}, {norm, {"y", "g", "z"}}}, {"w", "x", "g"}, {"z"},
                           {{"w", 512 * 640}, {"x", 640}, {"y", 512}, {"g", 512}, {"z", 512}});
  const ScopedHazard no_barriers(Hazard::kNoStepBarriers, !plan_barriers);
  Rig rig({}, /*sanitize=*/true, /*host_threads=*/1);
  CompiledSequence& seq = rig.compile(s);
  HostBuffers host{{"w", random_for(DType::kQ8_0, 512 * 640, 21)},
                   {"x", random_for(DType::kF32, 640, 22)},
                   {"g", random_for(DType::kF32, 512, 23)}};
  for (const char* n : {"w", "x", "g"}) rig.write_raw(seq, n, host[n]);
  NPURT_RETURN_IF_ERROR(seq.call());
  HostBuffers ref = host;
  NPURT_RETURN_IF_ERROR(s.run_reference(ref));
  *rel = rel_l2(as_f32(rig.read(seq, "z"), DType::kF32), as_f32(ref["z"], DType::kF32));
  return ok_status();
}

TEST(OperatorSequence, AStepThatReadsAnotherBlocksRowsWaitsForThem) {
  double rel = 1;
  ASSERT_OK(gemv_then_norm(/*plan_barriers=*/true, &rel));
  EXPECT_LT(rel, 1e-5);
  const Status naive = gemv_then_norm(/*plan_barriers=*/false, &rel);
  EXPECT_EQ(naive.code(), StatusCode::kHazard) << naive.to_string();
  EXPECT_NE(naive.message().find("never-written"), std::string::npos) << naive.to_string();
}

// A norm, an add and a second norm each run on block 0 alone (grid 1), so block 0
// runs them in program order and they share one phase; the GEMV after them runs on
// every block and reads the second norm's output, so it waits for them: one barrier.
OperatorSequence one_block_chain(Dispatch d) {
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 512});
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 512});
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 512, .k = 512, .weight = DType::kQ8_0});
  return OperatorSequence("chain",
                          {{norm, {"x", "g", "a"}}, {add, {"a", "x", "b"}}, {norm, {"b", "g", "c"}}, {gemv, {"w", "c", "y"}}},
                          {"x", "g", "w"}, {"y"},
                          {{"x", 512}, {"g", 512}, {"a", 512}, {"b", 512}, {"c", 512}, {"w", 512 * 512}, {"y", 512}}, d);
}

TEST(OperatorSequence, OneBlockStepsShareAPhaseAndWiderStepsWaitForThem) {
  const HostBuffers host{{"x", random_for(DType::kF32, 512, 31)},
                         {"g", random_for(DType::kF32, 512, 32)},
                         {"w", random_for(DType::kQ8_0, 512 * 512, 33)}};
  expect_fused_as_separate(one_block_chain, host, /*sanitize=*/true,
                           "norm, add and norm on block 0 in one phase, then the GEMV");
}

// Steps on fewer blocks than their launch sit behind block guards, and neighbours on
// the same blocks with no barrier between share one. Here an add on 4 blocks follows
// the GEMV (8 blocks), then two one-block norms with a barrier between them (the
// second reads the GEMV's rows), then a second GEMV on the second norm's output. The
// add must keep a guard of its own (on one block's guard it would leave 3 of its 4
// tiles unwritten) and the norms must not share one across the barrier (blocks 1..7
// would pass it and start the second GEMV before block 0 has normed its input).
OperatorSequence guarded_steps(Dispatch d) {
  constexpr uint64_t n = 4 * 4096;
  auto gemv1 = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 512, .k = 640, .weight = DType::kQ8_0});
  auto add4 = std::make_shared<ops::Elementwise>(
      ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = n, .tile = 4096, .cores = 4});
  auto norm64 = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 64});
  auto norm512 = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 512});
  auto gemv2 = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 512, .k = 512, .weight = DType::kQ8_0});
  return OperatorSequence("guards",
                          {{gemv1, {"w1", "x", "y1"}},
                           {add4, {"a", "b", "c"}},
                           {norm64, {"v", "g64", "vn"}},
                           {norm512, {"y1", "g512", "z"}},
                           {gemv2, {"w2", "z", "y"}}},
                          {"w1", "x", "a", "b", "v", "g64", "g512", "w2"}, {"c", "vn", "y"},
                          {{"w1", 512 * 640}, {"x", 640}, {"y1", 512}, {"a", n}, {"b", n}, {"c", n}, {"v", 64},
                           {"g64", 64}, {"vn", 64}, {"g512", 512}, {"z", 512}, {"w2", 512 * 512}, {"y", 512}},
                          d);
}

TEST(OperatorSequence, StepsOnFewerBlocksShareAGuardOnlyOnTheSameBlocksAndInOnePhase) {
  constexpr uint64_t n = 4 * 4096;
  const HostBuffers host{{"w1", random_for(DType::kQ8_0, 512 * 640, 81)}, {"x", random_for(DType::kF32, 640, 82)},
                         {"a", random_for(DType::kF32, n, 83)},           {"b", random_for(DType::kF32, n, 84)},
                         {"v", random_for(DType::kF32, 64, 85)},          {"g64", random_for(DType::kF32, 64, 86)},
                         {"g512", random_for(DType::kF32, 512, 87)},      {"w2", random_for(DType::kQ8_0, 512 * 512, 88)}};
  HostBuffers ref = host;
  ASSERT_OK(guarded_steps(Dispatch::kFused).run_reference(ref));
  std::map<std::string, std::vector<uint8_t>> results[2];
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    // One host thread runs the cores in order: the outcome does not depend on timing.
    Rig rig({}, /*sanitize=*/true, /*host_threads=*/1);
    CompiledSequence& seq = rig.compile(guarded_steps(d));
    for (const auto& [name, bytes] : host) rig.write_raw(seq, name, bytes);
    ASSERT_OK(seq.call());
    for (const char* out : {"c", "vn", "y"}) results[d == Dispatch::kFused ? 0 : 1][out] = rig.read(seq, out);
  }
  for (const char* out : {"c", "vn", "y"}) {
    EXPECT_EQ(results[0][out], results[1][out]) << out;
    EXPECT_LT(rel_l2(as_f32(results[0][out], DType::kF32), as_f32(ref[out], DType::kF32)), 1e-5) << out;
  }
}

// ---- stale instructions --------------------------------------------------------

// Sequence C (a one-block norm, then an add on all 8 cores) runs and is destroyed;
// sequence D, the same but with a mul, is compiled next and its code lands exactly
// where C's was. D's stream is primed over every core, so cores 1..7 drop the add's
// cached lines: D computes a*b and the sanitizer reports nothing. Without the priming
// launch (the test-only switch) D's first launch invalidates core 0 only, and the
// other cores run C's stale add.
struct RecycleOutcome {
  bool recycled = false;
  double rel_l2_to_mul = 0;
  uint64_t hazards = 0;
  Status status;
};

RecycleOutcome run_after_recycling(bool prime) {
  constexpr uint64_t n = 8 * 4096;  // 8 tiles: one per core
  Rig rig({}, /*sanitize=*/true);
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = n});
  auto mul = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kMul, .n = n});
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = 64});
  const std::map<std::string, uint64_t> sizes{{"a", n}, {"b", n}, {"y", n}, {"v", 64}, {"w", 64}, {"vn", 64}};
  RecycleOutcome r;
  const auto sequence = [&](const char* name, std::shared_ptr<ops::Elementwise> op) {
    return OperatorSequence(name, {{norm, {"v", "w", "vn"}}, {op, {"a", "b", "y"}}}, {"a", "b", "v"}, {"y", "vn"},
                            sizes, Dispatch::kSeparate);
  };
  hal::DeviceAddr add_at{};
  {
    auto c = value_or_die(sequence("c", add).compile(*rig.runtime));
    for (const char* name : {"a", "b", "v", "w"}) {
      View v = value_or_die(c->get_buffer(name));
      std::memset(v.data(), 0, v.size());
    }
    EXPECT_TRUE(c->call().ok());
    add_at = c->code_handles()[1].address();
  }
  // Completed launches give their hold on C's code back at the context's next
  // synchronize (or launch): then C's blocks are free for D's code.
  EXPECT_TRUE(rig.runtime->memory().synchronize().ok());
  const OperatorSequence d = sequence("d", mul);
  const ScopedHazard unprimed(Hazard::kUnprimedStreams, !prime);
  CompiledSequence& seq = rig.compile(d);
  r.recycled = seq.code_handles()[1].address() == add_at;
  HostBuffers host{{"a", random_for(DType::kF32, n, 71)}, {"b", random_for(DType::kF32, n, 72)},
                   {"v", random_for(DType::kF32, 64, 73)}, {"w", random_for(DType::kF32, 64, 74)}};
  for (const char* name : {"a", "b", "v", "w"}) rig.write_raw(seq, name, host[name]);
  r.status = seq.call();
  r.hazards = rig.dev->counters().hazard_stale_fetch;
  if (r.status.ok()) {
    const auto y = rig.read(seq, "y");
    EXPECT_TRUE(d.run_reference(host).ok());
    r.rel_l2_to_mul = rel_l2(as_f32(y, DType::kF32), as_f32(host["y"], DType::kF32));
  }
  return r;
}

TEST(OperatorSequence, PrimedStreamNeverRunsRecycledCodeLines) {
  const RecycleOutcome r = run_after_recycling(/*prime=*/true);
  ASSERT_TRUE(r.recycled) << "setup: the mul kernel did not land at the add kernel's address";
  ASSERT_OK(r.status);
  EXPECT_EQ(r.hazards, 0u);
  EXPECT_LT(r.rel_l2_to_mul, 1e-6);
}

TEST(OperatorSequence, UnprimedStreamRunsRecycledCodeLines) {
  const RecycleOutcome r = run_after_recycling(/*prime=*/false);
  ASSERT_TRUE(r.recycled) << "setup: the mul kernel did not land at the add kernel's address";
  EXPECT_TRUE(!r.status.ok() || r.hazards > 0 || r.rel_l2_to_mul > 1e-3)
      << "without priming the stale add lines should have been detected";
  EXPECT_EQ(r.status.code(), StatusCode::kHazard) << r.status.to_string();
}

// ---- layout --------------------------------------------------------------------

TEST(OperatorSequence, IntermediatesWithDisjointLifetimesShareBytes) {
  auto silu = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kSilu, .n = 1000});
  auto gelu = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kGeluTanh, .n = 1000});
  const OperatorSequence chain("chain",
                               {{silu, {"x", "t1"}}, {gelu, {"t1", "t2"}}, {silu, {"t2", "t3"}}, {gelu, {"t3", "y"}}},
                               {"x"}, {"y"}, {{"x", 1000}, {"t1", 1000}, {"t2", 1000}, {"t3", 1000}, {"y", 1000}});
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    Rig rig;
    const OperatorSequence s("chain", {{silu, {"x", "t1"}}, {gelu, {"t1", "t2"}}, {silu, {"t2", "t3"}}, {gelu, {"t3", "y"}}},
                             {"x"}, {"y"}, {{"x", 1000}, {"t1", 1000}, {"t2", 1000}, {"t3", 1000}, {"y", 1000}}, d);
    CompiledSequence& seq = rig.compile(s);
    std::map<std::string, BufferPlacement> at;
    for (const BufferPlacement& p : seq.placements()) at[p.name] = p;
    EXPECT_TRUE(at["t1"].intermediate && at["t3"].intermediate);
    EXPECT_EQ(at["t1"].offset, at["t3"].offset);  // t1 dies at step 1, t3 is born at step 2
    EXPECT_NE(at["t1"].offset, at["t2"].offset);
    EXPECT_LT(seq.arena_bytes(BufferPlacement::Arena::kScratch), 3 * 4000u);  // two intermediates' room, not three
    expect_call_matches_reference(rig, seq, chain, {{"x", random_for(DType::kF32, 1000, 31)}});
  }
}

// Slices: two steps write the halves of one buffer, a third reads it whole.
TEST(OperatorSequence, SlicesAddressPartsOfABuffer) {
  auto half = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 256});
  auto silu = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kSilu, .n = 512});
  const OperatorSequence s("halves",
                           {{half, {"a[0:256]", "b[0:256]", "kv[0:256]"}},
                            {half, {"a[256:512]", "b[256:512]", "kv[256:512]"}},
                            {silu, {"kv", "y"}}},
                           {"a", "b"}, {"y"}, {{"a", 512}, {"b", 512}, {"kv", 512}, {"y", 512}});
  Rig rig;
  CompiledSequence& seq = rig.compile(s);
  expect_call_matches_reference(rig, seq, s,
                                {{"a", random_for(DType::kF32, 512, 41)}, {"b", random_for(DType::kF32, 512, 42)}});
  EXPECT_EQ(value_or_die(seq.get_buffer("kv[256:512]")).size(), 256u * 4);
}

// More distinct bindings than a kernel has arguments: a chain of 40 adds, each with
// its own addend, fuses into as few kernels as the 32-argument limit allows and
// computes what the separate launches and the host reference compute.
OperatorSequence long_chain(Dispatch d) {
  constexpr uint64_t kN = 300;
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = kN});
  std::vector<SequenceStep> steps;
  std::vector<std::string> inputs{"h"};
  std::map<std::string, uint64_t> sizes{{"h", kN}};
  for (int i = 0; i < 40; ++i) {
    const std::string w = "w" + std::to_string(i);
    inputs.push_back(w);
    sizes[w] = kN;
    steps.push_back({add, {"h", w, "h"}});
  }
  return OperatorSequence("chain", std::move(steps), {}, {}, sizes, d);
}

TEST(OperatorSequence, LongFusedSequenceSplitsAtTheArgumentLimit) {
  std::vector<uint8_t> results[2];
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    Rig rig;
    const OperatorSequence s = long_chain(d);
    CompiledSequence& seq = rig.compile(s);
    // 41 distinct buffers: 31 fit the first kernel with "h", the other 10 the second.
    EXPECT_EQ(seq.launches_per_call(), d == Dispatch::kFused ? 2u : 40u);
    HostBuffers host{{"h", random_for(DType::kF32, 300, 60)}};
    for (int i = 0; i < 40; ++i) host["w" + std::to_string(i)] = random_for(DType::kF32, 300, 61 + i);
    for (const auto& [name, bytes] : host) rig.write_raw(seq, name, bytes);
    ASSERT_OK(seq.call());
    results[d == Dispatch::kFused ? 0 : 1] = rig.read(seq, "h");
    ASSERT_OK(s.run_reference(host));
    EXPECT_LT(rel_l2(as_f32(results[d == Dispatch::kFused ? 0 : 1], DType::kF32), as_f32(host["h"], DType::kF32)), 1e-6);
  }
  EXPECT_EQ(results[0], results[1]);
}

// ---- in place -----------------------------------------------------------------

TEST(OperatorSequence, InPlaceRmsNormIsAllowedAndCorrect) {
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 4, .dim = 256});
  auto copy = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kSilu, .n = 1024});
  const OperatorSequence s("inplace", {{copy, {"x", "h"}}, {norm, {"h", "w", "h"}}, {copy, {"h", "y"}}}, {"x"}, {"y"},
                           {{"x", 1024}, {"h", 1024}, {"w", 256}, {"y", 1024}});
  Rig rig;
  CompiledSequence& seq = rig.compile(s);
  expect_call_matches_reference(rig, seq, s,
                                {{"x", random_for(DType::kF32, 1024, 51)}, {"w", random_for(DType::kF32, 256, 52)}});
}

TEST(OperatorSequence, InPlaceIsRejectedForOperatorsThatCannotDoIt) {
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 640, .k = 640});
  const OperatorSequence s("bad", {{gemv, {"w", "h", "h"}}}, {}, {}, {{"w", 640 * 640}, {"h", 640}});
  Rig rig;
  auto r = s.compile(*rig.runtime);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step 0 (gemv f32 640x640): 'h' (x) and 'h' (y) overlap"), std::string::npos)
      << r.status().to_string();
}

// A step with a grid barrier of its own (split decode attention) must run on every
// block of its fused kernel: on fewer, the other blocks would skip its barrier and
// meet the next one instead. Refused by name; on all cores it compiles.
TEST(OperatorSequence, AStepWithItsOwnBarrierRunsOnEveryBlockOrIsRefused) {
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 1 << 18});
  for (uint32_t cores : {2u, 0u}) {
    auto attend = std::make_shared<ops::DecodeAttention>(ops::DecodeAttentionParams{
        .n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 256, .cores = cores, .split_positions = true});
    const OperatorSequence s("split", {{add, {"a", "b", "c"}}, {attend, {"q", "k", "v", "o", "len", "partials"}}},
                             {}, {},
                             {{"a", 1 << 18}, {"b", 1 << 18}, {"c", 1 << 18}, {"q", 256}, {"k", 256 * 64},
                              {"v", 256 * 64}, {"o", 256}, {"partials", attend->partials_elems()}});
    Rig rig;
    auto r = s.compile(*rig.runtime);
    if (cores == 0) {
      EXPECT_TRUE(r.ok()) << r.status().to_string();
      continue;
    }
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("step 1 (decode_attention"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("grid barrier but runs on 2 blocks of the launch's 8"), std::string::npos)
        << r.status().to_string();
  }
}

// ---- compile-time errors name the step and the binding ---------------------------

TEST(OperatorSequence, LayoutErrorsNameStepAndBinding) {
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 64});
  auto add_bf16 = std::make_shared<ops::Elementwise>(
      ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = 64, .dtype = DType::kBF16});
  auto rope = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = 1, .head_dim = 64});
  struct Case {
    OperatorSequence seq;
    const char* message;
  };
  const std::map<std::string, uint64_t> sizes{{"a", 64}, {"b", 64}, {"c", 64}, {"big", 128}};
  const Case cases[] = {
      {OperatorSequence("s", {{add, {"a", "nope", "c"}}}, {"a"}, {"c"}, sizes),
       "step 0 (add f32 64): unknown buffer 'nope'"},
      {OperatorSequence("s", {{add, {"a", "big", "c"}}}, {"a"}, {"c"}, sizes),
       "step 0 (add f32 64): 'big' has 128 elements but b needs 64"},
      {OperatorSequence("s", {{add, {"a", "b", "c"}}, {add_bf16, {"c", "b", "a"}}}, {}, {}, sizes),
       "step 1 (add bf16 64): buffer 'c' is bf16"},
      {OperatorSequence("s", {{add, {"a", "big[100:164]", "c"}}}, {"a"}, {"c"}, sizes),
       "slice 'big[100:164]' ends past buffer 'big'"},
      {OperatorSequence("s", {{add, {"a", "b", "c"}}, {add, {"c", "b", "a"}}}, {"a"}, {"c"}, sizes),
       "step 1 (add f32 64): writes input 'a'"},
      {OperatorSequence("s", {{add, {"big[0:64]", "b", "big[32:96]"}}}, {}, {}, sizes),
       "step 0 (add f32 64): 'big[0:64]' (a) and 'big[32:96]' (out) overlap"},
      {OperatorSequence("s", {{add, {"a", "b"}}}, {}, {}, sizes), "step 0 (add f32 64): binds 2 names to 3 arguments"},
      {OperatorSequence("s", {{add, {"a", "b[3", "c"}}}, {}, {}, sizes), "binding 'b[3' is not name or name[first:last]"},
      {OperatorSequence("s", {{add, {"a", "b", "c"}}}, {"zzz"}, {}, sizes), "input 'zzz' is bound by no step"},
      // Fused, the scalar would read the buffer's argument (0 on the device) while
      // separate dispatch asks for its value: a name is a buffer or a scalar.
      {OperatorSequence("s", {{rope, {"a", "c", "pos", "a"}}}, {"a"}, {"c"}, sizes),
       "'a' is bound both as a scalar and as buffer 'a'"},
      {OperatorSequence("s", {{rope, {"a", "c", "b", "base"}}, {add, {"a", "b", "big[0:64]"}}}, {"a"}, {}, sizes),
       "'b' is bound both as a scalar and as buffer 'b'"},
  };
  Rig rig;
  for (const Case& c : cases) {
    auto r = c.seq.compile(*rig.runtime);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().to_string();
  }
  // The device is still usable afterwards.
  CompiledSequence& ok = rig.compile(rmsnorm_sequence(Dispatch::kFused));
  rig.write_raw(ok, "x", random_for(DType::kF32, 640, 1));
  rig.write_raw(ok, "w", random_for(DType::kF32, 640, 2));
  ASSERT_OK(ok.call());
}

// One RoPE step, its position and base the runtime scalars "pos" and "base".
OperatorSequence rope_sequence() {
  auto rope = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = 4, .head_dim = 256});
  return OperatorSequence("rope", {{rope, {"q", "q_rot", "pos", "base"}}}, {"q"}, {"q_rot"},
                          {{"q", 1024}, {"q_rot", 1024}});
}

// Runtime scalars are given per call, by name, without recompiling.
TEST(OperatorSequence, ScalarsArePassedPerCall) {
  const OperatorSequence s = rope_sequence();
  Rig rig;
  CompiledSequence& seq = rig.compile(s);
  HostBuffers host{{"q", random_for(DType::kF32, 1024, 61)}};
  rig.write_raw(seq, "q", host["q"]);
  const Status missing = seq.call({{"pos", int64_t{3}}});
  EXPECT_NE(missing.message().find("no value for scalar 'base'"), std::string::npos) << missing.to_string();
  for (int64_t pos : {0, 5, 77}) {
    const Scalars scalars{{"pos", pos}, {"base", 10000.0}};
    ASSERT_OK(seq.call(scalars));
    const auto out = rig.read(seq, "q_rot");
    HostBuffers ref = host;
    ASSERT_OK(s.run_reference(ref, scalars));
    EXPECT_LT(rel_l2(as_f32(out, DType::kF32), as_f32(ref["q_rot"], DType::kF32)), 1e-5) << "pos " << pos;
  }
  EXPECT_EQ(seq.get_buffer("nope").status().code(), StatusCode::kNotFound);
}

// A scalar name the steps do not bind is refused before anything runs, by call(),
// start(), enqueue() and run_reference() alike, naming it and listing the known
// scalars; a sequence without scalars says so. The sequence stays usable.
TEST(OperatorSequence, UnknownScalarsAreRefusedByName) {
  const OperatorSequence s = rope_sequence();
  Rig rig;
  CompiledSequence& seq = rig.compile(s);
  EXPECT_EQ(seq.scalar_names(), (std::vector<std::string>{"base", "pos"}));
  rig.write_raw(seq, "q", random_for(DType::kF32, 1024, 62));
  const uint64_t launches = rig.dev->counters().launches;
  const Scalars typo{{"pos", int64_t{3}}, {"base", 10000.0}, {"typo", int64_t{3}}};
  const std::string want = "sequence 'rope': unknown scalar 'typo' (its scalars: base, pos)";
  const Status called = seq.call(typo);
  EXPECT_EQ(called.code(), StatusCode::kInvalidArgument) << called.to_string();
  EXPECT_EQ(called.message(), want);
  EXPECT_EQ(seq.start(typo).message(), want);
  EXPECT_EQ(seq.check_scalars(typo).message(), want);
  HostBuffers host{{"q", random_for(DType::kF32, 1024, 63)}};
  EXPECT_EQ(s.run_reference(host, typo).message(), want);
  // Several unknown names at once.
  const Status two = seq.call({{"pos", int64_t{3}}, {"bsae", 10000.0}, {"Pos", int64_t{1}}});
  EXPECT_EQ(two.message(), "sequence 'rope': unknown scalars 'Pos', 'bsae' (its scalars: base, pos)");
  EXPECT_EQ(rig.dev->counters().launches, launches);  // nothing ran
  auto worker = value_or_die(rig.runtime->make_worker());
  exec::RunHandle run =
      worker->submit([&](exec::RunContext& ctx) { return seq.enqueue(ctx.stream(), typo); }, seq.code_handles());
  const Status ran = run.wait();
  EXPECT_NE(ran.message().find(want), std::string::npos) << ran.to_string();  // "run 0 (slot 0): " + want
  ASSERT_OK(seq.call({{"pos", int64_t{3}}, {"base", 10000.0}}));
  ASSERT_OK(seq.check_scalars({{"pos", int64_t{3}}}));  // known names; missing ones are call()'s to name

  CompiledSequence& gemv = rig.compile(gemv_sequence(Dispatch::kFused));
  EXPECT_TRUE(gemv.scalar_names().empty());
  EXPECT_EQ(gemv.call({{"pos", int64_t{0}}}).message(),
            "sequence 'gemv': unknown scalar 'pos' (it binds no scalars)");
  ASSERT_OK(gemv.call());
}

}  // namespace
}  // namespace npurt::graph
