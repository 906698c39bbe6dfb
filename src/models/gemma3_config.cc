// Gemma-3 hyperparameters from GGUF metadata and tensor shape validation.
#include "npurt/models/gemma3_config.h"

#include <cmath>
#include <string_view>
#include <vector>

#include "npurt/isa/isa.h"
#include "npurt/isa/numeric.h"

namespace npurt::models {
namespace {

// Generous bounds that keep a hostile file from asking for absurd allocations
// (the KV cache and activations are sized from these).
constexpr uint64_t kMaxDim = 1u << 20;
constexpr uint64_t kMaxLayers = 1024;

StatusOr<int32_t> read_dim(const GgufFile& f, std::string_view key, uint64_t max) {
  NPURT_ASSIGN_OR_RETURN(uint64_t v, f.get_uint(key));
  if (v == 0 || v > max) {
    return invalid_argument("gemma3: " + std::string(key) + " = " + std::to_string(v) +
                            " is outside [1, " + std::to_string(max) + "]");
  }
  return static_cast<int32_t>(v);
}

// Like read_dim, but a missing key takes `fallback`.
StatusOr<int32_t> read_dim_or(const GgufFile& f, std::string_view key, int32_t fallback) {
  if (f.find(key) == nullptr) return fallback;
  return read_dim(f, key, kMaxDim);
}

std::string shape_string(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

Status check_tensor(const GgufTensor* t, std::string_view name,
                    const std::vector<uint64_t>& expected) {
  if (t == nullptr) return not_found("gemma3: tensor '" + std::string(name) + "' is missing");
  if (t->dims != expected) {
    return invalid_argument("gemma3: tensor '" + std::string(name) + "' has shape " +
                            shape_string(t->dims) + ", expected " + shape_string(expected));
  }
  // Rows are decoded one at a time, so each row must be whole blocks.
  if (t->dtype == isa::DType::kI32 || expected[0] % isa::dtype_block_elems(t->dtype) != 0) {
    return invalid_argument("gemma3: tensor '" + std::string(name) + "' has dtype " +
                            std::string(isa::dtype_name(t->dtype)) + ", which cannot hold rows of " +
                            std::to_string(expected[0]) + " values");
  }
  if (t->data.size() < isa::dtype_bytes(t->dtype, t->elements())) {
    return invalid_argument("gemma3: tensor '" + std::string(name) + "' data is truncated");
  }
  return ok_status();
}

Status check_named(const GgufFile& f, const std::string& name,
                   const std::vector<uint64_t>& expected) {
  return check_tensor(f.tensor(name), name, expected);
}

}  // namespace

std::string gemma3_block_tensor(int32_t layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

const GgufTensor* gemma3_output_weight(const GgufFile& file) {
  if (const GgufTensor* t = file.tensor("output.weight")) return t;
  return file.tensor("token_embd.weight");
}

StatusOr<Gemma3Config> Gemma3Config::from_gguf(const GgufFile& f) {
  if (f.find("general.architecture") != nullptr) {
    NPURT_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
    if (arch != "gemma3") {
      return invalid_argument("gemma3: general.architecture is '" + std::string(arch) +
                              "', expected 'gemma3'");
    }
  }
  Gemma3Config c;
  NPURT_ASSIGN_OR_RETURN(c.n_layers, read_dim(f, "gemma3.block_count", kMaxLayers));
  NPURT_ASSIGN_OR_RETURN(c.hidden, read_dim(f, "gemma3.embedding_length", kMaxDim));
  NPURT_ASSIGN_OR_RETURN(c.ffn, read_dim(f, "gemma3.feed_forward_length", kMaxDim));
  NPURT_ASSIGN_OR_RETURN(c.n_heads, read_dim(f, "gemma3.attention.head_count", kMaxDim));
  NPURT_ASSIGN_OR_RETURN(c.n_kv_heads, read_dim(f, "gemma3.attention.head_count_kv", kMaxDim));
  // llama.cpp's convention when the head sizes are absent: hidden / heads.
  NPURT_ASSIGN_OR_RETURN(c.head_dim,
                         read_dim_or(f, "gemma3.attention.key_length", c.hidden / c.n_heads));
  NPURT_ASSIGN_OR_RETURN(c.value_dim,
                         read_dim_or(f, "gemma3.attention.value_length", c.hidden / c.n_heads));
  NPURT_ASSIGN_OR_RETURN(c.sliding_window,
                         read_dim(f, "gemma3.attention.sliding_window", (uint64_t{1} << 31) - 1));
  NPURT_ASSIGN_OR_RETURN(c.context_length, read_dim(f, "gemma3.context_length", kMaxDim));
  NPURT_ASSIGN_OR_RETURN(c.rms_eps, f.get_float("gemma3.attention.layer_norm_rms_epsilon"));
  NPURT_ASSIGN_OR_RETURN(float base, f.get_float("gemma3.rope.freq_base"));
  c.rope_base_global = base;
  NPURT_ASSIGN_OR_RETURN(c.global_period,
                         read_dim_or(f, "gemma3.attention.sliding_window_pattern", Gemma3Config::kGlobalLayerPeriod));

  if (c.head_dim <= 0 || c.value_dim <= 0) {
    return invalid_argument("gemma3: head size is 0 (no key_length/value_length and "
                            "embedding_length < head_count)");
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument("gemma3: key_length " + std::to_string(c.head_dim) +
                            " is odd; NeoX RoPE rotates halves");
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument("gemma3: head_count " + std::to_string(c.n_heads) +
                            " is not a multiple of head_count_kv " + std::to_string(c.n_kv_heads));
  }
  if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps)) {
    return invalid_argument("gemma3: layer_norm_rms_epsilon must be positive and finite");
  }
  if (!(c.rope_base_global > 1) || !std::isfinite(c.rope_base_global)) {
    return invalid_argument("gemma3: rope.freq_base must be finite and > 1");
  }

  // The vocabulary size is the tokenizer's; without one, the embedding's row count.
  uint64_t vocab = 0;
  if (const GgufValue* toks = f.find("tokenizer.ggml.tokens");
      toks != nullptr && toks->type == GgufType::kArray) {
    vocab = toks->count;
  } else if (const GgufTensor* e = f.tensor("token_embd.weight"); e && e->dims.size() == 2) {
    vocab = e->dims[1];
  }
  if (vocab == 0 || vocab > (uint64_t{1} << 30)) {
    return invalid_argument("gemma3: vocabulary size " + std::to_string(vocab) +
                            " is outside [1, 2^30]");
  }
  c.vocab = static_cast<int32_t>(vocab);
  return c;
}

Status validate_gemma3_tensors(const GgufFile& f, const Gemma3Config& c) {
  const uint64_t h = c.hidden, q = uint64_t(c.n_heads) * c.head_dim;
  const uint64_t k = uint64_t(c.n_kv_heads) * c.head_dim;
  const uint64_t v = uint64_t(c.n_kv_heads) * c.value_dim;
  const uint64_t o = uint64_t(c.n_heads) * c.value_dim;
  NPURT_RETURN_IF_ERROR(check_named(f, "token_embd.weight", {h, uint64_t(c.vocab)}));
  NPURT_RETURN_IF_ERROR(check_named(f, "output_norm.weight", {h}));
  if (f.tensor("output.weight") != nullptr) {
    NPURT_RETURN_IF_ERROR(check_named(f, "output.weight", {h, uint64_t(c.vocab)}));
  }
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const struct {
      const char* what;
      std::vector<uint64_t> shape;
    } expected[] = {
        {"attn_norm", {h}},
        {"attn_q", {h, q}},
        {"attn_k", {h, k}},
        {"attn_v", {h, v}},
        {"attn_q_norm", {uint64_t(c.head_dim)}},
        {"attn_k_norm", {uint64_t(c.head_dim)}},
        {"attn_output", {o, h}},
        {"post_attention_norm", {h}},
        {"ffn_norm", {h}},
        {"ffn_gate", {h, uint64_t(c.ffn)}},
        {"ffn_up", {h, uint64_t(c.ffn)}},
        {"ffn_down", {uint64_t(c.ffn), h}},
        {"post_ffw_norm", {h}},
    };
    for (const auto& e : expected) {
      NPURT_RETURN_IF_ERROR(check_named(f, gemma3_block_tensor(l, e.what), e.shape));
    }
  }
  return ok_status();
}

}  // namespace npurt::models
