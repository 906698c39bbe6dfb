// Gemma-3 hyperparameters read from a GGUF file, and the checks that the file's
// tensors match them.
//
//   StatusOr<models::Gemma3Config> cfg = models::Gemma3Config::from_gguf(file);
//   Status s = models::validate_gemma3_tensors(file, *cfg);  // names any bad tensor
//
// Everything the file stores is read from it; the two facts it does not store (the
// local-layer RoPE base and which layers attend globally) are fixed by the model
// family and documented below.
#pragma once

#include <cstdint>
#include <string>

#include "npurt/base/status.h"
#include "npurt/models/gguf.h"

namespace npurt::models {

struct Gemma3Config {
  int32_t n_layers = 0;        // gemma3.block_count
  int32_t hidden = 0;          // gemma3.embedding_length
  int32_t ffn = 0;             // gemma3.feed_forward_length
  int32_t n_heads = 0;         // gemma3.attention.head_count
  int32_t n_kv_heads = 0;      // gemma3.attention.head_count_kv
  int32_t head_dim = 0;        // gemma3.attention.key_length
  int32_t value_dim = 0;       // gemma3.attention.value_length
  int32_t vocab = 0;           // tokenizer.ggml.tokens length, else token_embd rows
  int32_t sliding_window = 0;  // gemma3.attention.sliding_window
  int32_t context_length = 0;  // gemma3.context_length
  float rms_eps = 1e-6f;       // gemma3.attention.layer_norm_rms_epsilon
  double rope_base_global = 0; // gemma3.rope.freq_base

  // Not stored in Gemma-3 GGUF files: the family fixes the sliding-window layers'
  // RoPE base at 10000 and makes every 6th layer (0-based 5, 11, 17, ...) a
  // full-attention one. A file may give the period as the u32
  // gemma3.attention.sliding_window_pattern (small test models do).
  static constexpr double kRopeBaseLocal = 10000.0;
  static constexpr int32_t kGlobalLayerPeriod = 6;
  int32_t global_period = kGlobalLayerPeriod;

  bool is_global(int32_t layer) const { return layer % global_period == global_period - 1; }
  double rope_base(int32_t layer) const {
    return is_global(layer) ? rope_base_global : kRopeBaseLocal;
  }
  // Query heads per KV head (grouped-query attention).
  int32_t group() const { return n_heads / n_kv_heads; }

  // Reads and range-checks the metadata; errors name the key.
  static StatusOr<Gemma3Config> from_gguf(const GgufFile& file);
};

// "blk.<layer>.<what>.weight".
std::string gemma3_block_tensor(int32_t layer, const char* what);

// The LM head: output.weight when the file has one, else the tied token_embd.weight.
const GgufTensor* gemma3_output_weight(const GgufFile& file);

// Checks that every tensor the forward pass reads exists, has a dtype the host can
// decode with rows that are whole blocks, and has the shape the config implies.
// Errors name the tensor and give the expected and actual shape.
Status validate_gemma3_tensors(const GgufFile& file, const Gemma3Config& config);

}  // namespace npurt::models
