#include "npurt/ops/embedding.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

constexpr float kGemmaScale = 25.298222f;  // sqrt(640)

double weight_tolerance(DType t) {
  if (t == DType::kF32) return 1e-5;
  return isa::dtype_is_quantized(t) ? 1e-3 : 1e-2;
}

std::string case_name(const ::testing::TestParamInfo<EmbeddingParams>& info) {
  const EmbeddingParams& c = info.param;
  return std::string(isa::dtype_name(c.dtype)) + "_v" + std::to_string(c.vocab) + "_d" + std::to_string(c.dim) +
         "_" + std::to_string(info.index);
}

class EmbeddingShapes : public ::testing::TestWithParam<EmbeddingParams> {};

// Every token kind (first, last, middle row) of each table against the reference.
TEST_P(EmbeddingShapes, MatchesReference) {
  const EmbeddingParams c = GetParam();
  Embedding op(c);
  std::vector<int64_t> tokens{0};
  if (c.vocab > 1) tokens.insert(tokens.end(), {static_cast<int64_t>(c.vocab - 1), static_cast<int64_t>(c.vocab / 2)});
  for (int64_t token : tokens) {
    OpHarness h(op, static_cast<uint32_t>(c.vocab * 31 + c.dim));
    h.set_scalar("token", HostArg::i64(token));
    ASSERT_TRUE(h.runs());
    const std::vector<float> out = h.device_f32("out");
    EXPECT_GT(std::abs(out[0]) + std::abs(out[c.dim - 1]), 0.f) << "row should be random, not zero";
    EXPECT_TRUE(h.close_to_reference("out", weight_tolerance(c.dtype))) << "token " << token;
  }
}

std::vector<EmbeddingParams> cases() {
  std::vector<EmbeddingParams> v;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0}) {
    for (uint64_t vocab : {1ull, 1000ull}) {
      v.push_back({vocab, 640, t, kGemmaScale});
      v.push_back({vocab, 32, t, 1.0f});
    }
  }
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (uint64_t vocab : {1ull, 1000ull}) {
      v.push_back({vocab, 256, t, kGemmaScale});
      v.push_back({vocab, 512, t, -0.5f});
    }
  }
  v.push_back({7, 33, DType::kF32, 3.0f});  // odd row length
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, EmbeddingShapes, ::testing::ValuesIn(cases()), case_name);

// The output is the selected row exactly: another row would still be random data.
TEST(Embedding, PicksTheRequestedRow) {
  const uint64_t vocab = 5;
  const uint32_t dim = 32;
  Embedding op({.vocab = vocab, .dim = dim, .dtype = DType::kBF16, .scale = 2.0f});
  std::vector<float> table(vocab * dim);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i / dim + 1);  // row r holds r + 1
  OpHarness h(op);
  h.set_f32("table", table);
  h.set_scalar("token", HostArg::i64(3));
  ASSERT_TRUE(h.runs());
  for (float x : h.device_f32("out")) EXPECT_EQ(x, 8.0f);
}

TEST(Embedding, TokenOutsideVocabFaults) {
  for (DType t : {DType::kF32, DType::kQ4_K}) {
    Embedding op({.vocab = 10, .dim = 256, .dtype = t});
    for (int64_t token : {int64_t{10}, int64_t{11}, int64_t{-1}, int64_t{INT32_MIN}}) {
      OpHarness h(op);
      h.set_scalar("token", HostArg::i64(token));
      const Status s = h.run();
      EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << isa::dtype_name(t) << " token " << token << ": "
                                                    << s.to_string();
    }
  }
}

// Shard s of n holds rows [s * vocab / n, (s + 1) * vocab / n): uneven when n does not
// divide vocab.
EmbeddingParams shard_params(EmbeddingParams full, int n, int s) {
  const uint64_t first = full.vocab * s / n, end = full.vocab * (s + 1) / n;
  full.vocab = end - first;
  full.shard = true;
  full.first_row = first;
  return full;
}

// The bytes of the table's rows [first, first + count).
testing::Bytes table_rows(const testing::Bytes& table, const EmbeddingParams& c, uint64_t first, uint64_t count) {
  const uint64_t row = isa::dtype_bytes(c.dtype, c.dim);
  return testing::Bytes(table.begin() + first * row, table.begin() + (first + count) * row);
}

// Whether every f32 of `b` is -0.0f, what a shard gives for tokens of other shards.
bool all_minus_zero(const testing::Bytes& b) {
  const std::vector<float> v = isa::to_f32(b, DType::kF32);
  return std::all_of(v.begin(), v.end(), [](float x) { return std::bit_cast<uint32_t>(x) == 0x80000000u; });
}

// Shard s of n of `c`, its harness given the shard's rows of the whole `table`.
struct Shard {
  Shard(const EmbeddingParams& c, int n, int s, const testing::Bytes& table)
      : p(shard_params(c, n, s)), op(p), h(op) {
    h.set_bytes("table", table_rows(table, c, p.first_row, p.vocab));
  }
  // Whether the shard holds the row of `token` (the unsigned compare also takes
  // tokens below first_row as outside).
  bool holds(int64_t token) const { return static_cast<uint64_t>(token) - p.first_row < p.vocab; }
  const EmbeddingParams p;
  const Embedding op;
  OpHarness h;
};

// Adds one shard's f32 output to the sum of the shards so far (the first one starts it).
void add_to_sum(std::vector<float>& sum, const std::vector<float>& out) {
  if (sum.empty()) {
    sum = out;
  } else {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += out[i];
  }
}

class EmbeddingShards : public ::testing::TestWithParam<EmbeddingParams> {};

// Each token against 2 and 4 shards of the same random table: the shard holding it
// gives the unsharded row's bytes, the others -0.0f, and the elementwise sum of every
// shard's output is the unsharded row bit for bit, -0.0f elements included (q8_0,
// q4_0, q5_0 and q6_K rows have some). Outputs start poisoned (NaN).
TEST_P(EmbeddingShards, SumOfShardsIsTheUnshardedRow) {
  const EmbeddingParams c = GetParam();
  const Embedding full(c);
  for (int64_t token : {int64_t{0}, int64_t{4}, int64_t{5}, static_cast<int64_t>(c.vocab - 1)}) {
    OpHarness whole(full, static_cast<uint32_t>(c.dim + token));
    whole.set_scalar("token", HostArg::i64(token));
    ASSERT_TRUE(whole.runs());
    const testing::Bytes& want = whole.device_bytes("out");
    for (int n : {2, 4}) {
      std::vector<float> sum;
      for (int s = 0; s < n; ++s) {
        Shard shard(c, n, s, whole.input_bytes("table"));
        OpHarness& h = shard.h;
        h.set_scalar("token", HostArg::i64(token));
        ASSERT_TRUE(h.runs());
        const testing::Bytes& got = h.device_bytes("out");
        const bool inside = shard.holds(token);
        if (inside) {
          EXPECT_EQ(got, want) << shard.op.name() << " token " << token;
        } else {
          EXPECT_TRUE(all_minus_zero(got)) << shard.op.name() << " token " << token << ": not -0.0f";
        }
        EXPECT_EQ(got, h.reference_bytes("out")) << shard.op.name() << " token " << token << ": device vs reference";
        add_to_sum(sum, h.device_f32("out"));
      }
      EXPECT_EQ(std::memcmp(sum.data(), want.data(), want.size()), 0) << "sum of " << n << " shards, token " << token;
    }
  }
}

void expect_batched_shards_sum(const EmbeddingParams& c) {
  const int64_t rows = c.tokens - 1;
  std::vector<int32_t> ids(c.tokens);
  for (uint32_t i = 0; i < c.tokens; ++i) ids[i] = static_cast<int32_t>((i * 7 + 9) % c.vocab);
  testing::Bytes id_bytes(ids.size() * 4);
  std::memcpy(id_bytes.data(), ids.data(), id_bytes.size());
  const Embedding full(c);
  OpHarness whole(full, c.dim);
  whole.set_bytes("tokens", id_bytes);
  whole.set_scalar("rows", HostArg::i64(rows));
  ASSERT_TRUE(whole.runs());
  const testing::Bytes& want = whole.device_bytes("out");
  const size_t row_bytes = size_t{c.dim} * 4, used = rows * row_bytes;
  for (int n : {2, 4}) {
    std::vector<float> sum;
    for (int s = 0; s < n; ++s) {
      Shard shard(c, n, s, whole.input_bytes("table"));
      OpHarness& h = shard.h;
      h.set_bytes("tokens", id_bytes);
      h.set_scalar("rows", HostArg::i64(rows));
      ASSERT_TRUE(h.runs());
      const testing::Bytes& got = h.device_bytes("out");
      EXPECT_EQ(got, h.reference_bytes("out")) << shard.op.name() << ": device vs reference";
      for (int64_t r = 0; r < rows; ++r) {
        const testing::Bytes row(got.begin() + r * row_bytes, got.begin() + (r + 1) * row_bytes);
        if (shard.holds(ids[r])) {
          EXPECT_TRUE(std::equal(row.begin(), row.end(), want.begin() + r * row_bytes))
              << shard.op.name() << " row " << r;
        } else {
          EXPECT_TRUE(all_minus_zero(row)) << shard.op.name() << " row " << r << ": not -0.0f";
        }
      }
      EXPECT_TRUE(std::all_of(got.begin() + used, got.end(), [](uint8_t v) { return v == 0xFF; }))
          << shard.op.name() << ": wrote past `rows`";
      add_to_sum(sum, h.device_f32("out"));
    }
    EXPECT_EQ(std::memcmp(sum.data(), want.data(), used), 0) << "sum of " << n << " shards";
  }
}

// The batched form: ids of every shard, repeats included, of which a launch looks up
// all but the last (whose output row stays poisoned). One tile of 12 rows, and 150
// rows: tiles of 64 over 3 blocks. Shards of 2 and 4.
TEST_P(EmbeddingShards, BatchedSumOfShardsIsTheUnshardedRows) {
  for (uint32_t t : {12u, 150u}) {
    EmbeddingParams c = GetParam();
    c.tokens = t;
    expect_batched_shards_sum(c);
  }
}

std::vector<EmbeddingParams> shard_cases() {
  std::vector<EmbeddingParams> v;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K}) {
    v.push_back({10, 256, t, kGemmaScale});
    v.push_back({10, 256, t, -0.5f});  // a negative scale flips the row's signs, never the fill's
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, EmbeddingShards, ::testing::ValuesIn(shard_cases()), case_name);

// Tokens anywhere in the i32 range: outside the shard they give -0.0f and never fault,
// up to a shard ending at the last i32 id.
TEST(Embedding, ShardTakesEveryI32Token) {
  const uint64_t first = (uint64_t{1} << 31) - 4;
  const Embedding op({.vocab = 4, .dim = 256, .dtype = DType::kQ4_K, .shard = true, .first_row = first});
  EXPECT_NE(op.name().find("shard"), std::string::npos) << op.name();
  for (int64_t token : {int64_t{-1}, int64_t{INT32_MIN}, int64_t{0}, static_cast<int64_t>(first) - 1,
                        static_cast<int64_t>(first), int64_t{INT32_MAX}, int64_t{0xFFFFFFFF}}) {
    OpHarness h(op);
    h.set_scalar("token", HostArg::i64(token));
    ASSERT_TRUE(h.runs()) << "token " << token;
    const bool inside = token >= static_cast<int64_t>(first) && token <= INT32_MAX;
    EXPECT_EQ(!all_minus_zero(h.device_bytes("out")), inside) << "token " << token;
    EXPECT_EQ(h.device_bytes("out"), h.reference_bytes("out")) << "token " << token;
  }
}

TEST(Embedding, RejectsBadParameters) {
  expect_rejects<Embedding>({.vocab = 0, .dim = 32}, "vocab");
  expect_rejects<Embedding>({.vocab = 1ull << 31, .dim = 32}, "vocab");
  expect_rejects<Embedding>({.vocab = 8, .dim = 0}, "dim");
  expect_rejects<Embedding>({.vocab = 8, .dim = 70000}, "dim");
  expect_rejects<Embedding>({.vocab = 8, .dim = 640, .dtype = DType::kQ4_K}, "dim");
  expect_rejects<Embedding>({.vocab = 8, .dim = 48, .dtype = DType::kQ8_0}, "dim");
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .dtype = DType::kI32}, "dtype");
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .dtype = static_cast<DType>(7)}, "dtype");
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .scale = NAN}, "scale");
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .scale = INFINITY}, "scale");
  // A row that does not fit the target's local memory.
  expect_rejects<Embedding>({.vocab = 8, .dim = 1024}, "dim", {.cores = 1, .local_bytes = 4096});
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .first_row = 8}, "first_row");  // without shard
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .shard = true, .first_row = (1ull << 31) - 7}, "first_row");
  expect_rejects<Embedding>({.vocab = 8, .dim = 32, .tokens = 4, .shard = true, .first_row = 1ull << 31},
                            "first_row");
}

}  // namespace
}  // namespace npurt::ops
