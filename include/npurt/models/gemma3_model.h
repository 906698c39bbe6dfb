// Gemma-3 on a device: the whole decode step as one operator sequence, with the
// weights and the KV cache resident in device memory and the position a runtime
// scalar, so one compiled sequence serves every token.
//
//   StatusOr<models::GgufFile> file = models::GgufFile::open(path);
//   auto model = models::Gemma3Model::load(*file, memory, registry);
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
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/memory/memory_context.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/token_model.h"

namespace npurt::models {

struct Gemma3Options {
  // KV-cache capacity in positions (f32 keys and values: 36 KiB per position for
  // Gemma-3-270M); 0 takes the file's context length. Capped at the context length.
  uint32_t max_context = 4096;
  graph::Dispatch dispatch = graph::Dispatch::kFused;
};

// The decode step of `config` over the tensors of `file` (their stored dtypes decide
// each GEMV's weight type). Rejects options the model cannot run with, by name.
StatusOr<graph::OperatorSequence> gemma3_decode_step(const GgufFile& file, const Gemma3Config& config,
                                                     const Gemma3Options& options);

class Gemma3Model final : public TokenModel {
 public:
  // Called after each tensor is resident: bytes done so far, bytes in all.
  using Progress = std::function<void(uint64_t done, uint64_t total)>;

  // Validates the file, compiles the decode step, and copies every weight to the
  // device (norm weights converted to f32). `memory` and `registry` must outlive the
  // model; the file need not.
  static StatusOr<std::unique_ptr<Gemma3Model>> load(const GgufFile& file, MemoryContext& memory,
                                                     exec::CodeRegistry& registry,
                                                     const Gemma3Options& options = {},
                                                     const Progress& progress = {});

  // Runs `token` at position() and returns the argmax of its logits.
  StatusOr<int32_t> step(int32_t token) override;
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

 private:
  Gemma3Model() = default;

  MemoryContext* memory_ = nullptr;
  std::unique_ptr<graph::CompiledSequence> seq_;
  View next_, logits_;  // the sequence's "next" and "logits" buffers
  Gemma3Config config_;
  uint32_t max_context_ = 0;
  uint64_t weight_bytes_per_step_ = 0;
  int32_t position_ = 0;
};

// A Gemma3Model on a simulated NPU of its own, sized for the file and the context:
// what a program that only wants to decode needs. The device, its memory context and
// code registry live exactly as long as the model.
class SimGemma3 {
 public:
  static StatusOr<std::unique_ptr<SimGemma3>> load(const GgufFile& file, uint32_t cores = 8,
                                                   const Gemma3Options& options = {},
                                                   const Gemma3Model::Progress& progress = {});
  Gemma3Model& model() { return *model_; }

 private:
  SimGemma3() = default;
  // Destroyed bottom up: the model first, the device last.
  std::unique_ptr<hal::Device> device_;
  std::unique_ptr<MemoryContext> memory_;
  std::unique_ptr<exec::CodeRegistry> registry_;
  std::unique_ptr<Gemma3Model> model_;
};

}  // namespace npurt::models
