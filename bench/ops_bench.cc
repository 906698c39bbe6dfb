// Operator throughput and latency on the simulated NPU, each next to its peer or
// physical limit measured in the same run:
//   * GEMV bf16: weight bytes per second vs OpenBLAS sgemv's (f32 weights, same shape);
//   * GEMV on quantized weights at the Gemma LM-head shape: weight bytes per second vs
//     a STREAM-style read of DRAM with every core;
//   * GEMM bf16: GFLOP/s vs OpenBLAS sgemm;
//   * launch-to-completion latency of small operators vs an empty kernel's.
// Ours and the peer are sampled alternately so both see the same machine state;
// every figure is a median.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <unistd.h>

#include <cstdlib>
#include <bit>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "memory_peers.h"
#include "npurt/isa/builder.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/gemm.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/prefill_attention.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/softmax.h"
#include "npurt/ops/weight_gemm.h"
#include "fma_peak.h"
#include "op_runner.h"
#include "hal/sim/tile_kernels.h"
#include "samples.h"

namespace npurt::bench {
namespace {

using isa::DType;

std::vector<float> random_f32(size_t n) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

int blas_threads() {
  const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(n);
  return n;
}

// With `cold`, a 512 MiB read evicts the caches before every timed sample of either
// side, so both stream their weights from DRAM; without, both run from warm caches.
void BM_GemvBf16VsSgemv(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool cold = state.range(1) != 0;
  OpRunner ours(ops::Gemv({.m = static_cast<uint64_t>(n), .k = static_cast<uint64_t>(n), .weight = DType::kBF16}));
  const auto a = random_f32(size_t(n) * n), x = random_f32(n);
  std::vector<float> y(n);
  blas_threads();
  static StreamRead flush;
  Samples mine, peer;
  for (auto _ : state) {
    if (cold) benchmark::DoNotOptimize(flush.run());
    mine.time([&] { ours.run(); });
    if (cold) benchmark::DoNotOptimize(flush.run());
    peer.time([&] {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, n, 1.f, a.data(), n, x.data(), 1, 0.f, y.data(), 1);
      benchmark::DoNotOptimize(y.data());
    });
  }
  const double weights = double(n) * n;
  const double ours_gbps = weights * 2 / mine.median() / 1e9, peer_gbps = weights * 4 / peer.median() / 1e9;
  state.SetLabel(cold ? "caches flushed before each sample" : "warm caches");
  state.counters["median_us"] = mine.median() * 1e6;
  report_ratio(state, "weight_GBps", ours_gbps, "sgemv_weight_GBps", peer_gbps, "ratio_to_sgemv");
  state.counters["target_ratio"] = 0.8;
}
BENCHMARK(BM_GemvBf16VsSgemv)
    ->Args({2048, 0})
    ->Args({8192, 1})
    ->Args({8192, 0})
    ->ArgNames({"n", "cold"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The Gemma-3 LM head: 262144 rows. Q8_0 rows are 640 wide; a Q4_K row must be a
// whole number of 256-value blocks, so its case uses the nearest such width, 768.
void BM_GemvQuantVsStreamRead(benchmark::State& state) {
  const auto type = static_cast<DType>(state.range(0));
  const uint64_t m = 262144, k = type == DType::kQ4_K ? 768 : 640;
  OpRunner ours(ops::Gemv({.m = m, .k = k, .weight = type}));
  static StreamRead stream;
  auto [mine, limit] =
      sample_alternately(state, [&] { ours.run(); }, [&] { benchmark::DoNotOptimize(stream.run()); });
  const double bytes = double(isa::dtype_bytes(type, m * k));
  const double ours_gbps = bytes / mine.median() / 1e9, read_gbps = stream.bytes() / limit.median() / 1e9;
  state.SetLabel(std::string(isa::dtype_name(type)) + " " + std::to_string(m) + "x" + std::to_string(k));
  state.counters["median_us"] = mine.median() * 1e6;
  report_ratio(state, "weight_GBps", ours_gbps, "stream_read_GBps", read_gbps, "ratio_to_read");
  state.counters["target_ratio"] = 0.7;
}
BENCHMARK(BM_GemvQuantVsStreamRead)
    ->Arg(static_cast<int>(DType::kQ8_0))
    ->Arg(static_cast<int>(DType::kQ4_K))
    ->ArgName("dtype")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_GemmBf16VsSgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto un = static_cast<uint64_t>(n);
  OpRunner ours(ops::Gemm({.m = un, .n = un, .k = un, .dtype = DType::kBF16}));
  const auto a = random_f32(size_t(n) * n), b = random_f32(size_t(n) * n);
  std::vector<float> c(size_t(n) * n);
  blas_threads();
  auto [mine, peer] = sample_alternately(state, [&] { ours.run(); }, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  });
  const double flops = 2.0 * n * n * n;
  const double ours_gflops = flops / mine.median() / 1e9, peer_gflops = flops / peer.median() / 1e9;
  state.counters["median_ms"] = mine.median() * 1e3;
  report_ratio(state, "GFLOPs", ours_gflops, "sgemm_GFLOPs", peer_gflops, "ratio_to_sgemm");
  state.counters["target_ratio"] = 0.5;
}
BENCHMARK(BM_GemmBf16VsSgemm)->Arg(1024)->ArgName("n")->UseRealTime()->Unit(benchmark::kMillisecond);

// Batched prefill's matrix product: T prompt rows times a Gemma-3-270M weight in its
// stored type (ffn_up q5_0 2048x640, ffn_down q4_K 640x2048), against OpenBLAS sgemm
// of the same shape on f32 weights (the same FLOPs), alternating in the same run.
void BM_WeightGemmVsSgemm(benchmark::State& state) {
  const auto t = static_cast<uint64_t>(state.range(0));
  const auto weight = static_cast<DType>(state.range(1));
  const uint64_t m = weight == DType::kQ4_K ? 640 : 2048, k = weight == DType::kQ4_K ? 2048 : 640;
  OpRunner ours(ops::WeightGemm({.m = m, .k = k, .rows = t, .weight = weight}));
  const auto x = random_f32(t * k), w = random_f32(m * k);
  std::vector<float> y(t * m);
  blas_threads();
  auto [mine, peer] = sample_alternately(state, [&] { ours.run(); }, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(t), int(m), int(k), 1.f, x.data(), int(k), w.data(),
                int(k), 0.f, y.data(), int(m));
    benchmark::DoNotOptimize(y.data());
  });
  const double flops = 2.0 * double(t) * double(m) * double(k);
  const double ours_gflops = flops / mine.median() / 1e9, peer_gflops = flops / peer.median() / 1e9;
  state.SetLabel(std::string(isa::dtype_name(weight)) + " " + std::to_string(m) + "x" + std::to_string(k));
  state.counters["median_ms"] = mine.median() * 1e3;
  report_ratio(state, "GFLOPs", ours_gflops, "sgemm_GFLOPs", peer_gflops, "ratio_to_sgemm");
  state.counters["fma_peak_GFLOPs"] = fma_peak_gflops() * std::thread::hardware_concurrency();
}
BENCHMARK(BM_WeightGemmVsSgemm)
    ->ArgsProduct({{1, 64, 128, 512}, {static_cast<int>(DType::kQ5_0), static_cast<int>(DType::kQ4_K)}})
    ->ArgNames({"rows", "dtype"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Batched prefill's attention: a 512-token chunk of Gemma-3-270M (4 query heads on one
// kv head of 256, causal; window 512 for a local layer, none for a global one: the
// same work at position 0) against the f32 FMA peak of the host's threads measured in
// the same run. FLOPs: two products (scores, values) per visible (query, key) pair.
void BM_PrefillAttentionVsFmaPeak(benchmark::State& state) {
  const auto tokens = static_cast<uint32_t>(state.range(0));
  const auto window = static_cast<uint32_t>(state.range(1));
  const ops::PrefillAttention op({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = tokens,
                                  .tokens = tokens, .window = window});
  OpRunner ours(op, {{"pos", 0}, {"rows", tokens}});
  Samples mine;
  for (auto _ : state) mine.time([&] { ours.run(); });
  double pairs = 0;
  for (uint32_t i = 0; i < tokens; ++i) pairs += window ? std::min(i + 1, window) : i + 1;
  const double flops = pairs * 4 /* heads */ * 256 /* dim */ * 2 /* products */ * 2;
  state.SetLabel(op.name());
  state.counters["median_ms"] = mine.median() * 1e3;
  report_ratio(state, "GFLOPs", flops / mine.median() / 1e9, "fma_peak_GFLOPs",
               fma_peak_gflops() * std::thread::hardware_concurrency(), "ratio_to_peak");
}
BENCHMARK(BM_PrefillAttentionVsFmaPeak)
    ->ArgsProduct({{512}, {512, 0}})
    ->ArgNames({"tokens", "window"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// An empty one-block kernel: the launch-to-completion floor of the device.
class EmptyOp final : public ops::Operator {
 public:
  std::string name() const override { return "empty"; }
  Status validate() const override { return ok_status(); }
  std::vector<isa::ArgSpec> signature() const override { return {}; }

  StatusOr<uint32_t> emit(ops::EmitContext&) const override { return 1u; }

 protected:
  void compute_reference(std::span<const ops::HostArg>) const override {}
};

// Launch-to-completion latency of one small operator, next to the empty kernel's.
void latency(benchmark::State& state, const ops::Operator& op, std::map<std::string, uint64_t> scalars = {}) {
  OpRunner ours(op, std::move(scalars));
  OpRunner empty{EmptyOp()};
  auto [mine, floor] = sample_alternately(state, [&] { ours.run(); }, [&] { empty.run(); });
  state.SetLabel(op.name() + ", grid " + std::to_string(ours.grid()));
  report_ratio(state, "median_us", mine.median() * 1e6, "empty_kernel_us", floor.median() * 1e6, "ratio_to_empty");
}

// Gemma-3-270M decode shapes.
void BM_LatencyRmsNorm640(benchmark::State& s) { latency(s, ops::RmsNorm({.rows = 1, .dim = 640})); }
void BM_LatencyRmsNormHeads4x256(benchmark::State& s) { latency(s, ops::RmsNorm({.rows = 4, .dim = 256})); }
void BM_LatencyGemvBf16_640x640(benchmark::State& s) { latency(s, ops::Gemv({.m = 640, .k = 640, .weight = DType::kBF16})); }
void BM_LatencyGemvQ8_0_640x640(benchmark::State& s) { latency(s, ops::Gemv({.m = 640, .k = 640, .weight = DType::kQ8_0})); }
void BM_LatencyGemvQ5_0_2048x640(benchmark::State& s) {
  latency(s, ops::Gemv({.m = 2048, .k = 640, .weight = DType::kQ5_0, .epilogue = ops::GemvEpilogue::kGeluTanh}));
}
void BM_LatencyAdd640(benchmark::State& s) { latency(s, ops::Elementwise({.kind = ops::ElementwiseKind::kAdd, .n = 640})); }
void BM_LatencyRope4x256(benchmark::State& s) {
  latency(s, ops::Rope({.n_heads = 4, .head_dim = 256}),
          {{"pos", 100}, {"base", std::bit_cast<uint32_t>(10000.0f)}});
}
void BM_LatencyAttention512(benchmark::State& s) {
  latency(s, ops::DecodeAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 1024, .window = 512,
                                   .scale = 1.0f}),
          {{"len", 512}});
}
// Gemma's attention with the positions split over the cores (what the model runs), and
// a global layer at 4096 positions both ways: the split reads each cached byte once.
ops::DecodeAttentionParams gemma_attention(uint32_t max_len, uint32_t window, bool split) {
  return {.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = max_len, .window = window, .scale = 1.0f,
          .split_positions = split};
}
void BM_LatencyAttention512Split(benchmark::State& s) {
  latency(s, ops::DecodeAttention(gemma_attention(1024, 512, true)), {{"len", 512}});
}
void BM_LatencyAttention4096(benchmark::State& s) {
  latency(s, ops::DecodeAttention(gemma_attention(4096, 0, false)), {{"len", 4096}});
}
void BM_LatencyAttention4096Split(benchmark::State& s) {
  latency(s, ops::DecodeAttention(gemma_attention(4096, 0, true)), {{"len", 4096}});
}
void BM_LatencySoftmax4x512(benchmark::State& s) { latency(s, ops::Softmax({.rows = 4, .cols = 512})); }
void BM_LatencyEmbeddingQ8_0(benchmark::State& s) {
  latency(s, ops::Embedding({.vocab = 262144, .dim = 640, .dtype = DType::kQ8_0, .scale = 25.298222f}), {{"token", 1234}});
}
void BM_LatencyArgmax262144(benchmark::State& s) { latency(s, ops::Argmax({.n = 262144})); }
BENCHMARK(BM_LatencyRmsNorm640)->UseRealTime();
BENCHMARK(BM_LatencyRmsNormHeads4x256)->UseRealTime();
BENCHMARK(BM_LatencyGemvBf16_640x640)->UseRealTime();
BENCHMARK(BM_LatencyGemvQ8_0_640x640)->UseRealTime();
BENCHMARK(BM_LatencyGemvQ5_0_2048x640)->UseRealTime();
BENCHMARK(BM_LatencyAdd640)->UseRealTime();
BENCHMARK(BM_LatencyRope4x256)->UseRealTime();
BENCHMARK(BM_LatencyAttention512)->UseRealTime();
BENCHMARK(BM_LatencyAttention512Split)->UseRealTime();
BENCHMARK(BM_LatencyAttention4096)->UseRealTime();
BENCHMARK(BM_LatencyAttention4096Split)->UseRealTime();
BENCHMARK(BM_LatencySoftmax4x512)->UseRealTime();
BENCHMARK(BM_LatencyEmbeddingQ8_0)->UseRealTime();
BENCHMARK(BM_LatencyArgmax262144)->UseRealTime();

// OpenBLAS 0.3.21 does not recognize recent Xeons and would run its Prescott (SSE3)
// kernels; the peer should be the best OpenBLAS this CPU runs. The core type is read
// when the library loads, before main, so the process re-executes itself once with it set.
const char* best_openblas_core() {
  if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (__builtin_cpu_supports("avx512f")) return "SkylakeX";
  if (__builtin_cpu_supports("avx2")) return "Haswell";
  return nullptr;
}

}  // namespace
}  // namespace npurt::bench

int main(int argc, char** argv) {
  const char* core = npurt::bench::best_openblas_core();
  if (core != nullptr && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);  // returns only on failure: run with the default kernels
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("tile_kernels", npurt::sim::tile_kernels_target());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

