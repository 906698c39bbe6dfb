// Kernels from images (ops::ImageOperator): compiled alone they keep their bytes, and
// as steps of fused or separate sequences (after steps with constants of their own,
// so their constant loads are moved) they compute what the library operator does.
#include "npurt/ops/image_operator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "npurt/base/math.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/rope.h"
#include "ops/random_inputs.h"
#include "value_or_die.h"

namespace npurt::ops {
namespace {

using graph::CompiledSequence;
using graph::Dispatch;
using graph::OperatorSequence;
using isa::DType;

using npurt::testing::value_or_die;

// Two RoPEs over the same 256 values with different head sizes: both carry their
// frequency exponents as constants, so the second one's section lands after the
// first's in a fused kernel.
RopeParams rope_a() { return {.n_heads = 4, .head_dim = 64}; }
RopeParams rope_b() { return {.n_heads = 2, .head_dim = 128}; }
constexpr uint64_t kValues = 256;

std::shared_ptr<ImageOperator> from_library(const Operator& op, const Target& target) {
  Kernel k = value_or_die(op.compile(target));
  ImageOperatorParams p{k.image, k.grid, {}, {}};
  for (const isa::ArgSpec& a : k.args) {
    if (!a.is_scalar()) p.elements[a.name] = a.elements;
  }
  return std::make_shared<ImageOperator>(std::move(p));
}

// x -> rope_a -> mid -> (rope_b as `second`) -> out, at position 11.
std::vector<uint8_t> run_chain(std::shared_ptr<const Operator> second, Dispatch d, const std::vector<uint8_t>& x) {
  auto rt = value_or_die(Runtime::create("sim", {.cores = 4}));
  auto first = std::make_shared<Rope>(rope_a());
  OperatorSequence seq("chain", {{first, {"x", "mid", "pos", "base"}}, {second, {"mid", "out", "pos", "base"}}},
                       {"x"}, {"out"}, {{"x", kValues}, {"mid", kValues}, {"out", kValues}}, d);
  auto run = value_or_die(seq.compile(*rt));
  View xv = value_or_die(run->get_buffer("x"));
  std::memcpy(xv.data(), x.data(), x.size());
  EXPECT_TRUE(run->call({{"pos", int64_t{11}}, {"base", 10000.0}}).ok());
  View out = value_or_die(run->get_buffer("out"));
  ReadGuard g = value_or_die(rt->memory().read(out));
  return {g.bytes().begin(), g.bytes().end()};
}

std::vector<uint8_t> random_f32(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  return testing::random_bytes_for(isa::ArgSpec::buffer("x", isa::Access::kIn, DType::kF32, n), rng);
}

TEST(ImageOperator, CompiledAloneKeepsTheImagesBytes) {
  const Target t{.cores = 4};
  for (const Operator* op : std::initializer_list<const Operator*>{
           new Rope(rope_a()), new Elementwise({.kind = ElementwiseKind::kAdd, .n = 4096})}) {
    const Kernel lib = value_or_die(op->compile(t));
    const Kernel again = value_or_die(from_library(*op, t)->compile(t));
    EXPECT_TRUE(std::ranges::equal(lib.image.bytes(), again.image.bytes())) << op->name();
    EXPECT_EQ(lib.grid, again.grid);
    delete op;
  }
}

TEST(ImageOperator, FusedAfterAStepWithConstantsEqualsTheLibraryOperator) {
  const auto x = random_f32(kValues, 3);
  auto lib = std::make_shared<Rope>(rope_b());
  auto img = from_library(*lib, Target{.cores = 4});
  for (Dispatch d : {Dispatch::kFused, Dispatch::kSeparate}) {
    const std::vector<uint8_t> want = run_chain(lib, d, x);
    const std::vector<uint8_t> got = run_chain(img, d, x);
    EXPECT_EQ(got, want) << (d == Dispatch::kFused ? "fused" : "separate");
    // And both are RoPE: against the host reference of the chain.
    std::vector<uint8_t> mid(kValues * 4), out(kValues * 4);
    std::vector<uint8_t> xin = x;
    ASSERT_TRUE(Rope(rope_a())
                    .reference(std::vector<HostArg>{HostArg::buffer(xin), HostArg::buffer(mid), HostArg::i64(11),
                                                    HostArg::f32(10000.f)})
                    .ok());
    ASSERT_TRUE(Rope(rope_b())
                    .reference(std::vector<HostArg>{HostArg::buffer(mid), HostArg::buffer(out), HostArg::i64(11),
                                                    HostArg::f32(10000.f)})
                    .ok());
    EXPECT_LT(rel_l2(isa::to_f32(got, DType::kF32), isa::to_f32(out, DType::kF32)), 1e-5);
  }
}

TEST(ImageOperator, RefusesAnExitBeforeTheEndAndMissingSizes) {
  isa::KernelBuilder b("early");
  const uint8_t x = b.arg_buffer("x", isa::Access::kOut, DType::kF32);
  (void)x;
  b.exit();
  b.nop();
  b.exit();
  const isa::Image image = value_or_die(b.build());
  Status s = ImageOperator({image, 1, {{"x", 16}}, {}}).validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("instruction 0 (exit)"), std::string::npos) << s.message();

  isa::KernelBuilder ok("fine");
  ok.arg_buffer("x", isa::Access::kOut, DType::kF32);
  ok.exit();
  const isa::Image fine = value_or_die(ok.build());
  s = ImageOperator({fine, 1, {}, {}}).validate();
  EXPECT_NE(s.message().find("buffer argument 'x'"), std::string::npos) << s.message();
  s = ImageOperator({fine, 1, {{"x", 16}, {"y", 4}}, {}}).validate();
  EXPECT_NE(s.message().find("'y', which is no buffer argument"), std::string::npos) << s.message();
  s = ImageOperator({fine, 0, {{"x", 16}}, {}}).validate();
  EXPECT_NE(s.message().find("'grid'"), std::string::npos) << s.message();
  EXPECT_TRUE(ImageOperator({fine, 1, {{"x", 16}}, {}}).validate().ok());
  // No reference given: a clear error, not a silent no-op.
  std::vector<uint8_t> buf(64);
  s = ImageOperator({fine, 1, {{"x", 16}}, {}}).reference(std::vector<HostArg>{HostArg::buffer(buf)});
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
}

}  // namespace
}  // namespace npurt::ops
