// Batch invariance: a batched GEMV and a several-query decode attention give each
// vector (query) bitwise what the one-vector (one-query) kernel gives it, for every
// batch size 1 .. 16, every place in the batch and every weight type. The verification
// of drafted tokens is exact only because of this.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "hal/sim/matvec_kernels.h"
#include "hal/sim_test_util.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/gemv.h"
#include "ops/op_harness.h"

namespace npurt::ops {
namespace {

using isa::Access;
using isa::ArgSpec;
using testing::Bytes;
using testing::random_bytes_for;

constexpr uint32_t kMaxBatch = isa::kMaxTmvBatch;
constexpr char kRowsScalar[] = "rows";  // the runtime count of every batched operator

std::vector<float> random_vectors(size_t n, uint32_t seed) { return testing::random_floats(n, seed, -1.0f, 1.0f); }

// The f32 words of `name`'s device output, as raw bits.
std::vector<uint32_t> bits(const OpHarness& h, const std::string& name) {
  const Bytes& b = h.device_bytes(name);
  std::vector<uint32_t> w(b.size() / 4);
  std::memcpy(w.data(), b.data(), w.size() * 4);
  return w;
}

// Columns (vectors) of a batched result that differ in any bit from the one-vector
// kernel's result for the same vector.
struct Mismatch {
  int columns = 0, checked = 0;
};

class GemvBatch : public ::testing::TestWithParam<DType> {
 protected:
  static constexpr uint64_t kM = 300, kK = 768;  // rows: several tiles and groups; k: 3 K-type blocks

  void SetUp() override {
    std::mt19937 rng(static_cast<uint32_t>(GetParam()) + 11);
    w_ = random_bytes_for(ArgSpec::buffer("w", Access::kIn, GetParam(), kM * kK), rng);
    x_ = random_vectors(kMaxBatch * kK, 7 + static_cast<uint32_t>(GetParam()));
    x_[3 * kK + 5] = std::numeric_limits<float>::infinity();  // vector 3 is not finite
    for (uint32_t v = 0; v < kMaxBatch; ++v) single_.push_back(run_single(v));
  }

  std::vector<float> vector(uint32_t v) const { return {x_.begin() + v * kK, x_.begin() + (v + 1) * kK}; }

  std::vector<uint32_t> run_single(uint32_t v) {
    Gemv op({.m = kM, .k = kK, .weight = GetParam()});
    OpHarness h(op, 1);
    h.set_bytes("w", w_);
    h.set_f32("x", vector(v));
    EXPECT_TRUE(h.runs());
    return bits(h, "y");
  }

  // A batch of `n` vectors starting at vector `first` (wrapping), through the kernel
  // compiled for 16 with the runtime count n (the verify step's form), or for n alone.
  Mismatch run_batch(uint32_t n, uint32_t first, bool runtime) {
    const uint32_t compiled = runtime ? kMaxBatch : n;
    Gemv op({.m = kM, .k = kK, .weight = GetParam(), .batch = compiled, .batch_runtime = runtime});
    OpHarness h(op, 1);
    h.set_bytes("w", w_);
    std::vector<float> x(compiled * kK, 0.5f);
    for (uint32_t j = 0; j < n; ++j) {
      const std::vector<float> v = vector((first + j) % kMaxBatch);
      std::copy(v.begin(), v.end(), x.begin() + j * kK);
    }
    h.set_f32("x", x);
    if (runtime) h.set_scalar(kRowsScalar, HostArg::i64(n));
    EXPECT_TRUE(h.runs());
    const std::vector<uint32_t> y = bits(h, "y");
    Mismatch m;
    for (uint32_t j = 0; j < n; ++j) {
      const std::vector<uint32_t>& want = single_[(first + j) % kMaxBatch];
      m.columns += std::memcmp(y.data() + j * kM, want.data(), kM * 4) != 0;
      ++m.checked;
    }
    // Vectors past the runtime count are left as they were (poisoned).
    for (uint64_t i = n * kM; i < y.size(); ++i) EXPECT_EQ(y[i], 0xFFFFFFFFu) << "y[" << i << "] written";
    return m;
  }

  Bytes w_;
  std::vector<float> x_;
  std::vector<std::vector<uint32_t>> single_;
};

TEST_P(GemvBatch, EachVectorGetsTheOneVectorKernelsBits) {
  for (uint32_t n = 1; n <= kMaxBatch; ++n) {
    // A different rotation per size puts each vector at many places in the batch.
    const Mismatch m = run_batch(n, n % kMaxBatch, /*runtime=*/true);
    EXPECT_EQ(m.columns, 0) << "batch of " << n;
  }
  EXPECT_EQ(run_batch(5, 9, /*runtime=*/false).columns, 0) << "batch compiled for 5";
}

TEST_P(GemvBatch, TheFormWithoutVnniGivesTheSameBits) {
  // Where the host has AVX512_VNNI the AVX-512 kernels use VPDPBUSD; the VPMADDUBSW
  // form (AVX-512 hosts without VNNI) must give every vector the same bits.
  if (!sim::matvec_vnni()) GTEST_SKIP() << "no AVX512_VNNI on this host";
  sim::matvec_set_vnni_for_test(false);
  const Mismatch m = run_batch(kMaxBatch, 3, /*runtime=*/true);
  const std::vector<uint32_t> one = run_single(5);
  sim::matvec_set_vnni_for_test(true);
  EXPECT_EQ(m.columns, 0);
  EXPECT_EQ(one, single_[5]);
}

TEST_P(GemvBatch, MatchesTheReference) {
  Gemv op({.m = kM, .k = kK, .weight = GetParam(), .batch = kMaxBatch, .batch_runtime = true});
  OpHarness h(op, 3);
  h.set_bytes("w", w_);
  h.set_f32("x", random_vectors(kMaxBatch * kK, 99));
  h.set_scalar(kRowsScalar, HostArg::i64(11));
  ASSERT_TRUE(h.runs());
  const double tol = GetParam() == DType::kF32 ? 1e-5 : 1e-3;
  EXPECT_TRUE(h.close_to_reference("y", tol));
}

// The check can fail: a batched kernel that sums in another order for batch > 1 gives
// other bits (while still matching the reference to rounding).
TEST_P(GemvBatch, ADifferentSummationOrderIsCaught) {
  sim::matvec_set_batch_reorder_for_test(true);
  const Mismatch m = run_batch(8, 0, /*runtime=*/true);
  sim::matvec_set_batch_reorder_for_test(false);
  EXPECT_GT(m.columns, m.checked / 2) << "the reordered sums went unnoticed";
}

INSTANTIATE_TEST_SUITE_P(Weights, GemvBatch,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0,
                                           DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& info) { return std::string(isa::dtype_name(info.param)); });

TEST(GemvBatch, RejectsABatchAboveTheMaximum) {
  Gemv op({.m = 8, .k = 32, .weight = DType::kF32, .batch = kMaxBatch + 1});
  const Status s = op.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch"), std::string::npos) << s.to_string();
}

// Decode attention for several consecutive queries against one query at a time.
struct AttnCase {
  uint32_t window = 0;
  uint32_t len = 0;  // the first query's len
};

class AttentionQueries : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionQueries, EachQueryGetsTheOneQueryKernelsBits) {
  const AttnCase c = GetParam();
  for (bool split : {false, true}) {
  SCOPED_TRACE(split ? "split positions (chunks of 16)" : "one block per head group");
  const DecodeAttentionParams base{.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 96, .window = c.window,
                                   .tile_t = split ? 16u : 0u, .split_positions = split};
  std::mt19937 rng(c.len * 7 + c.window);
  DecodeAttentionParams many = base;
  many.queries = kMaxBatch;
  many.queries_runtime = true;
  const DecodeAttention batched(many);
  const std::vector<ArgSpec> sig = batched.signature();
  const Bytes k = random_bytes_for(sig[1], rng), v = random_bytes_for(sig[2], rng);
  const std::vector<float> q = random_vectors(kMaxBatch * 4 * 64, c.len);
  for (uint32_t n : {1u, 2u, 7u, 16u}) {
    OpHarness h(batched, 1);
    h.set_f32("q", q);
    h.set_bytes("k_cache", k);
    h.set_bytes("v_cache", v);
    h.set_scalar("len", HostArg::i64(c.len));
    h.set_scalar(kRowsScalar, HostArg::i64(n));
    ASSERT_TRUE(h.runs());
    EXPECT_TRUE(h.close_to_reference("out", 1e-5));
    const std::vector<uint32_t> out = bits(h, "out");
    for (uint32_t i = 0; i < n; ++i) {
      const DecodeAttention one(base);
      OpHarness s(one, 1);
      s.set_f32("q", {q.begin() + i * 256, q.begin() + (i + 1) * 256});
      s.set_bytes("k_cache", k);
      s.set_bytes("v_cache", v);
      s.set_scalar("len", HostArg::i64(c.len + i));
      ASSERT_TRUE(s.runs());
      EXPECT_EQ(std::memcmp(out.data() + i * 256, bits(s, "out").data(), 256 * 4), 0)
          << "query " << i << " of " << n << " (len " << c.len + i << ")";
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(Windows, AttentionQueries,
                         ::testing::Values(AttnCase{0, 1}, AttnCase{0, 40}, AttnCase{8, 5}, AttnCase{8, 30},
                                           AttnCase{32, 70}),
                         [](const auto& info) {
                           return "window" + std::to_string(info.param.window) + "_len" + std::to_string(info.param.len);
                         });

TEST(AttentionQueries, AQueryPastTheCacheFaultsTheLaunch) {
  const DecodeAttention op({.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 32, .queries = 4,
                            .queries_runtime = true});
  OpHarness h(op, 1);
  h.set_scalar("len", HostArg::i64(30));
  h.set_scalar(kRowsScalar, HostArg::i64(4));  // the last query would be at len 33
  const Status s = h.run();
  EXPECT_EQ(s.code(), StatusCode::kDeviceFault) << s.to_string();
}

TEST(ArgmaxVectors, EachVectorsFirstMaximum) {
  constexpr uint64_t kN = 5000;
  const Argmax op({.n = kN, .vectors = 8, .vectors_runtime = true});
  for (int64_t n : {1, 3, 8}) {
    OpHarness h(op, static_cast<uint32_t>(n));
    std::vector<float> x = random_vectors(8 * kN, static_cast<uint32_t>(n) + 5);
    x[2 * kN + 4999] = 3.0f;  // vector 2: the last element wins
    x[1 * kN + 17] = x[1 * kN + 18] = 2.0f;  // vector 1: a tie goes to the first
    h.set_f32("x", x);
    h.set_scalar(kRowsScalar, HostArg::i64(n));
    ASSERT_TRUE(h.runs());
    std::vector<int32_t> got(8), want(8);
    std::memcpy(got.data(), h.device_bytes("index").data(), 32);
    std::memcpy(want.data(), h.reference_bytes("index").data(), 32);
    for (int64_t v = 0; v < n; ++v) EXPECT_EQ(got[v], want[v]) << "vector " << v;
    for (int64_t v = n; v < 8; ++v) EXPECT_EQ(got[v], -1) << "vector " << v << " past the count was written";
    if (n > 1) {
      EXPECT_EQ(got[1], 17);
    }
    if (n > 2) {
      EXPECT_EQ(got[2], 4999);
    }
  }
}

}  // namespace
}  // namespace npurt::ops
