// A tiny Gemma-3 GGUF written by the tests: random weights of any supported type,
// small dimensions, and the metadata the config reader needs.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/gguf_writer.h"
#include "npurt/isa/isa.h"
#include "npurt/isa/numeric.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "ops/random_inputs.h"

namespace npurt::models {

struct SyntheticGemma3 {
  uint64_t layers = 2, hidden = 64, ffn = 128, heads = 2, kv_heads = 1, head_dim = 32, vocab = 300;
  uint32_t sliding_window = 4096;
  uint32_t context = 64;
  uint32_t global_period = 0;  // 0: not stored (the family's 6)
  uint32_t seed = 1234;
  std::string omit = {};                                    // a tensor to leave out
  std::map<std::string, std::vector<uint64_t>> shape = {};  // tensors with a different shape
  std::map<std::string, isa::DType> dtype = {};             // non-norm tensors not in f32; "output.weight": untied head
};

// The matrices of a block, in the order matrix_dtypes() takes a layer's dtypes.
inline constexpr const char* kBlockMatrices[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                 "ffn_gate", "ffn_up", "ffn_down"};
using LayerDTypes = std::array<isa::DType, std::size(kBlockMatrices)>;

// SyntheticGemma3::dtype for an untied model whose every matrix has a type of its own:
// the embedding's, the LM head's, and each layer's in kBlockMatrices order.
inline std::map<std::string, isa::DType> matrix_dtypes(isa::DType embedding, isa::DType head,
                                                       std::initializer_list<LayerDTypes> layers) {
  std::map<std::string, isa::DType> dtypes{{"token_embd.weight", embedding}, {"output.weight", head}};
  int32_t l = 0;
  for (const LayerDTypes& layer : layers) {
    for (size_t i = 0; i < layer.size(); ++i) dtypes[gemma3_block_tensor(l, kBlockMatrices[i])] = layer[i];
    ++l;
  }
  return dtypes;
}

inline uint32_t ggml_type_of(isa::DType t) {
  switch (t) {
    case isa::DType::kF32: return 0;
    case isa::DType::kF16: return 1;
    case isa::DType::kQ4_0: return 2;
    case isa::DType::kQ5_0: return 6;
    case isa::DType::kQ8_0: return 8;
    case isa::DType::kQ4_K: return 12;
    case isa::DType::kQ5_K: return 13;
    case isa::DType::kQ6_K: return 14;
    case isa::DType::kBF16: return 30;
    default: return 0xFFFFFFFFu;
  }
}

// Plain weights are uniform in +-1/sqrt(in); quantized ones random blocks with small
// scales (values around +-1, so they are scaled by the RMSNorms that follow); norm
// weights are 1 +- 0.1.
inline std::vector<uint8_t> synthetic_gemma3(const SyntheticGemma3& m = {}) {
  GgufWriter w;
  w.kv_str("general.architecture", "gemma3");
  w.kv_u32("gemma3.block_count", m.layers);
  w.kv_u32("gemma3.embedding_length", m.hidden);
  w.kv_u32("gemma3.feed_forward_length", m.ffn);
  w.kv_u32("gemma3.attention.head_count", m.heads);
  w.kv_u32("gemma3.attention.head_count_kv", m.kv_heads);
  w.kv_u32("gemma3.attention.key_length", m.head_dim);
  w.kv_u32("gemma3.attention.value_length", m.head_dim);
  w.kv_u32("gemma3.attention.sliding_window", m.sliding_window);
  if (m.global_period != 0) w.kv_u32("gemma3.attention.sliding_window_pattern", m.global_period);
  w.kv_u32("gemma3.context_length", m.context);
  w.kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_f32("gemma3.rope.freq_base", 1e6f);

  std::mt19937 rng(m.seed);
  auto add = [&](const std::string& name, std::vector<uint64_t> dims, bool norm) {
    if (name == m.omit) return;
    if (auto it = m.shape.find(name); it != m.shape.end()) dims = it->second;
    uint64_t n = 1;
    for (uint64_t d : dims) n *= d;
    const auto t = m.dtype.find(name);
    if (t != m.dtype.end() && isa::dtype_is_quantized(t->second)) {
      w.tensor(name, dims, ggml_type_of(t->second), testing::random_quant_blocks(t->second, n, rng));
      return;
    }
    const float scale = norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(dims[0]));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = (norm ? 1.0f : 0.0f) + scale * u(rng);
    if (t == m.dtype.end() || t->second == isa::DType::kF32) {
      w.tensor_f32(name, dims, v);
      return;
    }
    std::vector<uint8_t> raw(n * isa::dtype_size(t->second));
    isa::from_f32(v.data(), t->second, raw.data(), n);
    w.tensor(name, dims, ggml_type_of(t->second), std::move(raw));
  };
  add("token_embd.weight", {m.hidden, m.vocab}, false);
  // An untied LM head when a type is given for it (Gemma-3 files tie it to the embedding).
  if (m.dtype.count("output.weight")) add("output.weight", {m.hidden, m.vocab}, false);
  add("output_norm.weight", {m.hidden}, true);
  for (int32_t l = 0; l < static_cast<int32_t>(m.layers); ++l) {
    auto b = [&](const char* what) { return gemma3_block_tensor(l, what); };
    add(b("attn_norm"), {m.hidden}, true);
    add(b("attn_q"), {m.hidden, m.heads * m.head_dim}, false);
    add(b("attn_k"), {m.hidden, m.kv_heads * m.head_dim}, false);
    add(b("attn_v"), {m.hidden, m.kv_heads * m.head_dim}, false);
    add(b("attn_q_norm"), {m.head_dim}, true);
    add(b("attn_k_norm"), {m.head_dim}, true);
    add(b("attn_output"), {m.heads * m.head_dim, m.hidden}, false);
    add(b("post_attention_norm"), {m.hidden}, true);
    add(b("ffn_norm"), {m.hidden}, true);
    add(b("ffn_gate"), {m.hidden, m.ffn}, false);
    add(b("ffn_up"), {m.hidden, m.ffn}, false);
    add(b("ffn_down"), {m.ffn, m.hidden}, false);
    add(b("post_ffw_norm"), {m.hidden}, true);
  }
  return w.bytes();
}

// A synthetic file's bytes and the GgufFile parsed from them (which points into them).
struct Parsed {
  std::vector<uint8_t> bytes;
  GgufFile file;
};

inline Parsed parse(std::vector<uint8_t> bytes) {
  GgufFile f = std::move(GgufFile::parse(bytes)).value();
  return {std::move(bytes), std::move(f)};
}

}  // namespace npurt::models
