// Tests for the Gemma-3 config reader and the host forward pass: a tiny synthetic
// model checks validation and invariants, and a real model (when NPURT_MODEL names
// one) checks the known greedy answer.
#include "npurt/models/host_oracle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/gguf_writer.h"
#include "models/real_model.h"
#include "models/synthetic_gemma3.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {
namespace {

constexpr uint64_t kLayers = 2, kHidden = 64, kFfn = 128, kHeads = 2, kKvHeads = 1,
                   kHeadDim = 32, kVocab = 300;

using SyntheticOptions = SyntheticGemma3;

// Bytes and the file that views them, kept together.
struct Model {
  std::vector<uint8_t> bytes;
  GgufFile file;
};

Model parse(std::vector<uint8_t> bytes) {
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return Model{std::move(bytes), std::move(*f)};
}

std::vector<float> run(HostOracle& o, const std::vector<int32_t>& tokens) {
  std::vector<float> last;
  for (int32_t t : tokens) {
    StatusOr<std::span<const float>> logits = o.step(t);
    EXPECT_TRUE(logits.ok()) << logits.status().to_string();
    if (!logits.ok()) return {};
    last.assign(logits->begin(), logits->end());
  }
  return last;
}

TEST(Gemma3ConfigTest, ReadsHyperparameters) {
  Model m = parse(synthetic_gemma3());
  StatusOr<Gemma3Config> c = Gemma3Config::from_gguf(m.file);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->n_layers, 2);
  EXPECT_EQ(c->hidden, 64);
  EXPECT_EQ(c->ffn, 128);
  EXPECT_EQ(c->n_heads, 2);
  EXPECT_EQ(c->n_kv_heads, 1);
  EXPECT_EQ(c->group(), 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->value_dim, 32);
  EXPECT_EQ(c->vocab, 300);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->context_length, 64);
  EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
  EXPECT_DOUBLE_EQ(c->rope_base(5), 1e6);
  EXPECT_DOUBLE_EQ(c->rope_base(0), 10000.0);
  EXPECT_FALSE(c->is_global(0));
  EXPECT_TRUE(c->is_global(5));
  EXPECT_TRUE(c->is_global(11));
  EXPECT_TRUE(c->is_global(17));
  EXPECT_TRUE(validate_gemma3_tensors(m.file, *c).ok());
  EXPECT_EQ(gemma3_output_weight(m.file), m.file.tensor("token_embd.weight"));
}

TEST(Gemma3ConfigTest, MissingTensorIsNamed) {
  SyntheticOptions opt;
  opt.omit = "blk.1.ffn_up.weight";
  Model m = parse(synthetic_gemma3(opt));
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kNotFound);
  EXPECT_NE(o.status().message().find("blk.1.ffn_up.weight"), std::string::npos)
      << o.status().to_string();
}

TEST(Gemma3ConfigTest, WrongShapeIsNamedWithBothShapes) {
  SyntheticOptions opt;
  opt.shape["blk.0.attn_k.weight"] = {kHidden, 2 * kHeadDim};
  Model m = parse(synthetic_gemma3(opt));
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  const std::string& msg = o.status().message();
  EXPECT_NE(msg.find("blk.0.attn_k.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [64, 32]"), std::string::npos) << msg;
}

TEST(Gemma3ConfigTest, MissingKeyFails) {
  GgufWriter w;
  w.kv_u32("gemma3.block_count", 2);
  std::vector<uint8_t> bytes = w.bytes();
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok());
  StatusOr<Gemma3Config> c = Gemma3Config::from_gguf(*f);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("gemma3.embedding_length"), std::string::npos)
      << c.status().to_string();
}

TEST(HostOracleTest, LogitsFiniteAndPositionAdvances) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->position(), 0);
  for (int32_t tok : {5, 17, 299}) {
    StatusOr<std::span<const float>> logits = o->step(tok);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    ASSERT_EQ(logits->size(), kVocab);
    for (float x : *logits) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(o->position(), 3);
  ASSERT_TRUE(o->reset().ok());
  EXPECT_EQ(o->position(), 0);
}

TEST(HostOracleTest, DeterministicAcrossResets) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  const std::vector<int32_t> tokens = {2, 40, 41, 7};
  std::vector<float> first = run(*o, tokens);
  ASSERT_TRUE(o->reset().ok());
  std::vector<float> second = run(*o, tokens);
  ASSERT_EQ(first.size(), kVocab);
  EXPECT_EQ(first, second);
}

TEST(HostOracleTest, ContextDependsOnEarlierTokens) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  std::vector<float> a = run(*o, {10, 20});
  ASSERT_TRUE(o->reset().ok());
  std::vector<float> b = run(*o, {11, 20});
  EXPECT_NE(a, b);
}

TEST(HostOracleTest, SlidingWindowMatters) {
  SyntheticOptions narrow;
  narrow.sliding_window = 1;  // both layers are local: each sees only itself
  Model full_model = parse(synthetic_gemma3());
  Model narrow_model = parse(synthetic_gemma3(narrow));
  StatusOr<HostOracle> full = HostOracle::load(full_model.file);
  StatusOr<HostOracle> local = HostOracle::load(narrow_model.file);
  ASSERT_TRUE(full.ok() && local.ok());
  // One token: nothing to mask, so the two agree.
  EXPECT_EQ(run(*full, {3}), run(*local, {3}));
  // A second token: the window hides the first one.
  EXPECT_NE(run(*full, {9}), run(*local, {9}));
}

TEST(HostOracleTest, GreedyReturnsRequestedTokens) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  StatusOr<std::vector<int32_t>> out = greedy(*o, {2, 100, 200}, 5);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 5u);
  for (int32_t t : *out) EXPECT_TRUE(t >= 0 && t < static_cast<int32_t>(kVocab));
  // The prompt and every generated token but the last ran through the model.
  EXPECT_EQ(o->position(), 3 + 5 - 1);
  // The first generated token is the argmax after the prompt.
  ASSERT_TRUE(o->reset().ok());
  std::vector<float> logits = run(*o, {2, 100, 200});
  EXPECT_EQ((*out)[0], std::max_element(logits.begin(), logits.end()) - logits.begin());
  StatusOr<std::vector<int32_t>> again = greedy(*o, {2, 100, 200}, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *out);
}

TEST(HostOracleTest, RejectsBadInput) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->step(300).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o->step(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o->position(), 0);
  EXPECT_FALSE(greedy(*o, {}, 3).ok());
  EXPECT_FALSE(greedy(*o, {1}, -1).ok());
  // The context length (64) bounds the KV cache.
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(o->step(1).ok());
  EXPECT_EQ(o->step(1).status().code(), StatusCode::kOutOfRange);
}

// host_matmul against dot products formed in dot()'s order (partial sums over i mod 4
// in double, then (s0 + s1) + (s2 + s3)), for every batch size up to 9 (blocks of four
// tokens, or of four rows, and what is left over), with a sum length and a row count
// that leave a tail past the blocks. Outputs start as NaN.
TEST(HostOracleTest, MatmulIsDotProductsInOneOrderForEveryBatch) {
  const int32_t in = 70, out = 11;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<size_t>(in) * out);
  for (float& v : w) v = normal(rng);
  auto reference = [&](const float* row, const float* x) {
    double s[4] = {};
    for (int32_t i = 0; i < in; ++i) s[i < in - in % 4 ? i % 4 : 0] += double(row[i]) * x[i];
    return static_cast<float>((s[0] + s[1]) + (s[2] + s[3]));
  };
  for (int32_t tokens = 1; tokens <= 9; ++tokens) {
    std::vector<float> x(static_cast<size_t>(tokens) * in), y(static_cast<size_t>(tokens) * out, std::nanf(""));
    for (float& v : x) v = normal(rng);
    host_matmul(reinterpret_cast<const uint8_t*>(w.data()), isa::DType::kF32, in, out, x.data(), tokens, y.data());
    for (int32_t t = 0; t < tokens; ++t) {
      for (int32_t r = 0; r < out; ++r) {
        EXPECT_EQ(y[static_cast<size_t>(t) * out + r], reference(&w[static_cast<size_t>(r) * in], &x[static_cast<size_t>(t) * in]))
            << tokens << " tokens, token " << t << ", row " << r;
      }
    }
  }
}

// prefill() runs a layer at a time over many tokens: the same bits as a step per token,
// across the sliding window (8, local layer) and a chunk of the global layer.
TEST(HostOracleTest, PrefillIsStepByStepBitForBit) {
  SyntheticOptions options;
  options.sliding_window = 8;
  options.global_period = 2;
  options.dtype = {{"blk.0.ffn_down.weight", isa::DType::kQ8_0}, {"blk.1.attn_q.weight", isa::DType::kQ8_0}};
  Model m = parse(synthetic_gemma3(options));
  StatusOr<HostOracle> stepped = HostOracle::load(m.file), batched = HostOracle::load(m.file);
  ASSERT_TRUE(stepped.ok() && batched.ok());
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(37);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
  const std::vector<float> want = run(*stepped, prompt);
  ASSERT_TRUE(batched->prefill(std::span<const int32_t>(prompt).first(prompt.size() - 1)).ok());
  EXPECT_EQ(batched->position(), 36);
  const std::vector<float> got = run(*batched, {prompt.back()});
  ASSERT_EQ(got.size(), kVocab);
  EXPECT_EQ(got, want);
  // The caches are the same too: the next step agrees.
  EXPECT_EQ(run(*batched, {5}), run(*stepped, {5}));
}

TEST(HostOracleTest, PrefillRefusesBadInputWithoutRunning) {
  Model m = parse(synthetic_gemma3());
  StatusOr<HostOracle> o = HostOracle::load(m.file);
  ASSERT_TRUE(o.ok());
  const Status bad_token = o->prefill(std::vector<int32_t>{1, 2, 300});
  EXPECT_EQ(bad_token.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_token.message().find("token 300"), std::string::npos) << bad_token.to_string();
  ASSERT_TRUE(o->prefill(std::vector<int32_t>(60, 1)).ok());
  const Status too_long = o->prefill(std::vector<int32_t>(5, 1));  // 60 + 5 > 64 positions
  EXPECT_EQ(too_long.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.message().find("position 64 is past the context length 64"), std::string::npos)
      << too_long.to_string();
  EXPECT_EQ(o->position(), 60);
  EXPECT_TRUE(o->prefill(std::vector<int32_t>(4, 1)).ok());
}

// The real file against an independent runtime: llama.cpp (llama-cpp-python 0.3.36,
// CPU) on the same file (SHA-256 a5fd3b62...6818) ranks the next token after "The
// capital of France is" as below and decodes the greedy tokens below. Its quantized
// matmuls round activations to 8 bits, so logits agree to about 0.1, not exactly.
// (The model spec expects " Paris" (9079) first; on this file both runtimes rank it
// third: see docs/models.md.)
TEST(HostOracleTest, RealModelMatchesLlamaCpp) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  StatusOr<RealModel> model = open_real_model(path);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  StatusOr<HostOracle> oracle = HostOracle::load(model->file);
  ASSERT_TRUE(oracle.ok()) << oracle.status().to_string();

  StatusOr<std::vector<int32_t>> prompt = model->tokenizer.encode("The capital of France is");
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, (std::vector<int32_t>{2, 818, 5279, 529, 7001, 563}));

  const std::vector<float> logits = run(*oracle, *prompt);
  ASSERT_EQ(logits.size(), 262144u);
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int32_t want_ids[5] = {506, 496, 9079, 886, 3224};  // " the" " a" " Paris" " one" " known"
  const float want_logits[5] = {18.9994f, 18.4923f, 18.3238f, 18.1026f, 17.7013f};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(order[i], want_ids[i]) << "rank " << i;
    EXPECT_NEAR(logits[want_ids[i]], want_logits[i], 0.15f) << "token " << want_ids[i];
  }

  const auto start = std::chrono::steady_clock::now();
  // llama.cpp's 16 greedy tokens end "... city in France."; the 16th is a near tie
  // that its 8-bit activations break differently (here " and"), so 15 must agree.
  StatusOr<std::vector<int32_t>> out = greedy(*oracle, *prompt, 15, &model->tokenizer);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, (std::vector<int32_t>{506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207,
                                        528, 7001}));
  std::printf("greedy: '%s'; %.1f ms per token\n", model->tokenizer.decode(*out).c_str(),
              1000.0 * seconds / static_cast<double>(prompt->size() + out->size() - 1));
}

}  // namespace
}  // namespace npurt::models
