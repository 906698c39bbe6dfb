#include "npurt/ops/embedding.h"

#include <gtest/gtest.h>

#include <cmath>

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
}

}  // namespace
}  // namespace npurt::ops
