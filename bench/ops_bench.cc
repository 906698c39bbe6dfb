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

#include <random>

#include "memory_peers.h"
#include "npurt/isa/builder.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/gemm.h"
#include "npurt/ops/gemv.h"
#include "op_runner.h"
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

void BM_GemvBf16VsSgemv(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  OpRunner ours(ops::Gemv({.m = static_cast<uint64_t>(n), .k = static_cast<uint64_t>(n), .weight = DType::kBF16}));
  const auto a = random_f32(size_t(n) * n), x = random_f32(n);
  std::vector<float> y(n);
  blas_threads();
  Samples mine, peer;
  for (auto _ : state) {
    mine.time([&] { ours.run(); });
    peer.time([&] {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, n, 1.f, a.data(), n, x.data(), 1, 0.f, y.data(), 1);
      benchmark::DoNotOptimize(y.data());
    });
  }
  const double weights = double(n) * n;
  const double ours_gbps = weights * 2 / mine.median() / 1e9, peer_gbps = weights * 4 / peer.median() / 1e9;
  state.counters["median_us"] = mine.median() * 1e6;
  state.counters["weight_GBps"] = ours_gbps;
  state.counters["sgemv_weight_GBps"] = peer_gbps;
  state.counters["ratio_to_sgemv"] = ours_gbps / peer_gbps;
  state.counters["target_ratio"] = 0.8;
}
BENCHMARK(BM_GemvBf16VsSgemv)->Arg(2048)->Arg(8192)->ArgName("n")->UseRealTime()->Unit(benchmark::kMicrosecond);

// The Gemma-3 LM head: 262144 rows. Q8_0 rows are 640 wide; a Q4_K row must be a
// whole number of 256-value blocks, so its case uses the nearest such width, 768.
void BM_GemvQuantVsStreamRead(benchmark::State& state) {
  const auto type = static_cast<DType>(state.range(0));
  const uint64_t m = 262144, k = type == DType::kQ4_K ? 768 : 640;
  OpRunner ours(ops::Gemv({.m = m, .k = k, .weight = type}));
  static StreamRead stream;
  Samples mine, limit;
  for (auto _ : state) {
    mine.time([&] { ours.run(); });
    limit.time([&] { benchmark::DoNotOptimize(stream.run()); });
  }
  const double bytes = double(isa::dtype_bytes(type, m * k));
  const double ours_gbps = bytes / mine.median() / 1e9, read_gbps = stream.bytes() / limit.median() / 1e9;
  state.SetLabel(std::string(isa::dtype_name(type)) + " " + std::to_string(m) + "x" + std::to_string(k));
  state.counters["median_us"] = mine.median() * 1e6;
  state.counters["weight_GBps"] = ours_gbps;
  state.counters["stream_read_GBps"] = read_gbps;
  state.counters["ratio_to_read"] = ours_gbps / read_gbps;
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
  Samples mine, peer;
  for (auto _ : state) {
    mine.time([&] { ours.run(); });
    peer.time([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
      benchmark::DoNotOptimize(c.data());
    });
  }
  const double flops = 2.0 * n * n * n;
  const double ours_gflops = flops / mine.median() / 1e9, peer_gflops = flops / peer.median() / 1e9;
  state.counters["median_ms"] = mine.median() * 1e3;
  state.counters["GFLOPs"] = ours_gflops;
  state.counters["sgemm_GFLOPs"] = peer_gflops;
  state.counters["ratio_to_sgemm"] = ours_gflops / peer_gflops;
  state.counters["target_ratio"] = 0.5;
}
BENCHMARK(BM_GemmBf16VsSgemm)->Arg(1024)->ArgName("n")->UseRealTime()->Unit(benchmark::kMillisecond);

// An empty one-block kernel: the launch-to-completion floor of the device.
class EmptyOp final : public ops::Operator {
 public:
  std::string name() const override { return "empty"; }
  Status validate() const override { return Status(); }
  std::vector<ops::OpArg> signature() const override { return {}; }

 protected:
  StatusOr<ops::Kernel> emit(const ops::Target&) const override {
    isa::KernelBuilder b("empty");
    b.exit();
    NPURT_ASSIGN_OR_RETURN(isa::Image image, b.build());
    return ops::Kernel{std::move(image), 1, {}};
  }
  void compute_reference(std::span<const ops::HostArg>) const override {}
};

// Launch-to-completion latency of one small operator, next to the empty kernel's.
void latency(benchmark::State& state, const ops::Operator& op, std::map<std::string, uint64_t> scalars = {}) {
  OpRunner ours(op, std::move(scalars));
  OpRunner empty{EmptyOp()};
  Samples mine, floor;
  for (auto _ : state) {
    mine.time([&] { ours.run(); });
    floor.time([&] { empty.run(); });
  }
  state.SetLabel(op.name() + ", grid " + std::to_string(ours.grid()));
  state.counters["median_us"] = mine.median() * 1e6;
  state.counters["empty_kernel_us"] = floor.median() * 1e6;
  state.counters["ratio_to_empty"] = mine.median() / floor.median();
}

void BM_LatencyGemvBf16_640x640(benchmark::State& s) { latency(s, ops::Gemv({.m = 640, .k = 640, .weight = DType::kBF16})); }
void BM_LatencyGemvQ8_0_640x640(benchmark::State& s) { latency(s, ops::Gemv({.m = 640, .k = 640, .weight = DType::kQ8_0})); }
void BM_LatencyAdd640(benchmark::State& s) {
  latency(s, ops::Elementwise({.kind = ops::ElementwiseKind::kAdd, .n = 640}));
}
BENCHMARK(BM_LatencyGemvBf16_640x640)->UseRealTime();
BENCHMARK(BM_LatencyGemvQ8_0_640x640)->UseRealTime();
BENCHMARK(BM_LatencyAdd640)->UseRealTime();

}  // namespace
}  // namespace npurt::bench
