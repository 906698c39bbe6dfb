// What `npurt soak` runs: operator sequences over shared weights, and Worker runs
// that launch compiled kernels on shared weights and per-run buffers, each with its
// host reference.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/worker.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/gemv.h"
#include "npurt/runtime/runtime.h"

namespace npurt::cli::soak {

using Bytes = std::vector<uint8_t>;
using HostBuffers = std::map<std::string, Bytes>;

// `n` values uniform in [-1, 1), encoded in `dtype`.
Bytes random_values(std::mt19937_64& rng, isa::DType dtype, uint64_t n);

// A device buffer written once at setup and only read afterwards, with the bytes it
// must hold: every sequence and run that uses it is checked against them.
struct SharedWeight {
  std::string name;
  isa::DType dtype = isa::DType::kF32;
  uint64_t elements = 0;
  Bytes host;
  Buffer buffer;
};

class SharedWeights {
 public:
  static StatusOr<SharedWeights> make(MemoryContext& memory, std::mt19937_64& rng);
  const SharedWeight& get(const std::string& name) const;
  std::vector<SharedWeight>& all() { return weights_; }
  void release() { weights_.clear(); }

 private:
  std::vector<SharedWeight> weights_;
};

// One compiled sequence; its inputs and its one output are private f32 buffers.
struct SequenceWorkload {
  std::string name;
  std::unique_ptr<graph::OperatorSequence> spec;  // for run_reference
  std::unique_ptr<graph::CompiledSequence> compiled;
  std::map<std::string, uint64_t> inputs;  // name -> f32 elements
  std::string output;
  uint64_t output_elements = 0;
  std::vector<std::string> weights;  // shared buffers it binds
  bool awaiting_recovery = false;     // its last call failed; a later one must succeed
};

// The soak's sequences (fused and separate dispatch), compiled on `runtime`.
StatusOr<std::vector<SequenceWorkload>> make_sequences(Runtime& runtime, const SharedWeights& weights);

// The reference output of one call of `w` on `inputs` (name -> f32 bytes).
StatusOr<Bytes> sequence_reference(const SequenceWorkload& w, const SharedWeights& weights,
                                   const HostBuffers& inputs);

// A Worker run: y = gemv(w_f32, x) + bias, two kernels on the run's stream, x, the
// intermediate h and y private to the run.
class RunKernels {
 public:
  static StatusOr<RunKernels> make(Runtime& runtime);
  uint64_t input_elements() const { return gemv_.params().k; }
  uint64_t output_elements() const { return gemv_.params().m; }
  const std::vector<exec::CodeHandle>& code() const { return code_; }
  // Enqueues the run's launches on ctx's stream.
  Status launch(MemoryContext& memory, exec::RunContext& ctx, const SharedWeights& weights, const View& x,
                const View& h, const View& y) const;
  StatusOr<Bytes> reference(const SharedWeights& weights, const Bytes& x) const;
  void release() { code_.clear(); }

 private:
  RunKernels(ops::Gemv gemv, ops::Elementwise add, ops::Kernel gemv_kernel, ops::Kernel add_kernel)
      : gemv_(std::move(gemv)),
        add_(std::move(add)),
        gemv_kernel_(std::move(gemv_kernel)),
        add_kernel_(std::move(add_kernel)) {}
  ops::Gemv gemv_;
  ops::Elementwise add_;
  ops::Kernel gemv_kernel_, add_kernel_;
  std::vector<exec::CodeHandle> code_;  // gemv, add
};

}  // namespace npurt::cli::soak
