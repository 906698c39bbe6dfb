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
#include "hal/sim/matvec_kernels.h"
#include "hal/sim/tile_kernels.h"
#include "npurt/isa/isa.h"

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

// sim::matvec_batch on one thread, weights of a quantized type in cache (rows x k
// small enough for L2) or streamed: Gproducts/s (weights times vectors per second) and
// products_per_fma (against the f32 FMA peak's products: the integer kernels form each
// product from three 7-bit digits, so this says what the digits cost next to f32).
void BM_MatVec(benchmark::State& state, DType type, size_t rows, size_t k) {
  const size_t batch = static_cast<size_t>(state.range(0));
  const bool plain = !isa::dtype_is_quantized(type);
  const size_t row_bytes = plain ? k * isa::dtype_size(type) : k / isa::dtype_block_elems(type) * isa::dtype_block_bytes(type);
  std::vector<uint8_t> w(rows * row_bytes);
  std::mt19937 gen(7);
  for (uint8_t& b : w) b = static_cast<uint8_t>(gen());
  // Every f16 scale a modest finite value (random bytes would hold infinities).
  const size_t block_bytes = plain ? w.size() : isa::dtype_block_bytes(type);
  const std::vector<size_t> halves = type == DType::kQ6_K                           ? std::vector<size_t>{208}
                                     : type == DType::kQ4_K || type == DType::kQ5_K ? std::vector<size_t>{0, 2}
                                                                                    : std::vector<size_t>{0};
  for (size_t off = 0; !plain && off < w.size(); off += block_bytes) {
    for (size_t f : halves) {
      w[off + f] = 0x00;
      w[off + f + 1] = 0x20;  // 2^-7
    }
  }
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(batch * k), y(batch * rows);
  for (float& v : x) v = dist(gen);
  for (auto _ : state) {
    matvec_batch(w.data(), type, row_bytes, rows, x.data(), k, batch, y.data(), false);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double products = static_cast<double>(rows * k * batch) * static_cast<double>(state.iterations());
  state.counters["Gproducts/s"] = benchmark::Counter(products * 1e-9, benchmark::Counter::kIsRate);
  state.counters["products_per_fma"] =
      benchmark::Counter(products / (PeakGflops() * 0.5e9), benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(
      static_cast<double>(w.size()) * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

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
  // Gemma-3-270M's GEMV shapes: a slice of the q8_0 head, the q5_0 gate and up
  // projections, the q4_K / q6_K down projection.
  const struct {
    DType type;
    const char* name;
    size_t rows, k;
  } kGemvs[] = {{DType::kQ8_0, "q8_0", 4096, 640},
                {DType::kQ5_0, "q5_0", 2048, 640},
                {DType::kQ4_K, "q4_K", 640, 2048},
                {DType::kQ6_K, "q6_K", 640, 2048},
                {DType::kBF16, "bf16", 2048, 640}};
  for (const auto& g : kGemvs) {
    const std::string name = std::string("BM_MatVec/") + g.name + "/" + std::to_string(g.rows) + "x" + std::to_string(g.k);
    benchmark::RegisterBenchmark(name.c_str(), BM_MatVec, g.type, g.rows, g.k)
        ->Arg(1)
        ->Arg(8)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::AddCustomContext("tile_kernels_target", tile_kernels_target());
  benchmark::AddCustomContext("matvec_isa", matvec_isa());
  return true;
}();

}  // namespace
}  // namespace npurt::sim
