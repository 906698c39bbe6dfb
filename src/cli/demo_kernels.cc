#include "cli/demo_kernels.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "npurt/base/math.h"
#include "isa/elementwise_kernel.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/hal/handles.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"

namespace npurt::cli {
namespace {

using namespace npurt::isa;
using hal::KernelArg;

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One demo case: an image, its inputs (raw bytes per buffer argument), its output
// size and a host reference.
struct Case {
  std::string name, shape;
  StatusOr<Image> image;
  uint32_t grid;
  std::vector<std::vector<uint8_t>> inputs;
  size_t out_floats;
  std::vector<double> ref;
  double tolerance;
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return {p, p + v.size() * sizeof(T)};
}

Case vector_add(std::mt19937& rng) {
  constexpr uint32_t kTile = 1024, kN = 64 * kTile;
  const KernelBuilder b = elementwise_builder("vector_add", BinOp::kAdd, kTile);
  const auto hx = random_vector(kN, rng), hy = random_vector(kN, rng);
  std::vector<double> ref(kN);
  for (uint32_t i = 0; i < kN; ++i) ref[i] = double(hx[i]) + hy[i];
  return {"vector_add f32", "65536", b.build(), kN / kTile, {bytes_of(hx), bytes_of(hy)}, kN, ref, 1e-7};
}

Case gemv_bf16(std::mt19937& rng) {
  constexpr uint32_t kM = 512, kK = 640, kRows = 32;
  KernelBuilder b("gemv_bf16");
  const uint8_t a = b.arg_buffer("A", Access::kIn, DType::kBF16);
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t y = b.arg_buffer("y", Access::kOut, DType::kF32);
  const Reg bid{0}, off_a{1}, off_y{2}, zero{3};
  const Tile ta{0}, tx{1}, ty{2};
  b.block_id(bid);
  b.li(zero, 0);
  b.alui(AluOp::kMul, off_a, bid, kRows * kK * 2);
  b.alui(AluOp::kMul, off_y, bid, kRows * 4);
  b.tdef(ta, DType::kBF16, kRows, kK, 0);
  b.tdef(tx, DType::kF32, 1, kK, kRows * kK * 2);
  b.tdef(ty, DType::kF32, kRows, 1, kRows * kK * 2 + kK * 4);
  b.tld(tx, x, zero, DType::kF32);
  b.tld(ta, a, off_a, DType::kBF16);
  b.tmma(ty, ta, tx, kTransB);
  b.tst(ty, y, off_y, DType::kF32);
  const auto ha = random_vector(size_t{kM} * kK, rng), hx = random_vector(kK, rng);
  std::vector<uint16_t> a16(ha.size());
  std::vector<float> a_rounded(ha.size());
  for (size_t i = 0; i < ha.size(); ++i) {
    a16[i] = isa::f32_to_bf16(ha[i]);
    a_rounded[i] = isa::bf16_to_f32(a16[i]);
  }
  std::vector<double> ref(kM, 0.0);
  for (uint32_t m = 0; m < kM; ++m) {
    for (uint32_t k = 0; k < kK; ++k) ref[m] += double(a_rounded[size_t{m} * kK + k]) * hx[k];
  }
  return {"gemv bf16", "512x640", b.build(), kM / kRows, {bytes_of(a16), bytes_of(hx)}, kM, ref, 1e-5};
}

Case gemm_f32(std::mt19937& rng) {
  constexpr uint32_t kN = 128, kRows = 32;
  KernelBuilder b("gemm_f32");
  const uint8_t a = b.arg_buffer("A", Access::kIn, DType::kF32);
  const uint8_t bm = b.arg_buffer("B", Access::kIn, DType::kF32);
  const uint8_t c = b.arg_buffer("C", Access::kOut, DType::kF32);
  const Reg bid{0}, off{1}, zero{2};
  const Tile ta{0}, tb{1}, tc{2};
  b.block_id(bid);
  b.li(zero, 0);
  b.alui(AluOp::kMul, off, bid, kRows * kN * 4);
  b.tdef(ta, DType::kF32, kRows, kN, 0);
  b.tdef(tb, DType::kF32, kN, kN, kRows * kN * 4);
  b.tdef(tc, DType::kF32, kRows, kN, kRows * kN * 4 + kN * kN * 4);
  b.tld(ta, a, off, DType::kF32);
  b.tld(tb, bm, zero, DType::kF32);
  b.tmma(tc, ta, tb);
  b.tst(tc, c, off, DType::kF32);
  const auto ha = random_vector(kN * kN, rng), hb = random_vector(kN * kN, rng);
  std::vector<double> ref(kN * kN, 0.0);
  for (uint32_t i = 0; i < kN; ++i)
    for (uint32_t k = 0; k < kN; ++k)
      for (uint32_t j = 0; j < kN; ++j) ref[i * kN + j] += double(ha[i * kN + k]) * hb[k * kN + j];
  return {"gemm f32", "128x128x128", b.build(), kN / kRows, {bytes_of(ha), bytes_of(hb)}, kN * kN, ref, 1e-6};
}

Case softmax_rows(std::mt19937& rng) {
  constexpr uint32_t kRows = 64, kCols = 1000;
  KernelBuilder b("softmax");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg bid{0}, off{1};
  const Tile t{0}, s{1};
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, kCols * 4);
  b.tdef(t, DType::kF32, 1, kCols, 0);
  b.tdef(s, DType::kF32, 1, 1, kCols * 4);
  b.tld(t, x, off, DType::kF32);
  b.tred(RedOp::kMax, s, t);
  b.tbin(BinOp::kSub, t, t, s, kBcastCol);
  b.tun(UnOp::kExp, t, t);
  b.tred(RedOp::kSum, s, t);
  b.tbin(BinOp::kDiv, t, t, s, kBcastCol);
  b.tst(t, out, off, DType::kF32);
  auto hx = random_vector(kRows * kCols, rng);
  for (float& v : hx) v *= 8.f;
  std::vector<double> ref(hx.size());
  for (uint32_t r = 0; r < kRows; ++r) {
    const float* row = &hx[r * kCols];
    const double m = *std::max_element(row, row + kCols);
    double sum = 0;
    for (uint32_t c = 0; c < kCols; ++c) sum += std::exp(row[c] - m);
    for (uint32_t c = 0; c < kCols; ++c) ref[r * kCols + c] = std::exp(row[c] - m) / sum;
  }
  return {"softmax rows", "64x1000", b.build(), kRows, {bytes_of(hx)}, kRows * kCols, ref, 1e-6};
}

// Stages inputs, runs (cold once, then warm for timing), reads back, compares.
// `owned` keeps the case's blocks until the stream is done with them.
StatusOr<DemoResult> run_on_stream(Runtime& rt, hal::StreamId s, const Case& c, hal::DeviceAddr code,
                                   std::vector<hal::DeviceBlock>& owned) {
  hal::Device& dev = rt.device();
  hal::LaunchParams p{code, c.grid, {}};
  for (const auto& in : c.inputs) {
    NPURT_ASSIGN_OR_RETURN(owned.emplace_back(), hal::DeviceBlock::allocate(rt.shared_device(), in.size()));
    NPURT_RETURN_IF_ERROR(dev.copy_to_device(s, owned.back().addr(), in.data(), in.size()));
    p.args.push_back(KernelArg::buffer(owned.back().addr(), in.size()));
  }
  const uint64_t out_bytes = c.out_floats * 4;
  NPURT_ASSIGN_OR_RETURN(owned.emplace_back(), hal::DeviceBlock::allocate(rt.shared_device(), out_bytes));
  const hal::DeviceAddr out = owned.back().addr();
  std::vector<float> host(c.out_floats, std::nanf(""));  // poison: unwritten outputs fail the check
  NPURT_RETURN_IF_ERROR(dev.copy_to_device(s, out, host.data(), out_bytes));
  p.args.push_back(KernelArg::buffer(out, out_bytes));

  std::vector<double> us;
  for (int i = 0; i < 21; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    NPURT_RETURN_IF_ERROR(dev.launch(s, p));
    NPURT_RETURN_IF_ERROR(dev.stream_synchronize(s));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin() + 1, us.end());  // the first (cold) run is not timed
  NPURT_RETURN_IF_ERROR(dev.copy_to_host(s, host.data(), out, out_bytes));
  NPURT_RETURN_IF_ERROR(dev.stream_synchronize(s));
  return DemoResult{c.name, c.shape, rel_l2(host, c.ref), c.tolerance, us[us.size() / 2 + 1],
                    c.image->layout().code_bytes};
}

StatusOr<DemoResult> run_case(Runtime& rt, exec::StreamPool& streams, const Case& c) {
  if (!c.image.ok()) return c.image.status().with_context("compiling " + c.name);
  NPURT_ASSIGN_OR_RETURN(exec::CodeHandle code, rt.registry().register_image(*c.image));
  // Code was just published, possibly at the address of the previous case's image:
  // the pool hands out a fresh, primed stream.
  NPURT_ASSIGN_OR_RETURN(exec::SlotLease lease, streams.acquire());
  std::vector<hal::DeviceBlock> owned;
  StatusOr<DemoResult> result = run_on_stream(rt, lease.stream, c, code.address(), owned);
  Status st = streams.finish(lease);
  if (!result.ok()) return result.status().with_context(c.name);
  if (!st.ok()) return st;
  return result;
}

}  // namespace

StatusOr<std::vector<DemoResult>> run_demo_kernels(Runtime& rt, uint32_t seed) {
  std::mt19937 rng(seed);
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<exec::StreamPool> streams, rt.make_stream_pool("demo"));
  std::vector<DemoResult> results;
  for (auto make : {vector_add, gemv_bf16, gemm_f32, softmax_rows}) {
    NPURT_ASSIGN_OR_RETURN(DemoResult r, run_case(rt, *streams, make(rng)));
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace npurt::cli
