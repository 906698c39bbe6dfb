// The Gemma-3 steps as operator sequences, for one device's shard: the decode step,
// the prefill chunk, the verify step, and the batched decode step and paged prefill
// chunk over the paged KV pool. Every one is the same layer (a LayerPlan in
// gemma3_steps.cc) with its own kernels. Private to models/: Gemma3Model compiles them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "models/gemma3_shard.h"
#include "npurt/base/status.h"
#include "npurt/comm/communicator.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/gguf.h"

namespace npurt::models {

// Scalars the steps take: the RoPE bases; the rows of a call, their query and kv head
// rows, and the last row (whose logits the prefill chunks compute).
inline constexpr const char* kRopeLocal = "rope_local";
inline constexpr const char* kRopeGlobal = "rope_global";
inline constexpr const char* kPrefillRows = "rows";
inline constexpr const char* kPrefillQRows = "rows_q";
inline constexpr const char* kPrefillKvRows = "rows_kv";
inline constexpr const char* kPrefillLast = "last";

// A device's step and the part of each tensor it binds.
struct ShardedStep {
  graph::OperatorSequence sequence;
  std::map<std::string, TensorSlice> slices;
};

// Norm weights are bound as f32 whatever the file stores (they are converted on load).
bool is_norm(const std::string& name);

// The positions a model's caches hold: the options' max_context, at most the file's.
uint32_t context_of(const Gemma3Config& c, const Gemma3Options& o);

// One token at "pos" (the decode step); with a communicator, its shard's part, the
// partial sums added over the devices.
StatusOr<ShardedStep> decode_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                  const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm);

// The two steps that run several tokens at consecutive positions per call: the prefill
// chunk (matrix work, only the last token's logits) and the verify step (the decode
// step's batch-invariant kernels for T tokens, every token's logits and argmax).
enum class Batched : uint8_t { kPrefill, kVerify };
StatusOr<ShardedStep> batched_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                   const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm,
                                   Batched kind);
StatusOr<ShardedStep> prefill_chunk(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                    const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm);

// The paged KV pool's shape for `o`: positions per block, blocks, table entries per
// sequence.
struct PoolShape {
  uint32_t block_positions = 0, blocks = 0, max_blocks = 0;
};
StatusOr<PoolShape> pool_shape(const Gemma3Config& c, const Gemma3Options& o);
// Rows of the paged prefill chunk: prefill_chunk, at most the context and the pool.
uint32_t paged_prefill_rows(const Gemma3Config& c, const Gemma3Options& o, const PoolShape& pool);

// The two steps over the paged pool (one device), one token per row, each row at its
// own position: the batched decode step and the paged prefill chunk.
enum class Paged : uint8_t { kDecode, kPrefill };
StatusOr<ShardedStep> paged_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                 const Gemma3Shard& sh, Paged kind);

}  // namespace npurt::models
