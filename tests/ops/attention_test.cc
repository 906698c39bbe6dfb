#include "npurt/ops/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <random>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using testing::Bytes;

struct Case {
  DecodeAttentionParams p;
  std::vector<int64_t> lens;
};

// A cache whose attended positions [first, len) hold random values in [-1, 1) and
// every other position NaN bytes: any read outside the range poisons the output.
Bytes cache_bytes(const DecodeAttentionParams& p, int64_t len, std::mt19937& rng) {
  const size_t esize = isa::dtype_size(p.kv_dtype);
  const size_t row = size_t{p.n_kv_heads} * p.head_dim;
  Bytes b(size_t{p.max_len} * row * esize, 0xFF);
  const int64_t first = p.window ? std::max<int64_t>(0, len - p.window) : 0;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v((len - first) * row);
  for (float& x : v) x = u(rng);
  isa::from_f32(v.data(), p.kv_dtype, b.data() + first * row * esize, v.size());
  return b;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const DecodeAttentionParams& p = info.param.p;
  return std::string(isa::dtype_name(p.kv_dtype)) + "_h" + std::to_string(p.n_heads) + "kv" +
         std::to_string(p.n_kv_heads) + "d" + std::to_string(p.head_dim) + "_w" + std::to_string(p.window) +
         (p.split_positions ? "_split" : "") + "_" + std::to_string(info.index);
}

class DecodeAttentionShapes : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeAttentionShapes, MatchesReference) {
  const Case& c = GetParam();
  DecodeAttention op(c.p);
  std::mt19937 rng(c.p.head_dim * 7 + c.p.max_len);
  for (int64_t len : c.lens) {
    OpHarness h(op, static_cast<uint32_t>(len));
    h.set_bytes("k_cache", cache_bytes(c.p, len, rng));
    h.set_bytes("v_cache", cache_bytes(c.p, len, rng));
    h.set_scalar("len", HostArg::i64(len));
    ASSERT_TRUE(h.runs());
    EXPECT_TRUE(h.close_to_reference("out", tolerance(c.p.kv_dtype))) << "len " << len;
  }
}

constexpr DecodeAttentionParams kGemma{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 1024};

DecodeAttentionParams with(DecodeAttentionParams p, uint32_t window, DType dtype, uint32_t tile_t = 0,
                           uint32_t cores = 0, float scale = 0) {
  return {.n_heads = p.n_heads,
          .n_kv_heads = p.n_kv_heads,
          .head_dim = p.head_dim,
          .max_len = p.max_len,
          .window = window,
          .scale = scale,
          .kv_dtype = dtype,
          .tile_t = tile_t,
          .cores = cores};
}

std::vector<Case> cases() {
  const std::vector<int64_t> gemma_lens{1, 7, 513, 1024};
  return {
      // Gemma-3 layers: global and sliding-window; scale 1 as for its pre-scaled q.
      {with(kGemma, 0, DType::kF32), gemma_lens},
      {with(kGemma, 512, DType::kF32, 0, 0, 1.0f), gemma_lens},
      {with(kGemma, 512, DType::kF16), {7, 1024}},
      {with(kGemma, 0, DType::kBF16, 0, 0, 1.0f), {513, 1024}},
      // Explicit tiles with a short last tile, split over 3 cores (2 sub-groups of 2 heads).
      {with(kGemma, 512, DType::kF32, 100, 3), {1, 250, 513, 1024}},
      {with(kGemma, 0, DType::kF16, 64, 1), {1, 65, 1000}},
      // MHA: one query head per kv head.
      {with({.n_heads = 2, .n_kv_heads = 2, .head_dim = 64, .max_len = 100}, 0, DType::kF32, 16, 3), {1, 37, 100}},
      {with({.n_heads = 2, .n_kv_heads = 2, .head_dim = 64, .max_len = 100}, 30, DType::kBF16, 7), {29, 31, 100}},
      // GQA with three kv heads on three blocks, odd sizes everywhere.
      {with({.n_heads = 6, .n_kv_heads = 3, .head_dim = 40, .max_len = 77}, 25, DType::kF32, 10, 3), {1, 24, 26, 77}},
      {with({.n_heads = 8, .n_kv_heads = 2, .head_dim = 33, .max_len = 50}, 0, DType::kF16, 9, 4), {50}},
      // A cache for the full Gemma-3 context: many tiles of online softmax.
      {with({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 32768}, 0, DType::kF16), {8192}},
      {with({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 32768}, 512, DType::kBF16), {30000}},
  };
}

// The same shapes with the positions split over the blocks (chunks of tile_t, or the
// default chunk).
std::vector<Case> split_cases() {
  std::vector<Case> all = cases();
  for (Case& c : all) c.p.split_positions = true;
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ops, DecodeAttentionShapes, ::testing::ValuesIn(cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Split, DecodeAttentionShapes, ::testing::ValuesIn(split_cases()), case_name);

std::vector<uint32_t> out_bits(const OpHarness& h) {
  const Bytes b = h.device_bytes("out");
  std::vector<uint32_t> w(b.size() / 4);
  std::memcpy(w.data(), b.data(), b.size());
  return w;
}

// Split positions: the bits depend on the chunks alone, not on how many blocks share
// them (1, 3 or 8 cores; chunks of 64 positions, so a global layer at 1000 positions
// has 16 of them and a combine of more than one group of 32 needs max_len 4096).
TEST(DecodeAttention, SplitPositionsGiveTheSameBitsOnEveryCoreCount) {
  for (const auto& [window, len, max_len] : {std::tuple{0u, 1000, 1024u}, std::tuple{512u, 777, 1024u},
                                             std::tuple{0u, 4000, 4096u}, std::tuple{0u, 3, 1024u}}) {
    std::vector<uint32_t> first;
    for (uint32_t cores : {1u, 3u, 8u}) {
      DecodeAttentionParams p = with({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = max_len}, window,
                                     DType::kF32, 64, cores);
      p.split_positions = true;
      DecodeAttention op(p);
      std::mt19937 rng(len);
      OpHarness h(op, 3);
      h.set_bytes("k_cache", cache_bytes(p, len, rng));
      h.set_bytes("v_cache", cache_bytes(p, len, rng));
      h.set_scalar("len", HostArg::i64(len));
      ASSERT_TRUE(h.runs());
      EXPECT_TRUE(h.close_to_reference("out", 1e-5)) << "cores " << cores << " len " << len;
      if (first.empty()) {
        first = out_bits(h);
        continue;
      }
      EXPECT_EQ(out_bits(h), first) << "cores " << cores << " len " << len << " window " << window;
    }
  }
}

// A grid barrier needs one core per block: more blocks than the target's cores is
// refused by name instead of compiling a kernel no device could run; so is a chunk
// larger than local memory.
TEST(DecodeAttention, SplitPositionsRejectMoreBlocksThanCoresAndChunksPastLocalMemory) {
  DecodeAttentionParams p = with(kGemma, 0, DType::kF32, 0, 16);
  p.split_positions = true;
  const StatusOr<Kernel> k = DecodeAttention(p).compile(Target{.cores = 8});
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("cores"), std::string::npos) << k.status().to_string();
  p = with(kGemma, 0, DType::kF32, 1024);
  p.split_positions = true;
  const StatusOr<Kernel> big = DecodeAttention(p).compile(Target{});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("tile_t"), std::string::npos) << big.status().to_string();
}

// The single attended position gets all the weight: out = v[len - 1] exactly.
TEST(DecodeAttention, SinglePositionCopiesValue) {
  DecodeAttention op(with(kGemma, 1, DType::kF32));
  std::mt19937 rng(5);
  OpHarness h(op);
  h.set_bytes("k_cache", cache_bytes(op.params(), 300, rng));
  h.set_bytes("v_cache", cache_bytes(op.params(), 300, rng));
  h.set_scalar("len", HostArg::i64(300));
  ASSERT_TRUE(h.runs());
  const std::vector<float> v = isa::to_f32(h.input_bytes("v_cache"), DType::kF32);
  const std::vector<float> out = h.device_f32("out");
  for (uint32_t head = 0; head < 4; ++head) {
    for (uint32_t d = 0; d < 256; ++d) ASSERT_FLOAT_EQ(out[head * 256 + d], v[299 * 256 + d]) << head << " " << d;
  }
}

// len outside [1, max_len] fails the launch instead of reading past the cache.
TEST(DecodeAttention, LenOutOfRangeFaults) {
  for (uint32_t window : {0u, 512u}) {
    DecodeAttention op(with(kGemma, window, DType::kF16, 128, 3));
    for (int64_t len : {int64_t{1025}, int64_t{5000}, int64_t{0}, int64_t{-3}}) {
      OpHarness h(op);
      h.set_scalar("len", HostArg::i64(len));
      const Status s = h.run();
      EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << "window " << window << " len " << len << ": " << s.to_string();
    }
  }
}

TEST(DecodeAttention, RejectsBadParameters) {
  const DecodeAttentionParams ok{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .max_len = 128};
  auto bad_with = [&](auto edit) {
    DecodeAttentionParams p = ok;
    edit(p);
    return p;
  };
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.n_heads = 0; }), "n_heads");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.n_kv_heads = 0; }), "n_kv_heads");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.n_kv_heads = 3; }), "n_kv_heads");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.head_dim = 0; }), "head_dim");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.max_len = 0; }), "max_len");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.max_len = 1u << 31; }), "max_len");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.scale = -1.f; }), "scale");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.scale = NAN; }), "scale");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.kv_dtype = DType::kQ8_0; }), "kv_dtype");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.kv_dtype = DType::kI32; }), "kv_dtype");
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.tile_t = 129; }), "tile_t");
  // Sizes that do not fit the target's local memory.
  const Target small{.cores = 1, .local_bytes = 16u << 10};
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.tile_t = 128; }), "tile_t", small);
  expect_rejects<DecodeAttention>(bad_with([](auto& p) { p.head_dim = 4096; }), "head_dim", small);
}

}  // namespace
}  // namespace npurt::ops
