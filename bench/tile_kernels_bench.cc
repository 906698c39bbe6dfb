// Tile kernel throughput, judged against the single-core f32 FMA peak measured in the
// same process with the same implementation (reported as the peak_ratio counter).
//
// Counters: GFLOP/s (2*m*n*k per matmul), peak_ratio (achieved / peak), elements/s
// for the small elementwise calls, which mostly measure per-call overhead.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "fma_peak.h"
#include "hal/sim/tile_kernels.h"

namespace npurt::sim {
namespace {

using isa::DType;

double PeakGflops() { return bench::fma_peak_gflops(); }

// Adds GFLOP/s and peak_ratio counters for `flops` floating-point operations per
// iteration. Both are rates, so the library divides them by the measured time.
void SetFlopCounters(benchmark::State& state, double flops) {
  const double total = flops * static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(total * 1e-9, benchmark::Counter::kIsRate);
  state.counters["peak_ratio"] =
      benchmark::Counter(total / (PeakGflops() * 1e9), benchmark::Counter::kIsRate);
}

void BM_FmaPeak(benchmark::State& state) {
  constexpr uint64_t kRounds = 1 << 16;
  uint64_t flops = 0;
  for (auto _ : state) flops = tile_kernels_fma_probe(kRounds);
  SetFlopCounters(state, static_cast<double>(flops));
}
BENCHMARK(BM_FmaPeak);

// Random elements of `type` in [-1, 1] (bf16 / f16 as bit patterns).
std::vector<uint8_t> RandomArray(DType type, size_t count) {
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(gen);
  const size_t size = type == DType::kF32 ? 4 : 2;
  std::vector<uint8_t> bytes(count * size);
  convert(values.data(), DType::kF32, bytes.data(), type, count);
  return bytes;
}

struct MatmulCase {
  size_t m, n, k;
  DType a_type, b_type;
  bool trans_b;
};

void BM_Matmul(benchmark::State& state, MatmulCase c) {
  const std::vector<uint8_t> a = RandomArray(c.a_type, c.m * c.k);
  const std::vector<uint8_t> b = RandomArray(c.b_type, c.k * c.n);
  std::vector<float> out(c.m * c.n);
  for (auto _ : state) {
    matmul(a.data(), c.a_type, b.data(), c.b_type, out.data(), c.m, c.n, c.k, c.trans_b, false);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetFlopCounters(state, 2.0 * static_cast<double>(c.m * c.n * c.k));
}

void BM_Binary(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> a(n, 1.5f), b(n, 0.75f), out(n);
  for (auto _ : state) {
    binary(isa::BinOp::kAdd, a.data(), b.data(), out.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_Binary)->Arg(64)->Arg(4096);

void BM_UnaryGelu(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> in(n, 0.5f), out(n);
  for (auto _ : state) {
    unary(isa::UnOp::kGeluTanh, in.data(), out.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_UnaryGelu)->Arg(64)->Arg(4096);

void BM_ReduceSumRows(benchmark::State& state) {
  const size_t cols = static_cast<size_t>(state.range(0));
  const size_t rows = 64;
  std::vector<float> in(rows * cols, 0.25f), out(rows);
  for (auto _ : state) {
    reduce_rows(isa::RedOp::kSum, in.data(), rows, cols, out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(rows * cols));
}
BENCHMARK(BM_ReduceSumRows)->Arg(64)->Arg(1024);

void BM_ConvertBF16ToF32(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t> in = RandomArray(DType::kBF16, n);
  std::vector<float> out(n);
  for (auto _ : state) {
    convert(in.data(), DType::kBF16, out.data(), DType::kF32, n);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
}
BENCHMARK(BM_ConvertBF16ToF32)->Arg(64)->Arg(4096);

const char* TypeName(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16";
}

// Square tiles (B not transposed) and the GEMV-like dot-product shape, for f32, bf16
// and bf16 weights with f32 activations.
[[maybe_unused]] const bool kMatmulsRegistered = [] {
  const DType kTypePairs[][2] = {
      {DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}};
  std::vector<MatmulCase> cases;
  for (const auto& types : kTypePairs) {
    for (size_t s : {64, 128, 256}) cases.push_back({s, s, s, types[0], types[1], false});
    cases.push_back({128, 1, 2048, types[0], types[1], true});
  }
  for (const MatmulCase& c : cases) {
    const std::string name = std::string("BM_Matmul/") + TypeName(c.a_type) + "x" +
                             TypeName(c.b_type) + "/" + std::to_string(c.m) + "x" +
                             std::to_string(c.n) + "x" + std::to_string(c.k) +
                             (c.trans_b ? "/trans_b" : "");
    benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, c)->Unit(benchmark::kMicrosecond);
  }
  benchmark::AddCustomContext("tile_kernels_target", tile_kernels_target());
  return true;
}();

}  // namespace
}  // namespace npurt::sim
