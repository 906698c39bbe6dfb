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
#include <filesystem>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/gguf_writer.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {
namespace {

constexpr uint64_t kLayers = 2, kHidden = 64, kFfn = 128, kHeads = 2, kKvHeads = 1,
                   kHeadDim = 32, kVocab = 300;

struct SyntheticOptions {
  uint32_t sliding_window = 4096;
  std::string omit;                                    // a tensor to leave out
  std::map<std::string, std::vector<uint64_t>> shape;  // tensors with a different shape
};

// A tiny Gemma-3: random weights scaled by 1/sqrt(in), norm weights near 1.
std::vector<uint8_t> synthetic_gemma3(const SyntheticOptions& opt = {}) {
  GgufWriter w;
  w.kv_str("general.architecture", "gemma3");
  w.kv_u32("gemma3.block_count", kLayers);
  w.kv_u32("gemma3.embedding_length", kHidden);
  w.kv_u32("gemma3.feed_forward_length", kFfn);
  w.kv_u32("gemma3.attention.head_count", kHeads);
  w.kv_u32("gemma3.attention.head_count_kv", kKvHeads);
  w.kv_u32("gemma3.attention.key_length", kHeadDim);
  w.kv_u32("gemma3.attention.value_length", kHeadDim);
  w.kv_u32("gemma3.attention.sliding_window", opt.sliding_window);
  w.kv_u32("gemma3.context_length", 64);
  w.kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_f32("gemma3.rope.freq_base", 1e6f);

  std::mt19937 rng(1234);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, bool norm) {
    if (name == opt.omit) return;
    if (auto it = opt.shape.find(name); it != opt.shape.end()) dims = it->second;
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    const float scale = norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(dims[0]));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = (norm ? 1.0f : 0.0f) + scale * u(rng);
    w.tensor_f32(name, dims, v);
  };
  add("token_embd.weight", {kHidden, kVocab}, false);
  add("output_norm.weight", {kHidden}, true);
  for (int32_t l = 0; l < static_cast<int32_t>(kLayers); ++l) {
    auto b = [&](const char* what) { return gemma3_block_tensor(l, what); };
    add(b("attn_norm"), {kHidden}, true);
    add(b("attn_q"), {kHidden, kHeads * kHeadDim}, false);
    add(b("attn_k"), {kHidden, kKvHeads * kHeadDim}, false);
    add(b("attn_v"), {kHidden, kKvHeads * kHeadDim}, false);
    add(b("attn_q_norm"), {kHeadDim}, true);
    add(b("attn_k_norm"), {kHeadDim}, true);
    add(b("attn_output"), {kHeads * kHeadDim, kHidden}, false);
    add(b("post_attention_norm"), {kHidden}, true);
    add(b("ffn_norm"), {kHidden}, true);
    add(b("ffn_gate"), {kHidden, kFfn}, false);
    add(b("ffn_up"), {kHidden, kFfn}, false);
    add(b("ffn_down"), {kFfn, kHidden}, false);
    add(b("post_ffw_norm"), {kHidden}, true);
  }
  return w.bytes();
}

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

TEST(HostOracleTest, RealModelAnswersParis) {
  const char* path = std::getenv("NPURT_MODEL");
  if (path == nullptr || !std::filesystem::is_regular_file(path)) {
    GTEST_SKIP() << "set NPURT_MODEL to a Gemma-3-270M GGUF file to run this test";
  }
  StatusOr<GgufFile> file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  StatusOr<Tokenizer> tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  StatusOr<HostOracle> oracle = HostOracle::load(*file);
  ASSERT_TRUE(oracle.ok()) << oracle.status().to_string();

  StatusOr<std::vector<int32_t>> prompt = tok->encode("The capital of France is");
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_EQ(*prompt, (std::vector<int32_t>{2, 818, 5279, 529, 7001, 563}));

  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::vector<int32_t>> out = greedy(*oracle, *prompt, 1, &*tok);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0], 9079);
  const std::string text = tok->decode(*out);
  EXPECT_EQ(text, " Paris");
  std::printf("next token %d '%s'; %.1f ms per token over %zu tokens\n", (*out)[0], text.c_str(),
              1000.0 * seconds / static_cast<double>(prompt->size()), prompt->size());
}

}  // namespace
}  // namespace npurt::models
