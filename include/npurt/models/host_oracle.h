// A plain f32 Gemma-3 forward pass on the host, token by token: the reference
// ("oracle") that device implementations are compared against.
//
//   StatusOr<models::GgufFile> file = models::GgufFile::open(path);
//   StatusOr<models::HostOracle> oracle = models::HostOracle::load(*file);
//   StatusOr<std::span<const float>> logits = oracle->step(token);  // vocab floats
//
// Weights stay in the file in their stored (possibly quantized) form and each row is
// decoded with isa::to_f32 when it is used; only the norm weights are kept as f32
// copies. Activations, the residual stream and the KV cache are f32; reductions
// accumulate in double. The GgufFile must outlive the HostOracle.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/isa.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/token_model.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {

class HostOracle {
 public:
  // Reads the config and validates every tensor; nothing is dequantized up front.
  static StatusOr<HostOracle> load(const GgufFile& file);

  // Empties the KV cache; the next step() is at position 0.
  Status reset();
  // Runs `token` at position() and appends its keys and values to the cache. The
  // logits stay valid until the next step() or reset(). Without `logits` the LM head
  // (most of a step's work) is skipped and the span is empty: prompt tokens before the
  // last need only their keys and values.
  StatusOr<std::span<const float>> step(int32_t token, bool logits = true);
  // step(token, false) for each of `tokens` in turn, the same bits, but one layer at a
  // time over all of them: each weight row is decoded once per chunk of tokens instead
  // of once per token. Nothing runs if a token or the length is refused.
  Status prefill(std::span<const int32_t> tokens);

  int32_t position() const { return position_; }
  const Gemma3Config& config() const { return config_; }

 private:
  // A stored weight [in, out]: `out` rows of `in` values, decoded row by row.
  struct Matrix {
    const uint8_t* data = nullptr;
    isa::DType dtype = isa::DType::kF32;
    int32_t in = 0;
    int32_t out = 0;
    size_t row_bytes = 0;
  };
  struct Layer {
    Matrix q, k, v, o, gate, up, down;
    std::vector<float> attn_norm, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffw_norm;
    std::vector<float> k_cache, v_cache;  // position-major: [pos][kv_head][dim]
  };

  HostOracle() = default;
  Status check(std::span<const int32_t> tokens) const;
  // Runs tokens at position() onwards through every layer, appending to the cache;
  // returns the last token's hidden state.
  std::vector<float> forward(std::span<const int32_t> tokens);
  // The blocks over n tokens' hidden states h ([n][hidden]), in place.
  void attention_block(int32_t l, int32_t n, std::vector<float>& h);
  void ffn_block(int32_t l, int32_t n, std::vector<float>& h);
  void attend(const Layer& layer, bool global, int32_t position, const float* q, float* out) const;
  void rms_norm_rows(std::vector<float>& x, int32_t n, int32_t width, const std::vector<float>& w) const;
  static void matmul(const Matrix& m, const float* x, int32_t n, float* y);

  Gemma3Config config_;
  Matrix embed_, output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
  std::vector<float> logits_;
  int32_t position_ = 0;
};

// y[r] = dot(row r of w, x) for a stored weight; rows decode one at a time and run in
// parallel over row ranges. Exposed for tests and other host references.
void host_matvec(const uint8_t* data, isa::DType dtype, int32_t in, int32_t out,
                 const float* x, float* y);
// host_matvec of `tokens` vectors x[t] ([tokens][in]) into y[t] ([tokens][out]), each
// row decoded once for all of them; y[t] is the bits host_matvec(x[t]) gives.
void host_matmul(const uint8_t* data, isa::DType dtype, int32_t in, int32_t out,
                 const float* x, int32_t tokens, float* y);

// The oracle as a TokenModel: step() returns the argmax of its logits.
class HostTokenModel final : public TokenModel {
 public:
  explicit HostTokenModel(HostOracle& oracle) : oracle_(oracle) {}
  StatusOr<int32_t> step(int32_t token) override;
  // Every token but the last without its LM head.
  StatusOr<int32_t> prefill(std::span<const int32_t> tokens) override;
  Status reset() override { return oracle_.reset(); }
  int32_t position() const override { return oracle_.position(); }
  StatusOr<std::vector<float>> logits() const override;

 private:
  HostOracle& oracle_;
  std::vector<float> logits_;  // of the last step
};

// Greedy decoding with the oracle: generate() over a HostTokenModel.
StatusOr<std::vector<int32_t>> greedy(HostOracle& oracle, const std::vector<int32_t>& prompt,
                                      int max_new_tokens, const Tokenizer* stop = nullptr);

}  // namespace npurt::models
