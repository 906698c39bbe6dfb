// The batched-prefill operators: WeightGemm, PrefillAttention, and the runtime-row
// forms of RmsNorm, Elementwise, StridedCopy, Embedding and Rope, each against its host
// reference on fresh random data with poisoned outputs, over awkward chunk lengths.
#include <gtest/gtest.h>

#include <cstring>
#include <span>

#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/prefill_attention.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/weight_gemm.h"
#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

constexpr uint64_t kChunkLengths[] = {1, 7, 64, 65, 511, 512};

// ---- WeightGemm ----

struct GemmCase {
  DType weight;
  uint64_t m, k, rows, runtime_rows;  // runtime_rows 0: compiled rows, no scalar
};

std::string gemm_name(const ::testing::TestParamInfo<GemmCase>& info) {
  const GemmCase& c = info.param;
  return std::string(isa::dtype_name(c.weight)) + "_" + std::to_string(c.m) + "x" + std::to_string(c.k) + "_rows" +
         std::to_string(c.rows) + (c.runtime_rows ? "_at" + std::to_string(c.runtime_rows) : "");
}

class WeightGemmShapes : public ::testing::TestWithParam<GemmCase> {};

TEST_P(WeightGemmShapes, MatchesReference) {
  const GemmCase c = GetParam();
  WeightGemm op({.m = c.m, .k = c.k, .rows = c.rows, .weight = c.weight, .rows_runtime = c.runtime_rows != 0});
  OpHarness h(op, static_cast<uint32_t>(c.m * 7 + c.k + c.rows));
  if (c.runtime_rows) h.set_scalar("rows", HostArg::i64(static_cast<int64_t>(c.runtime_rows)));
  ASSERT_TRUE(h.runs());
  // f32 sums over exactly decoded weights: f32 rounding only, whatever the type.
  EXPECT_TRUE(h.close_to_reference("y", 1e-5));
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> v;
  const DType kAll[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0, DType::kQ4_0,
                        DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
  for (DType t : kAll) {
    const uint64_t k = isa::dtype_block_elems(t) == 256 ? 512 : 640;
    for (uint64_t rows : {uint64_t{1}, uint64_t{65}}) v.push_back({t, 96, k, rows, 0});
    v.push_back({t, 100, k, 512, 7});  // a short last m tile, a runtime chunk
  }
  // Every chunk length on the types of the Gemma file, at its widths (K = 640, 2048).
  for (DType t : {DType::kQ5_0, DType::kQ8_0}) {
    for (uint64_t rows : kChunkLengths) v.push_back({t, 80, 640, 512, rows});
  }
  for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
    for (uint64_t rows : kChunkLengths) v.push_back({t, 64, 2048, 512, rows});
  }
  // 10 tiles of 64 features over 8 blocks (2, 2, 1, ..., 1), and 9 over 8 with a short
  // last one: every block's range, including the first after the longer ones.
  v.push_back({DType::kQ5_0, 640, 640, 65, 0});
  v.push_back({DType::kQ8_0, 8 * 64 + 16, 640, 512, 33});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, WeightGemmShapes, ::testing::ValuesIn(gemm_cases()), gemm_name);

TEST(WeightGemm, RejectsBadParameters) {
  expect_rejects<WeightGemm>({.m = 0, .k = 64, .rows = 4}, "m");
  expect_rejects<WeightGemm>({.m = 64, .k = 0, .rows = 4}, "k");
  expect_rejects<WeightGemm>({.m = 64, .k = 64, .rows = 0}, "rows");
  expect_rejects<WeightGemm>({.m = 64, .k = 640, .rows = 4, .weight = DType::kQ4_K}, "k");
  expect_rejects<WeightGemm>({.m = 64, .k = 64, .rows = 4, .weight = DType::kI32}, "weight");
  expect_rejects<WeightGemm>({.m = 64, .k = 64, .rows = 4, .tile_m = 24}, "tile_m");
  expect_rejects<WeightGemm>({.m = 64, .k = 640, .rows = 4, .weight = DType::kQ8_0, .tile_k = 48}, "tile_k");
  // Accumulators for 65535 rows cannot fit local memory: compile names the parameter.
  expect_rejects<WeightGemm>({.m = 64, .k = 64, .rows = 65535}, "rows");
}

// More rows at run time than compiled: the loads leave x and the launch faults.
TEST(WeightGemm, TooManyRuntimeRowsFault) {
  WeightGemm op({.m = 32, .k = 64, .rows = 8, .rows_runtime = true});
  OpHarness h(op, 3);
  h.set_scalar("rows", HostArg::i64(9));
  const Status s = h.run();
  EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << s.to_string();
}

// ---- PrefillAttention ----

struct AttnCase {
  uint32_t heads, kv_heads, dim, max_len, tokens, window;
  int64_t pos, rows;
};

std::string attn_name(const ::testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  return "h" + std::to_string(c.heads) + "kv" + std::to_string(c.kv_heads) + "d" + std::to_string(c.dim) + "_w" +
         std::to_string(c.window) + "_pos" + std::to_string(c.pos) + "_rows" + std::to_string(c.rows);
}

PrefillAttention attention_of(const AttnCase& c, uint32_t window) {
  return PrefillAttention({.n_heads = c.heads,
                           .n_kv_heads = c.kv_heads,
                           .head_dim = c.dim,
                           .max_len = c.max_len,
                           .tokens = c.tokens,
                           .window = window});
}

class PrefillAttentionShapes : public ::testing::TestWithParam<AttnCase> {};

TEST_P(PrefillAttentionShapes, MatchesReference) {
  const AttnCase c = GetParam();
  const PrefillAttention op = attention_of(c, c.window);
  OpHarness h(op, static_cast<uint32_t>(c.pos * 13 + c.rows));
  h.set_scalar("pos", HostArg::i64(c.pos));
  h.set_scalar("rows", HostArg::i64(c.rows));
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference("out", 1e-5));
}

std::vector<AttnCase> attn_cases() {
  std::vector<AttnCase> v;
  // Gemma-3-270M's heads (4 query heads on 1 kv head of 256), local window 512.
  for (uint64_t rows : kChunkLengths) {
    v.push_back({4, 1, 256, 1100, 512, 0, 0, static_cast<int64_t>(rows)});
  }
  v.push_back({4, 1, 256, 1100, 512, 512, 0, 512});
  v.push_back({4, 1, 256, 1100, 512, 512, 300, 300});  // crosses the window inside the chunk
  v.push_back({4, 1, 256, 1100, 512, 512, 500, 30});   // window edge cut at position 0
  v.push_back({4, 1, 256, 1100, 512, 512, 600, 65});   // every query's window starts past 0
  v.push_back({4, 1, 256, 1100, 512, 0, 100, 65});     // lowest key tile cut at position 0
  // More kv heads, a small window (the synthetic model's 8) and odd positions.
  v.push_back({8, 2, 64, 300, 64, 8, 0, 64});
  v.push_back({8, 2, 64, 300, 64, 8, 5, 40});
  v.push_back({8, 2, 64, 300, 64, 8, 37, 1});
  v.push_back({6, 3, 32, 300, 64, 0, 13, 19});
  // Heads too wide for four unmasked key tiles at once in 256 KiB of local memory:
  // two at a time (head_dim 320), one (400).
  v.push_back({4, 1, 320, 300, 160, 0, 0, 160});
  v.push_back({4, 1, 400, 300, 160, 0, 40, 120});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, PrefillAttentionShapes, ::testing::ValuesIn(attn_cases()), attn_name);

// The window test can fail: the kernel compiled without the window misses the
// windowed reference on a chunk that crosses the window.
TEST(PrefillAttention, IgnoringTheWindowIsCaught) {
  const AttnCase c{4, 1, 256, 1100, 512, 512, 300, 300};
  const PrefillAttention windowed = attention_of(c, 512), unwindowed = attention_of(c, 0);
  OpHarness want(windowed, 99), got(unwindowed, 99);  // same seed: the same inputs
  for (OpHarness* h : {&want, &got}) {
    h->set_scalar("pos", HostArg::i64(c.pos));
    h->set_scalar("rows", HostArg::i64(c.rows));
    ASSERT_TRUE(h->runs());
  }
  ASSERT_EQ(want.input_bytes("k_cache"), got.input_bytes("k_cache"));
  // Over the rows the launch computes (the others stay poison on both sides).
  const std::vector<float> a = got.device_f32("out"), b = want.reference_f32("out");
  const size_t n = static_cast<size_t>(c.rows) * c.heads * c.dim;
  EXPECT_GT(rel_l2(std::span(a).first(n), std::span(b).first(n)), 1e-3);
  EXPECT_LE(want.rel_l2("out"), 1e-5);
}

TEST(PrefillAttention, OutOfRangePositionsFault) {
  const AttnCase c{4, 1, 64, 100, 16, 0, 0, 0};
  for (auto [pos, rows] : {std::pair<int64_t, int64_t>{-1, 4}, {90, 11}}) {
    const PrefillAttention op = attention_of(c, 0);
    OpHarness h(op, 5);
    h.set_scalar("pos", HostArg::i64(pos));
    h.set_scalar("rows", HostArg::i64(rows));
    EXPECT_EQ(h.run().code(), StatusCode::kDeviceFault) << pos << " " << rows;
  }
}

TEST(PrefillAttention, RejectsBadParameters) {
  const PrefillAttentionParams ok{.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 64, .tokens = 16};
  auto with = [&](auto f) {
    PrefillAttentionParams p = ok;
    f(p);
    return p;
  };
  EXPECT_TRUE(PrefillAttention(ok).validate().ok());
  expect_rejects<PrefillAttention>(with([](auto& p) { p.n_kv_heads = 3; }), "n_kv_heads");
  expect_rejects<PrefillAttention>(with([](auto& p) { p.tokens = 0; }), "tokens");
  expect_rejects<PrefillAttention>(with([](auto& p) { p.tokens = 65; }), "tokens");
  expect_rejects<PrefillAttention>(with([](auto& p) { p.head_dim = 0; }), "head_dim");
  expect_rejects<PrefillAttention>(with([](auto& p) { p.kv_dtype = DType::kQ8_0; }), "kv_dtype");
  expect_rejects<PrefillAttention>(with([](auto& p) { p.window = 12, p.tile_q = 8; }), "tile_q");
}

// ---- Runtime rows of the row-wise operators ----

TEST(RuntimeRows, RmsNormPerRowAndPerHead) {
  for (auto [rows, dim, at] : {std::tuple<uint64_t, uint32_t, int64_t>{512, 640, 65}, {2048, 256, 511 * 4}, {7, 640, 7}}) {
    RmsNorm op({.rows = rows, .dim = dim, .rows_runtime = true});
    OpHarness h(op, static_cast<uint32_t>(rows + dim));
    h.set_scalar("rows", HostArg::i64(at));
    ASSERT_TRUE(h.runs());
    EXPECT_LE(h.rel_l2("out"), 1e-5) << op.name();
  }
}

TEST(RuntimeRows, ElementwiseRows) {
  Elementwise op({.kind = ElementwiseKind::kGeluTanhMul, .n = 512 * 2048, .row_elems = 2048});
  OpHarness h(op, 4);
  h.set_scalar("rows", HostArg::i64(65));
  ASSERT_TRUE(h.runs());
  EXPECT_LE(h.rel_l2("out"), 1e-5);
  EXPECT_FALSE(Elementwise({.n = 100, .row_elems = 30}).validate().ok());
}

TEST(RuntimeRows, KvAppendOfRowsAtPosition) {
  StridedCopy op({.rows = 512, .cols = 256, .dst_rows = 1100, .dst_row_runtime = true, .rows_runtime = true});
  for (auto [at, rows] : {std::pair<int64_t, int64_t>{0, 512}, {300, 65}, {1099, 1}}) {
    OpHarness h(op, 6);
    h.set_scalar("dst_row", HostArg::i64(at));
    h.set_scalar("rows", HostArg::i64(rows));
    ASSERT_TRUE(h.runs());
    EXPECT_EQ(h.device_bytes("dst"), h.reference_bytes("dst"));
  }
}

TEST(RuntimeRows, LastRowBySourceRow) {
  StridedCopy op({.rows = 1, .cols = 640, .src_rows = 512, .src_row_runtime = true});
  OpHarness h(op, 7);
  h.set_scalar("src_row", HostArg::i64(64));
  ASSERT_TRUE(h.runs());
  EXPECT_EQ(h.device_bytes("dst"), h.reference_bytes("dst"));
  const std::vector<float> src = isa::to_f32(h.input_bytes("src"), DType::kF32);
  EXPECT_EQ(h.device_f32("dst")[3], src[64 * 640 + 3]);
}

TEST(RuntimeRows, EmbeddingOfTokens) {
  for (DType t : {DType::kQ8_0, DType::kBF16, DType::kQ4_K}) {
    Embedding op({.vocab = 1000, .dim = 512, .dtype = t, .scale = 22.6f, .tokens = 512});
    OpHarness h(op, 8);
    std::vector<int32_t> ids(512);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % 1000);
    testing::Bytes b(ids.size() * 4);
    std::memcpy(b.data(), ids.data(), b.size());
    h.set_bytes("tokens", b);
    h.set_scalar("rows", HostArg::i64(65));
    ASSERT_TRUE(h.runs());
    EXPECT_LE(h.rel_l2("out"), 1e-6) << op.name();
  }
}

// Token i of a batched RoPE is bit for bit the one-token RoPE at pos + i: batched and
// token-by-token prefill write the same keys into the cache.
TEST(RuntimeRows, BatchedRopeIsTheOneTokenRope) {
  const uint32_t heads = 4, dim = 256;
  const int64_t pos = 1000, rows = 65;
  Rope batched({.n_heads = heads, .head_dim = dim, .tokens = 512});
  OpHarness hb(batched, 9);
  hb.set_scalar("pos", HostArg::i64(pos));
  hb.set_scalar("base", HostArg::f32(10000.0f));
  hb.set_scalar("rows", HostArg::i64(rows));
  ASSERT_TRUE(hb.runs());
  EXPECT_LE(hb.rel_l2("out"), 1e-4);  // f32 angles at pos ~1000 (rope.h)
  const testing::Bytes& x = hb.input_bytes("x");
  const testing::Bytes& y = hb.device_bytes("out");
  Rope one({.n_heads = heads, .head_dim = dim});
  const size_t token_bytes = size_t{heads} * dim * 4;
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{64}}) {
    OpHarness h1(one, 10);
    h1.set_bytes("x", testing::Bytes(x.begin() + i * token_bytes, x.begin() + (i + 1) * token_bytes));
    h1.set_scalar("pos", HostArg::i64(pos + i));
    h1.set_scalar("base", HostArg::f32(10000.0f));
    ASSERT_TRUE(h1.runs());
    EXPECT_EQ(0, std::memcmp(h1.device_bytes("out").data(), y.data() + i * token_bytes, token_bytes)) << "token " << i;
  }
}

}  // namespace
}  // namespace npurt::ops

namespace npurt::ops {
namespace {

// Positions from a buffer (a batch of sequences, each at its own position): the
// reference, and each token bitwise the one-token Rope at its position.
TEST(RuntimeRows, RopeAtBufferPositionsIsTheOneTokenRopeAtEach) {
  const uint32_t heads = 4, dim = 256;
  const std::vector<int32_t> positions{0, 4095, 7, 1000, 1, 513, 99, 2048, 3, 12, 300};
  const int64_t rows = 9;
  Rope batched({.n_heads = heads, .head_dim = dim, .cores = 3, .tokens = 11, .positions = true});
  OpHarness hb(batched, 11);
  testing::Bytes at(positions.size() * 4);
  std::memcpy(at.data(), positions.data(), at.size());
  hb.set_bytes("positions", at);
  hb.set_scalar("pos", HostArg::i64(77));  // unused with positions
  hb.set_scalar("base", HostArg::f32(1e6f));
  hb.set_scalar("rows", HostArg::i64(rows));
  ASSERT_TRUE(hb.runs());
  EXPECT_LE(hb.rel_l2("out"), 1e-4);  // f32 angles up to pos 4095 (rope.h)
  const testing::Bytes& x = hb.input_bytes("x");
  const testing::Bytes& y = hb.device_bytes("out");
  Rope one({.n_heads = heads, .head_dim = dim});
  const size_t token_bytes = size_t{heads} * dim * 4;
  for (int64_t i = 0; i < rows; ++i) {
    OpHarness h1(one, 10);
    h1.set_bytes("x", testing::Bytes(x.begin() + i * token_bytes, x.begin() + (i + 1) * token_bytes));
    h1.set_scalar("pos", HostArg::i64(positions[i]));
    h1.set_scalar("base", HostArg::f32(1e6f));
    ASSERT_TRUE(h1.runs());
    EXPECT_EQ(0, std::memcmp(h1.device_bytes("out").data(), y.data() + i * token_bytes, token_bytes)) << "token " << i;
  }
  expect_rejects<Rope>({.n_heads = 4, .head_dim = 256, .positions = true}, "positions");
}

}  // namespace
}  // namespace npurt::ops

namespace npurt::ops {
namespace {

// The paged KV append: each row to the dst row its index names, the other rows kept;
// an index outside dst faults.
TEST(RuntimeRows, StridedCopyToIndexedRowsWritesThoseRowsOnly) {
  const StridedCopyParams p{.rows = 5, .cols = 256, .dst_rows = 40, .rows_runtime = true, .dst_row_index = true,
                            .dst_dtype = DType::kF16, .cores = 3};
  StridedCopy op(p);
  const auto run_with = [&](std::vector<int32_t> to, int64_t rows) {
    auto h = std::make_unique<OpHarness>(op, 4);
    testing::Bytes at(to.size() * 4);
    std::memcpy(at.data(), to.data(), at.size());
    h->set_bytes("dst_row_of", at);
    h->set_scalar("rows", HostArg::i64(rows));
    return h;
  };
  const auto h = run_with({7, 0, 39, 12, 3}, 4);
  ASSERT_TRUE(h->runs());
  EXPECT_TRUE(h->close_to_reference("dst", 0.0));
  // Row 3 of dst is the fifth index's, past the 4 rows run: it keeps its bytes.
  const size_t row = 256 * 2;
  EXPECT_EQ(0, std::memcmp(h->device_bytes("dst").data() + 3 * row, h->input_bytes("dst").data() + 3 * row, row));
  EXPECT_NE(0, std::memcmp(h->device_bytes("dst").data() + 39 * row, h->input_bytes("dst").data() + 39 * row, row));
  for (int32_t bad : {40, -1, 1 << 30}) {
    const auto f = run_with({7, 0, bad, 12, 3}, 4);
    EXPECT_EQ(f->run().code(), StatusCode::kDeviceFault) << "index " << bad;
  }
  expect_rejects<StridedCopy>({.cols = 8, .dst_row_runtime = true, .dst_row_index = true}, "dst_row_index");
}

}  // namespace
}  // namespace npurt::ops
