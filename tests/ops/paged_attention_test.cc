#include "npurt/ops/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using testing::Bytes;

// What a launch reads: per sequence its len, table and query; pools whose attended
// rows hold random values in [-1, 1) and every other row NaN bytes, so a read of a
// row a sequence does not attend poisons its output. Table entries a sequence never
// reaches are -1.
struct Batch {
  std::vector<int32_t> lens, tables;
  std::vector<float> q;
  Bytes k, v;
};

int64_t first_of(const PagedDecodeAttentionParams& p, int64_t len) {
  return p.window ? std::max<int64_t>(0, len - p.window) : 0;
}

Bytes i32_bytes(const std::vector<int32_t>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Sequences get distinct blocks from a shuffled pool, except that sequence 1 (when
// there is one) shares sequence 0's first two blocks, as a shared prompt prefix does.
Batch make_batch(const PagedDecodeAttentionParams& p, const std::vector<int32_t>& lens, std::mt19937& rng) {
  const uint32_t bp = p.block_positions, mb = p.max_blocks;
  const size_t row = size_t{p.n_kv_heads} * p.head_dim, esize = isa::dtype_size(p.kv_dtype);
  Batch b;
  b.lens = lens;
  b.lens.resize(p.sequences, 1);
  std::vector<int32_t> order(p.blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  b.tables.assign(size_t{p.sequences} * mb, -1);
  b.k.assign(size_t{p.blocks} * bp * row * esize, 0xFF);
  b.v = b.k;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> values(row);
  size_t next = 0;
  for (uint32_t s = 0; s < p.sequences; ++s) {
    const int64_t len = b.lens[s], first = first_of(p, len);
    for (int64_t j = first / bp; j <= (len - 1) / bp; ++j) {
      const bool shared = s == 1 && j < 2 && b.tables[j] >= 0 && first == 0 && first_of(p, b.lens[0]) == 0 &&
                          (j + 1) * bp <= std::min(len, int64_t{b.lens[0]});
      const int32_t blk = shared ? b.tables[j] : order.at(next++);
      b.tables[s * mb + j] = blk;
      if (shared) continue;
      for (int64_t t = std::max<int64_t>(j * bp, first); t < std::min<int64_t>((j + 1) * bp, len); ++t) {
        const size_t at = (size_t(blk) * bp + t % bp) * row * esize;
        for (Bytes* pool : {&b.k, &b.v}) {
          for (float& x : values) x = u(rng);
          isa::from_f32(values.data(), p.kv_dtype, pool->data() + at, row);
        }
      }
    }
  }
  b.q.resize(size_t{p.sequences} * p.n_heads * p.head_dim);
  for (float& x : b.q) x = u(rng);
  return b;
}

void bind(testing::OpHarness& h, const Batch& b, int64_t rows) {
  h.set_f32("q", b.q);
  h.set_bytes("k_pool", b.k);
  h.set_bytes("v_pool", b.v);
  h.set_bytes("tables", i32_bytes(b.tables));
  h.set_bytes("lens", i32_bytes(b.lens));
  h.set_scalar("rows", HostArg::i64(rows));
}

std::vector<uint32_t> out_bits(const testing::OpHarness& h, uint32_t slot, const PagedDecodeAttentionParams& p) {
  const Bytes& b = h.device_bytes("out");
  const size_t n = size_t{p.n_heads} * p.head_dim;
  std::vector<uint32_t> w(n);
  std::memcpy(w.data(), b.data() + slot * n * 4, n * 4);
  return w;
}

struct Case {
  PagedDecodeAttentionParams p;
  std::vector<int32_t> lens;
};

class PagedDecodeAttentionShapes : public ::testing::TestWithParam<Case> {};

// Against the host reference, all sequences run and then one fewer (the last one's
// output must stay as it was: poison on both sides).
TEST_P(PagedDecodeAttentionShapes, MatchesReference) {
  const Case& c = GetParam();
  PagedDecodeAttention op(c.p);
  std::mt19937 rng(c.p.head_dim + c.p.block_positions);
  for (int64_t rows : {int64_t{c.p.sequences}, int64_t{c.p.sequences} - 1}) {
    testing::OpHarness h(op, 3);
    bind(h, make_batch(c.p, c.lens, rng), rows);
    ASSERT_TRUE(h.runs());
    EXPECT_TRUE(h.close_to_reference("out", testing::tolerance(c.p.kv_dtype))) << "rows " << rows;
  }
}

std::vector<Case> cases() {
  return {
      // Gemma-3-270M's heads: 4 query heads on 1 kv head of 256; lens across blocks.
      {{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .block_positions = 16, .blocks = 80, .max_blocks = 16,
        .sequences = 4},
       {1, 37, 256, 200}},
      // Its local layers' window of 512 over blocks of 64.
      {{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .block_positions = 64, .blocks = 64, .max_blocks = 16,
        .sequences = 3, .window = 512},
       {1000, 513, 64}},
      {{.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .block_positions = 5, .blocks = 60, .max_blocks = 12,
        .sequences = 4, .window = 13, .kv_dtype = DType::kF16},
       {60, 14, 3, 41}},
      {{.n_heads = 4, .n_kv_heads = 4, .head_dim = 32, .block_positions = 7, .blocks = 40, .max_blocks = 8,
        .sequences = 5, .scale = 0.3f, .kv_dtype = DType::kBF16, .cores = 3},
       {56, 1, 7, 8, 30}},
  };
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const PagedDecodeAttentionParams& p = info.param.p;
  return std::string(isa::dtype_name(p.kv_dtype)) + "_h" + std::to_string(p.n_heads) + "kv" +
         std::to_string(p.n_kv_heads) + "d" + std::to_string(p.head_dim) + "_b" + std::to_string(p.block_positions) +
         "_w" + std::to_string(p.window);
}

INSTANTIATE_TEST_SUITE_P(Ops, PagedDecodeAttentionShapes, ::testing::ValuesIn(cases()), case_name);

// A sequence's output is the same bits alone (slot 0, one sequence run, its rows in
// other blocks of the pool) as in a batch of five, in reverse slot order, and on 1, 3
// or 8 cores.
TEST(PagedDecodeAttention, ASequenceGetsTheSameBitsAloneAndInAnyBatch) {
  PagedDecodeAttentionParams p{.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .block_positions = 16,
                               .blocks = 96, .max_blocks = 16, .sequences = 5, .window = 100};
  const std::vector<int32_t> lens{200, 1, 99, 256, 17};
  std::mt19937 rng(11);
  const Batch batch = make_batch(p, lens, rng);
  std::vector<std::vector<uint32_t>> want;
  {
    const PagedDecodeAttention op(p);
    testing::OpHarness h(op, 1);
    bind(h, batch, 5);
    ASSERT_TRUE(h.runs());
    EXPECT_TRUE(h.close_to_reference("out", 1e-5));
    for (uint32_t s = 0; s < 5; ++s) want.push_back(out_bits(h, s, p));
  }
  const size_t qn = size_t{p.n_heads} * p.head_dim;
  for (uint32_t s = 0; s < 5; ++s) {
    // Alone in slot 0: a fresh batch whose sequence 0 has s's len, query and rows,
    // the rows copied into the blocks the fresh batch gave it.
    std::mt19937 other(100 + s);
    Batch alone = make_batch(p, {lens[s]}, other);
    std::copy_n(batch.q.begin() + s * qn, qn, alone.q.begin());
    const size_t row_bytes = size_t{p.n_kv_heads} * p.head_dim * 4;
    for (int64_t t = first_of(p, lens[s]); t < lens[s]; ++t) {
      const size_t from = (size_t(batch.tables[s * p.max_blocks + t / 16]) * 16 + t % 16) * row_bytes;
      const size_t to = (size_t(alone.tables[t / 16]) * 16 + t % 16) * row_bytes;
      std::copy_n(batch.k.begin() + from, row_bytes, alone.k.begin() + to);
      std::copy_n(batch.v.begin() + from, row_bytes, alone.v.begin() + to);
    }
    const PagedDecodeAttention op(p);
    testing::OpHarness h(op, 1);
    bind(h, alone, 1);
    ASSERT_TRUE(h.runs());
    EXPECT_EQ(out_bits(h, 0, p), want[s]) << "sequence " << s << " alone";
  }
  // Reversed slots, on 1, 3 and 8 cores.
  Batch reversed = batch;
  for (uint32_t s = 0; s < 5; ++s) {
    reversed.lens[4 - s] = batch.lens[s];
    std::copy_n(batch.tables.begin() + s * p.max_blocks, p.max_blocks, reversed.tables.begin() + (4 - s) * p.max_blocks);
    std::copy_n(batch.q.begin() + s * qn, qn, reversed.q.begin() + (4 - s) * qn);
  }
  for (uint32_t cores : {1u, 3u, 8u}) {
    PagedDecodeAttentionParams pc = p;
    pc.cores = cores;
    const PagedDecodeAttention op(pc);
    testing::OpHarness h(op, 1);
    bind(h, reversed, 5);
    ASSERT_TRUE(h.runs());
    for (uint32_t s = 0; s < 5; ++s) EXPECT_EQ(out_bits(h, 4 - s, p), want[s]) << "sequence " << s << ", cores " << cores;
  }
}

// A len outside [1, max_blocks * block_positions], or a table entry outside the pool
// that the len reaches, fails the launch instead of reading past the pool.
TEST(PagedDecodeAttention, LenOrBlockOutOfRangeFaults) {
  const PagedDecodeAttentionParams p{.n_heads = 2, .n_kv_heads = 1, .head_dim = 32, .block_positions = 8,
                                     .blocks = 16, .max_blocks = 4, .sequences = 2};
  const auto run_with = [&](int32_t len1, int32_t entry) {
    std::mt19937 rng(2);
    Batch b = make_batch(p, {20, 20}, rng);
    b.lens[1] = len1;
    b.tables[1 * 4 + 1] = entry;  // sequence 1's second block (positions 8 .. 15)
    const PagedDecodeAttention op(p);
    testing::OpHarness h(op, 1);
    bind(h, b, 2);
    return h.run();
  };
  EXPECT_TRUE(run_with(16, 3).ok());
  for (const auto& [len, entry] : {std::pair{0, 3}, std::pair{-2, 3}, std::pair{33, 3}, std::pair{12, 16},
                                   std::pair{12, -1}}) {
    const Status s = run_with(len, entry);
    EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << "len " << len << ", entry " << entry << ": " << s.to_string();
  }
  // Entries past the attended blocks are not read: -1 there is fine.
  EXPECT_TRUE(run_with(8, -1).ok());
}

TEST(PagedDecodeAttention, RejectsBadParameters) {
  const PagedDecodeAttentionParams ok{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .block_positions = 16,
                                      .blocks = 8, .max_blocks = 4, .sequences = 2};
  const auto bad_with = [&](auto edit) {
    PagedDecodeAttentionParams p = ok;
    edit(p);
    return p;
  };
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.n_heads = 0; }), "n_heads");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.n_kv_heads = 3; }), "n_kv_heads");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.head_dim = 0; }), "head_dim");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.block_positions = 0; }), "block_positions");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.blocks = 0; }), "blocks");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.max_blocks = 0; }), "max_blocks");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.sequences = 0; }), "sequences");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.blocks = 1u << 30; }), "blocks");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.scale = -1; }), "scale");
  testing::expect_rejects<PagedDecodeAttention>(bad_with([](auto& p) { p.kv_dtype = DType::kQ8_0; }), "kv_dtype");
  const StatusOr<Kernel> big = PagedDecodeAttention(bad_with([](auto& p) { p.block_positions = 60000; })).compile(Target{});
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("block_positions"), std::string::npos) << big.status().to_string();
}

}  // namespace
}  // namespace npurt::ops
