// Operator sequences: per-call overhead of fused vs separate dispatch on tiny shapes,
// and bytes moved per call for a SwiGLU block with resident weights. Overheads are
// printed per step next to the device's empty-kernel launch round trip measured in
// the same run; bytes next to what the call must move (its input and output).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "npurt/graph/operator_sequence.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/builder.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/rmsnorm.h"
#include "ops/random_inputs.h"
#include "must.h"
#include "samples.h"

namespace npurt::bench {
namespace {

using isa::DType;

struct Rig {
  Rig() : runtime(must(Runtime::create("sim"))), memory(&runtime->memory()) {}
  void fill(const std::string& name, DType t, uint32_t seed) {
    View v = must(seq->get_buffer(name));
    std::mt19937 rng(seed);
    const auto bytes = testing::random_bytes_for(
        isa::ArgSpec::buffer(name, isa::Access::kIn, t, v.size() / std::max<size_t>(1, isa::dtype_size(t))), rng);
    std::memcpy(v.data(), bytes.data(), std::min<size_t>(bytes.size(), v.size()));
  }
  std::shared_ptr<Runtime> runtime;
  MemoryContext* memory;
  std::unique_ptr<graph::CompiledSequence> seq;
};

// Round trip of an empty one-block kernel on its own stream: the launch floor.
double empty_launch_seconds(hal::Device& dev, exec::CodeRegistry& registry) {
  isa::KernelBuilder b("empty");
  b.exit();
  const isa::Image image = must(b.build());
  exec::CodeHandle code = must(registry.register_image(image));
  const hal::StreamId s = must(dev.create_stream());
  Samples t;
  for (int i = 0; i < 200; ++i) {
    t.time([&] {
      must(dev.launch(s, {code.address(), 1, {}}));
      must(dev.stream_synchronize(s));
    });
  }
  must(dev.destroy_stream(s));
  return t.median();
}

// Five tiny steps: norm, silu, mul, gelu, add over 64 values.
graph::OperatorSequence tiny_sequence(graph::Dispatch d) {
  constexpr uint64_t n = 64;
  using ops::ElementwiseKind;
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = n});
  auto ew = [](ElementwiseKind k) { return std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = k, .n = n}); };
  return graph::OperatorSequence("tiny5",
                                 {{norm, {"x", "w", "a"}},
                                  {ew(ElementwiseKind::kSilu), {"a", "b"}},
                                  {ew(ElementwiseKind::kMul), {"b", "x", "c"}},
                                  {ew(ElementwiseKind::kGeluTanh), {"c", "d"}},
                                  {ew(ElementwiseKind::kAdd), {"d", "x", "y"}}},
                                 {"x"}, {"y"},
                                 {{"x", n}, {"w", n}, {"a", n}, {"b", n}, {"c", n}, {"d", n}, {"y", n}}, d);
}

void BM_SequenceOverheadPerStep(benchmark::State& state) {
  const auto d = static_cast<graph::Dispatch>(state.range(0));
  Rig rig;
  rig.seq = must(tiny_sequence(d).compile(*rig.runtime));
  rig.fill("x", DType::kF32, 1);
  rig.fill("w", DType::kF32, 2);
  const double floor = empty_launch_seconds(rig.runtime->device(), rig.runtime->registry());
  Samples calls;
  for (auto _ : state) calls.time([&] { must(rig.seq->call()); });
  constexpr double kSteps = 5;
  state.SetLabel(d == graph::Dispatch::kFused ? "fused: 1 launch per call" : "separate: 5 launches per call");
  state.counters["median_call_us"] = calls.median() * 1e6;
  state.counters["per_step_us"] = calls.median() / kSteps * 1e6;
  state.counters["empty_launch_us"] = floor * 1e6;
  state.counters["target_fused_per_step_us"] = 5.0;
}
BENCHMARK(BM_SequenceOverheadPerStep)
    ->Arg(static_cast<int>(graph::Dispatch::kFused))
    ->Arg(static_cast<int>(graph::Dispatch::kSeparate))
    ->ArgName("separate")
    ->UseRealTime();

// Gemma-3-270M's MLP shapes with q8_0 weights written once: per call, the device
// counters must show the 640 input floats up and the 640 output floats down, nothing
// else.
void BM_SwigluBytesPerCall(benchmark::State& state) {
  constexpr uint64_t h = 640, f = 2048;
  auto gemv = [](uint64_t m, uint64_t k) {
    return std::make_shared<ops::Gemv>(ops::GemvParams{.m = m, .k = k, .weight = DType::kQ8_0});
  };
  using ops::ElementwiseKind;
  auto ew = [](ElementwiseKind k) { return std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = k, .n = f}); };
  const graph::OperatorSequence s(
      "swiglu",
      {{gemv(f, h), {"w_gate", "x", "left"}}, {gemv(f, h), {"w_up", "x", "right"}},
       {ew(ElementwiseKind::kSilu), {"left", "act"}}, {ew(ElementwiseKind::kMul), {"act", "right", "hid"}},
       {gemv(h, f), {"w_down", "hid", "y"}}},
      {"x"}, {"y"},
      {{"x", h}, {"y", h}, {"w_gate", f * h}, {"w_up", f * h}, {"w_down", h * f}, {"left", f}, {"right", f},
       {"act", f}, {"hid", f}},
      static_cast<graph::Dispatch>(state.range(0)));
  Rig rig;
  rig.seq = must(s.compile(*rig.runtime));
  for (const char* w : {"w_gate", "w_up", "w_down"}) rig.fill(w, DType::kQ8_0, 3);
  rig.fill("x", DType::kF32, 4);
  must(rig.seq->call());  // first call: weights go up once
  View x = must(rig.seq->get_buffer("x"));
  const hal::Counters before = rig.runtime->device().counters();
  Samples calls;
  uint64_t n = 0;
  for (auto _ : state) {
    x.data()[0] ^= 1;  // a new input every call (a tracked raw write)
    calls.time([&] { must(rig.seq->call()); });
    ++n;
  }
  const hal::Counters after = rig.runtime->device().counters();
  const double weights = 3.0 * isa::dtype_bytes(DType::kQ8_0, f * h);
  state.counters["median_call_us"] = calls.median() * 1e6;
  state.counters["h2d_bytes_per_call"] = double(after.h2d_bytes - before.h2d_bytes) / n;
  state.counters["d2h_bytes_per_call"] = double(after.d2h_bytes - before.d2h_bytes) / n;
  state.counters["input_bytes"] = h * 4;
  state.counters["output_bytes"] = h * 4;
  state.counters["resident_weight_bytes"] = weights;
  state.counters["weight_GBps"] = weights / calls.median() / 1e9;
}
BENCHMARK(BM_SwigluBytesPerCall)
    ->Arg(static_cast<int>(graph::Dispatch::kFused))
    ->Arg(static_cast<int>(graph::Dispatch::kSeparate))
    ->ArgName("separate")
    ->UseRealTime();

}  // namespace
}  // namespace npurt::bench
