// Gemma-3 on a device: the whole decode step as one operator sequence, with the
// weights and the KV cache resident in device memory and the position a runtime
// scalar, so one compiled sequence serves every token.
//
//   StatusOr<models::GgufFile> file = models::GgufFile::open(path);
//   auto runtime = Runtime::create_sim(*models::gemma3_sim_options(*file));
//   auto model = models::Gemma3Model::load(*file, **runtime);
//   StatusOr<int32_t> next = (*model)->step(token);  // greedy successor of `token`
//
// The sequence (gemma3_decode_step) binds buffers by GGUF tensor name, so each weight
// is copied from the file once, in its stored (possibly quantized) type; kernels
// dequantize as they load. A step runs, for every layer, RMSNorm, the q/k/v GEMVs,
// per-head q/k norms, RoPE (base a runtime scalar: 10000 on local layers, the file's
// freq_base on global ones), the KV append at row `pos`, decode attention over `len`
// = pos + 1 positions (sliding window on local layers), the output projection, the
// post-attention norm and residual add, then the gated-GELU MLP with its norms and
// residual add; finally the output norm, the LM head and an argmax. Activations and
// the KV cache are f32. Buffer names other than tensors: the residual "h", the
// scratch vectors "x" "q" "k" "v" "attn" "a" "g" "u" "f", caches "k_cache.<layer>"
// and "v_cache.<layer>", "logits" and the output "next" (one i32).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/hal/sim_device.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/token_model.h"

namespace npurt::models {

struct Gemma3Options {
  // KV-cache capacity in positions (f32 keys and values: 36 KiB per position for
  // Gemma-3-270M); 0 takes the file's context length. Capped at the context length.
  uint32_t max_context = 4096;
  graph::Dispatch dispatch = graph::Dispatch::kFused;
  // Batched prefill: the most prompt tokens one prefill call runs (the compiled chunk;
  // capped at the context); 0 compiles none, so prompts run token by token.
  uint32_t prefill_chunk = kDefaultPrefillChunk;
  static constexpr uint32_t kDefaultPrefillChunk = 512;
  // WRONG, for tests only: the prefill attention ignores the sliding window.
  bool prefill_ignores_window_for_test = false;
};

// The decode step of `config` over the tensors of `file` (their stored dtypes decide
// each GEMV's weight type). Rejects options the model cannot run with, by name.
StatusOr<graph::OperatorSequence> gemma3_decode_step(const GgufFile& file, const Gemma3Config& config,
                                                     const Gemma3Options& options);

// The prefill chunk of `config`: T prompt tokens per call (T = the "rows" scalar, up to
// options.prefill_chunk) at positions pos .. pos + T - 1 as matrix work (WeightGemm,
// PrefillAttention, row-batched norms, RoPE and KV append), then the LM head and
// argmax for the last token only. Binds the same tensor and cache names as
// gemma3_decode_step, so the two share them (CompileOptions::shared).
StatusOr<graph::OperatorSequence> gemma3_prefill_chunk(const GgufFile& file, const Gemma3Config& config,
                                                       const Gemma3Options& options);

class Gemma3Model final : public TokenModel {
 public:
  // Called after each tensor is resident: bytes done so far, bytes in all.
  using Progress = std::function<void(uint64_t done, uint64_t total)>;

  // Validates the file, compiles the decode step, and copies every weight to the
  // runtime's device (norm weights converted to f32). The model keeps the runtime
  // alive; the file need not outlive it.
  static StatusOr<std::unique_ptr<Gemma3Model>> load(const GgufFile& file, Runtime& runtime,
                                                     const Gemma3Options& options = {},
                                                     const Progress& progress = {});
  // The same on a simulated NPU of its own with `cores` cores (gemma3_sim_options):
  // what a program that only wants to decode needs.
  static StatusOr<std::unique_ptr<Gemma3Model>> load_sim(const GgufFile& file, uint32_t cores = 8,
                                                         const Gemma3Options& options = {},
                                                         const Progress& progress = {});

  // Runs `token` at position() and returns the argmax of its logits.
  StatusOr<int32_t> step(int32_t token) override;
  // Runs `tokens` from position() on, in chunks of prefill_chunk() tokens through the
  // prefill sequence (token by token when that is 0), and returns the argmax of the
  // last one's logits. The KV cache ends as token-by-token steps would leave it.
  StatusOr<int32_t> prefill(std::span<const int32_t> tokens) override;
  // Tokens per prefill call: 1 .. max_prefill_chunk(), or 0 for token by token.
  Status set_prefill_chunk(uint32_t chunk);
  uint32_t prefill_chunk() const { return chunk_; }
  uint32_t max_prefill_chunk() const { return max_chunk_; }
  // The next step is at position 0 (cached positions are overwritten before use).
  Status reset() override;
  int32_t position() const override { return position_; }

  // The logits of the last step (vocab floats), read back from the device.
  StatusOr<std::vector<float>> logits() const;

  const Gemma3Config& config() const { return config_; }
  uint32_t max_context() const { return max_context_; }
  // Bytes of weights a step reads (every tensor once; the tied LM head once more).
  uint64_t weight_bytes_per_step() const { return weight_bytes_per_step_; }
  size_t launches_per_step() const { return seq_->launches_per_call(); }
  const graph::CompiledSequence& sequence() const { return *seq_; }
  // The prefill chunk's sequence; nullptr when compiled without one.
  const graph::CompiledSequence* prefill_sequence() const { return prefill_.get(); }

 private:
  Gemma3Model() = default;

  std::shared_ptr<Runtime> runtime_;
  StatusOr<int32_t> prefill_chunk_call(std::span<const int32_t> tokens);

  std::unique_ptr<graph::CompiledSequence> seq_, prefill_;
  View next_, logits_;                  // the decode step's "next" and "logits" buffers
  View prefill_tokens_, prefill_next_, prefill_logits_;
  const View* last_logits_ = &logits_;  // of whichever sequence ran last
  uint32_t chunk_ = 0, max_chunk_ = 0;
  Gemma3Config config_;
  uint32_t max_context_ = 0;
  uint64_t weight_bytes_per_step_ = 0;
  int32_t position_ = 0;
};

// A simulated NPU for `file` with `cores` cores, its global memory sized for the
// weights, the KV cache of the options' context and room for activations and code
// (pages are reserved lazily, so the margin costs nothing): Runtime::create_sim's
// options for a program that only wants to decode.
StatusOr<hal::SimOptions> gemma3_sim_options(const GgufFile& file, uint32_t cores = 8,
                                             const Gemma3Options& options = {});

}  // namespace npurt::models
