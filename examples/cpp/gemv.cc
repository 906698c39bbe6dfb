// A one-step fused GEMV operator sequence on the simulated NPU: y = A x with bf16
// weights A (256 x 640) and f32 x. The inputs are written through raw pointers into
// the sequence's buffers, one call runs it, and the output is compared with a host
// computation by relative L2 error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "npurt/graph/operator_sequence.h"
#include "npurt/isa/numeric.h"
#include "npurt/memory/memory_context.h"
#include "npurt/ops/gemv.h"
#include "npurt/runtime/runtime.h"
#include "npurt/version.h"

namespace {

constexpr uint64_t kRows = 256, kCols = 640;

int fail(const char* what, const npurt::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  std::printf("npurt %s\n", NPURT_VERSION_STRING);

  // A runtime: one simulated NPU with its memory context and code registry. Whatever is
  // made from it keeps it alive.
  auto runtime = npurt::Runtime::create("sim", {.cores = 8});
  if (!runtime.ok()) return fail("runtime", runtime.status());
  npurt::MemoryContext& memory = (*runtime)->memory();

  // y = A x as a sequence of one step over three named buffers.
  auto gemv = std::make_shared<npurt::ops::Gemv>(
      npurt::ops::GemvParams{.m = kRows, .k = kCols, .weight = npurt::isa::DType::kBF16});
  const npurt::graph::OperatorSequence sequence("gemv", {{gemv, {"A", "x", "y"}}}, {"A", "x"}, {"y"},
                                                {{"A", kRows * kCols}, {"x", kCols}, {"y", kRows}},
                                                npurt::graph::Dispatch::kFused);
  auto compiled = sequence.compile(**runtime);
  if (!compiled.ok()) return fail("compile", compiled.status());
  npurt::graph::CompiledSequence& seq = **compiled;

  // Random inputs: weights rounded to bf16, x in f32.
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<uint16_t> a(kRows * kCols);
  std::vector<float> x(kCols);
  for (auto& v : a) v = npurt::isa::f32_to_bf16(uniform(rng));
  for (auto& v : x) v = uniform(rng);

  // Written through raw pointers into the buffers' views: the input buffers are
  // tracked, so the next call uploads what was written without a sync call.
  auto a_view = seq.get_buffer("A");
  auto x_view = seq.get_buffer("x");
  if (!a_view.ok()) return fail("get_buffer(A)", a_view.status());
  if (!x_view.ok()) return fail("get_buffer(x)", x_view.status());
  std::memcpy(a_view->data(), a.data(), a.size() * sizeof(uint16_t));
  std::memcpy(x_view->data(), x.data(), x.size() * sizeof(float));

  if (npurt::Status s = seq.call(); !s.ok()) return fail("call", s);

  // call() brought y back; read it through a guard.
  auto y_view = seq.get_buffer("y");
  if (!y_view.ok()) return fail("get_buffer(y)", y_view.status());
  auto y_bytes = memory.read(*y_view);
  if (!y_bytes.ok()) return fail("read(y)", y_bytes.status());
  std::vector<float> y(kRows);
  std::memcpy(y.data(), y_bytes->bytes().data(), y.size() * sizeof(float));

  // The host computation, in double over the same bf16 weights.
  double diff = 0, norm = 0;
  for (uint64_t r = 0; r < kRows; ++r) {
    double ref = 0;
    for (uint64_t c = 0; c < kCols; ++c) ref += double(npurt::isa::bf16_to_f32(a[r * kCols + c])) * double(x[c]);
    diff += (double(y[r]) - ref) * (double(y[r]) - ref);
    norm += ref * ref;
  }
  const double rel_l2 = std::sqrt(diff / norm);
  std::printf("gemv %llux%llu bf16: rel-L2 %.3g\n", static_cast<unsigned long long>(kRows),
              static_cast<unsigned long long>(kCols), rel_l2);
  if (!(rel_l2 <= 1e-2)) {
    std::printf("FAILED: rel-L2 above 1e-2\n");
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
