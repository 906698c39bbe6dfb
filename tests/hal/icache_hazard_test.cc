// The stale-instruction mechanism, observable: cores keep cached lines of image A
// after B is uploaded at A's recycled address, unless the launch is the first on a
// fresh stream.
#include <gtest/gtest.h>

#include "sim_test_util.h"

namespace npurt {
namespace {

using namespace npurt::testing;
using hal::KernelArg;

struct Fixture {
  std::shared_ptr<hal::Device> dev;
  hal::StreamId stream{};
  hal::DeviceAddr x{}, y{}, out{};
  std::vector<float> hx, hy;
  static constexpr size_t kN = 64 * 8;

  explicit Fixture(bool sanitize) {
    hal::SimOptions o;
    o.sanitize = sanitize;
    dev = make_sim(o);
    stream = dev->create_stream().value();
    hx = random_floats(kN, 11);
    hy = random_floats(kN, 12);
    x = put(*dev, stream, hx);
    y = put(*dev, stream, hy);
    out = put(*dev, stream, std::vector<float>(kN, 0.f));
  }

  Status run(hal::StreamId s, hal::DeviceAddr code) {
    const std::vector<float> poison(kN, std::nanf(""));
    NPURT_RETURN_IF_ERROR(dev->copy_to_device(s, out, poison.data(), kN * 4));
    NPURT_RETURN_IF_ERROR(dev->launch(s, {code, 8, {KernelArg::buffer(x, kN * 4), KernelArg::buffer(y, kN * 4),
                                                    KernelArg::buffer(out, kN * 4)}}));
    return dev->stream_synchronize(s);
  }

  std::vector<float> output() { return get<float>(*dev, stream, out, kN); }

  bool output_is(float (*f)(float, float)) {
    const auto o = output();
    for (size_t i = 0; i < kN; ++i) {
      if (o[i] != f(hx[i], hy[i])) return false;
    }
    return true;
  }
};

float add(float a, float b) { return a + b; }
float mul(float a, float b) { return a * b; }

// A and B have identical layouts (same name length, same code length) and differ
// only in the sub-op of one instruction, so B lands exactly where A was.
isa::Image image_a() { return elementwise_kernel("A", isa::BinOp::kAdd).value(); }
isa::Image image_b() { return elementwise_kernel("B", isa::BinOp::kMul).value(); }

TEST(StaleInstructions, ReusedStreamExecutesTheOldImageAtARecycledAddress) {
  Fixture f(/*sanitize=*/false);
  const auto a = upload(*f.dev, image_a());
  NPURT_ASSERT_OK(f.run(f.stream, a));
  ASSERT_TRUE(f.output_is(add));

  NPURT_ASSERT_OK(f.dev->free(a));
  const auto b = upload(*f.dev, image_b());
  ASSERT_EQ(b, a) << "the allocator must recycle A's block for B";

  // Same stream: the cores still hold A's lines, so B computes A's function.
  NPURT_ASSERT_OK(f.run(f.stream, b));
  EXPECT_TRUE(f.output_is(add)) << "expected the stale image's result (x + y)";
  EXPECT_FALSE(f.output_is(mul));

  // A fresh stream's first launch invalidates the caches: B runs correctly.
  auto fresh = f.dev->create_stream().value();
  NPURT_ASSERT_OK(f.run(fresh, b));
  EXPECT_TRUE(f.output_is(mul));
  EXPECT_EQ(f.dev->counters().hazard_stale_fetch, 0u) << "no sanitizer, no reports";
}

TEST(StaleInstructions, SanitizerReportsTheStaleFetch) {
  Fixture f(/*sanitize=*/true);
  const auto a = upload(*f.dev, image_a());
  NPURT_ASSERT_OK(f.run(f.stream, a));
  NPURT_ASSERT_OK(f.dev->free(a));
  const auto b = upload(*f.dev, image_b());
  ASSERT_EQ(b, a);

  Status st = f.run(f.stream, b);
  EXPECT_EQ(st.code(), StatusCode::kHazard) << st.to_string();
  EXPECT_TRUE(contains(st, "stale instruction fetch")) << st.to_string();
  EXPECT_TRUE(contains(st, "kernel 'B'")) << st.to_string();
  char addr[32];
  std::snprintf(addr, sizeof addr, "image at 0x%llx", static_cast<unsigned long long>(b.value()));
  EXPECT_TRUE(contains(st, addr)) << st.to_string();
  EXPECT_GE(f.dev->counters().hazard_stale_fetch, 1u);

  // The hazard faulted only that stream: a fresh one runs B cleanly.
  const auto hazards = f.dev->counters().hazard_stale_fetch;
  auto fresh = f.dev->create_stream().value();
  NPURT_ASSERT_OK(f.run(fresh, b));
  EXPECT_EQ(f.dev->counters().hazard_stale_fetch, hazards);
  f.stream = fresh;
  EXPECT_TRUE(f.output_is(mul));
}

TEST(StaleInstructions, FirstLaunchOnFreshStreamInvalidatesOnlyOnce) {
  Fixture f(false);
  const auto a = upload(*f.dev, image_a());
  const auto before = f.dev->counters();
  NPURT_ASSERT_OK(f.run(f.stream, a));
  NPURT_ASSERT_OK(f.run(f.stream, a));
  const auto d = f.dev->counters() - before;
  EXPECT_EQ(d.icache_invalidations, 8u) << "8 cores used, invalidated by the first launch only";
  EXPECT_GT(d.icache_hits, 0u);
  // The second launch found every line cached: misses come from the first only.
  const auto misses_first = d.icache_misses;
  NPURT_ASSERT_OK(f.run(f.stream, a));
  EXPECT_EQ((f.dev->counters() - before).icache_misses, misses_first);
}

// A stale line may hold bytes that are not instructions at all (A's constants after
// its short code); a core that reaches them faults the kernel cleanly.
TEST(StaleInstructions, UndecodableStaleBytesFaultTheKernelCleanly) {
  using namespace isa;
  auto make = [](const char* name, int nops, bool with_constants) {
    KernelBuilder b(name);
    const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
    const Reg zero{0}, v{1};
    const Tile t{0};
    if (with_constants) b.add_constants(std::vector<uint8_t>(256, 0xEE));  // 0xEE is no opcode
    for (int i = 0; i < nops; ++i) b.nop();
    b.li(zero, 0);
    b.li(v, 0x40400000);  // 3.0f
    b.tdef(t, DType::kF32, 1, 1);
    b.tfill(t, v);
    b.tst(t, out, zero, DType::kF32);
    return b.build().value();
  };
  auto dev = make_sim();
  const uint64_t line = dev->info().icache_line_bytes;
  // A: short code whose last cache line runs on into junk constants.
  int lead = 0;
  Image a = make("A", lead, true);
  while ((a.layout().code_offset + a.layout().code_bytes) % line == 0) a = make("A", ++lead, true);
  // B: the same header, code that runs past A's code end into that line.
  const Image b = make("B", lead + 16, false);
  ASSERT_EQ(a.layout().code_offset, b.layout().code_offset);

  auto s = dev->create_stream().value();
  const auto out = put(*dev, s, std::vector<float>{0.f});
  const auto addr_a = upload(*dev, a);
  NPURT_ASSERT_OK(dev->launch(s, {addr_a, 1, {KernelArg::buffer(out, 4)}}));
  NPURT_ASSERT_OK(dev->stream_synchronize(s));
  NPURT_ASSERT_OK(dev->free(addr_a));
  const auto addr_b = upload(*dev, b);
  ASSERT_EQ(addr_b, addr_a);

  NPURT_ASSERT_OK(dev->launch(s, {addr_b, 1, {KernelArg::buffer(out, 4)}}));
  Status st = dev->stream_synchronize(s);
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
  EXPECT_TRUE(contains(st, "cannot decode instruction")) << st.to_string();
  EXPECT_TRUE(contains(st, "kernel 'B'")) << st.to_string();

  auto fresh = dev->create_stream().value();
  NPURT_ASSERT_OK(dev->launch(fresh, {addr_b, 1, {KernelArg::buffer(out, 4)}}));
  NPURT_ASSERT_OK(dev->stream_synchronize(fresh));
  EXPECT_EQ(get<float>(*dev, fresh, out, 1)[0], 3.f);
}

}  // namespace
}  // namespace npurt
