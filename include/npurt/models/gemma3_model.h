// Gemma-3 on a device: the whole decode step as one operator sequence, with the
// weights and the KV cache resident in device memory and the position a runtime
// scalar, so one compiled sequence serves every token.
//
//   StatusOr<models::GgufFile> file = models::GgufFile::open(path);
//   auto runtime = Runtime::create("sim", *models::gemma3_device_spec(*file));
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
#include "npurt/comm/communicator.h"
#include "npurt/exec/code_registry.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/hal/driver.h"
#include "npurt/isa/isa.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"
#include "npurt/models/token_model.h"

namespace npurt::models {

struct Gemma3Options {
  // KV-cache capacity in positions (f32 keys and values: 36 KiB per position for
  // Gemma-3-270M, half that in f16); 0 takes the file's context length. Capped at the
  // context length.
  uint32_t max_context = 4096;
  graph::Dispatch dispatch = graph::Dispatch::kFused;
  // Batched prefill: the most prompt tokens one prefill call runs (the compiled chunk;
  // capped at the context); 0 compiles none, so prompts run token by token.
  uint32_t prefill_chunk = kDefaultPrefillChunk;
  static constexpr uint32_t kDefaultPrefillChunk = 512;
  // Speculative decoding: the most tokens one verify() call runs (the compiled verify
  // step, 1 .. 16; capped at the context); 0 compiles none. Drafts take one fewer.
  uint32_t verify_tokens = kDefaultVerifyTokens;
  static constexpr uint32_t kDefaultVerifyTokens = 16;
  // The KV cache's element type: f32 (exact against the f32 host oracle), or f16 /
  // bf16, half the bytes every decode step's attention reads (keys and values are
  // rounded once, when appended; docs/models.md says what that costs in logits).
  isa::DType kv_cache = isa::DType::kF32;
  // Batched decode over a paged KV cache (decode_batch()): the most sequences one call
  // runs (1 .. 16); 0 compiles none. Their keys and values live in a pool of kv_blocks
  // blocks of kv_block_positions positions per layer (0 blocks: enough for
  // batch_sequences sequences of max_context positions), apart from the one-sequence
  // cache; models/kv_blocks.h hands out the blocks.
  uint32_t batch_sequences = 0;
  uint32_t kv_blocks = 0;
  uint32_t kv_block_positions = 16;
};

// One sequence's token in a decode_batch() call.
struct BatchToken {
  int32_t token = 0;
  int32_t position = 0;               // its position in its sequence
  std::span<const uint32_t> table;    // its sequence's block table (KvBlocks::table)
  uint32_t row = 0;                   // the pool row its keys and values go to (AppendPlan::rows)
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

// The verify step of `config`: T tokens per call (T = the "rows" scalar, up to
// options.verify_tokens) at positions pos .. pos + T - 1 through the decode step's own
// kernels run batched (GEMV over T vectors, decode attention for T consecutive
// queries, row-wise norms, RoPE and KV append), then every token's logits and argmax
// ("next", T i32). Each token's logits are bitwise what a decode step at its position
// gives, so greedy decoding that verifies drafted tokens with it is exact. Binds the
// same tensor and cache names as gemma3_decode_step. One device only.
StatusOr<graph::OperatorSequence> gemma3_verify_step(const GgufFile& file, const Gemma3Config& config,
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
  // The same on a device of its own, made by the driver named `driver` with `cores`
  // cores (gemma3_device_spec): what a program that only wants to decode needs.
  static StatusOr<std::unique_ptr<Gemma3Model>> load_on(const GgufFile& file, std::string_view driver,
                                                        uint32_t cores = 8, const Gemma3Options& options = {},
                                                        const Progress& progress = {});
  // Tensor parallel: the model cut over the devices of a group (models/gemma3_shard.h
  // says who holds what), each device holding only its shards. `ranks` are the ranks
  // this process drives: every rank of an in-process comm::DeviceGroup, or its one
  // rank of an MPI communicator (then every rank of the job loads and steps alike, and
  // a rank that fails to load makes every rank fail, naming it). Greedy tokens equal
  // one device's except where float rounding of the partial sums decides a near-tie.
  static StatusOr<std::unique_ptr<Gemma3Model>> load_parallel(const GgufFile& file,
                                                              std::vector<std::shared_ptr<comm::Communicator>> ranks,
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
  // Runs `tokens` (1 .. max_verify_tokens()) at positions position() .. + n - 1 in one
  // call of the verify step and returns each one's greedy successor, bitwise what n
  // step() calls would give; the position advances by n (rewind() drops the tail).
  StatusOr<std::vector<int32_t>> verify(std::span<const int32_t> tokens) override;
  uint32_t max_verify_tokens() const override { return max_verify_; }
  // The next step is at `position` (0 .. position()): the cached positions from there
  // on are overwritten before use.
  Status rewind(int32_t position) override;
  // The logits of every token of the last verify() call (n x vocab floats).
  StatusOr<std::vector<float>> verify_logits() const override;
  // The next step is at position 0 (cached positions are overwritten before use).
  Status reset() override;
  int32_t position() const override { return position_; }
  int32_t context_capacity() const override { return static_cast<int32_t>(max_context_); }

  // Batched decode (Gemma3Options::batch_sequences > 0): one pass over the weights
  // for 1 .. max_batch() sequences, each token at its own position, its keys and
  // values appended at its row of the paged pool and attended through its block
  // table. Returns each one's greedy successor. A sequence's logits are bitwise the
  // same whatever else the batch holds, its slot and the batch's size. Independent of
  // step() and position(): the pool is not the one-sequence cache.
  StatusOr<std::vector<int32_t>> decode_batch(std::span<const BatchToken> batch);
  // The paged prefill chunk (batch_sequences and prefill_chunk > 0): 1 ..
  // max_paged_prefill() rows, each a token at its position with its row and table as in
  // decode_batch() (a row attends the rows before it in the same call), as matrix work;
  // returns the greedy successor of the last row. Each row's keys and values are bitwise
  // the same however a prompt is cut into calls (not the same as decode_batch() gives:
  // matrix work sums in another order).
  StatusOr<int32_t> prefill_paged(std::span<const BatchToken> rows);
  // The logits of the last decode_batch() call (n x vocab floats) or of the last row
  // of the last prefill_paged() call (vocab floats).
  StatusOr<std::vector<float>> batch_logits() const;
  uint32_t max_batch() const { return max_batch_; }
  uint32_t max_paged_prefill() const { return max_paged_prefill_; }
  // The paged pool's blocks and positions per block (KvBlocksOptions for it).
  uint32_t kv_blocks() const { return pool_blocks_; }
  uint32_t kv_block_positions() const { return pool_block_positions_; }
  // The batched decode step's sequence; nullptr when compiled without one.
  const graph::CompiledSequence* batch_sequence() const { return parts_[0].batch.get(); }

  // The logits of the last step (vocab floats), read back from the device (gathered
  // from every device's vocabulary rows: over MPI every rank must call it).
  StatusOr<std::vector<float>> logits() const override;
  // Devices the model is cut over (1 unless load_parallel).
  int devices() const { return devices_; }

  const Gemma3Config& config() const { return config_; }
  uint32_t max_context() const { return max_context_; }
  // Bytes of weights a step reads on one device (every tensor of its shard once; the
  // tied LM head once more); with several devices in this process, the largest.
  uint64_t weight_bytes_per_step() const;
  size_t launches_per_step() const { return parts_[0].seq->launches_per_call(); }
  // Barrier phases its blocks wait between, over all of a decode step's launches.
  size_t barriers_per_step() const { return parts_[0].seq->barriers_per_call(); }
  // This process's first device's sequences.
  const graph::CompiledSequence& sequence() const { return *parts_[0].seq; }
  // The prefill chunk's sequence; nullptr when compiled without one.
  const graph::CompiledSequence* prefill_sequence() const { return parts_[0].prefill.get(); }
  // The verify step's sequence; nullptr when compiled without one.
  const graph::CompiledSequence* verify_sequence() const { return parts_[0].verify.get(); }

 private:
  // The inputs and outputs of a step over the paged pool.
  struct PagedInputs {
    View tokens, positions, lens, tables, rows, next, logits;
  };
  // What one device holds and runs.
  struct Part {
    std::shared_ptr<Runtime> runtime;
    std::shared_ptr<comm::Communicator> comm;  // null on one device
    std::unique_ptr<graph::CompiledSequence> seq, prefill;
    View next, logits;  // the decode step's "next" and "logits" buffers
    View prefill_tokens, prefill_next, prefill_logits;
    std::unique_ptr<graph::CompiledSequence> verify;
    View verify_tokens, verify_next, verify_logits;
    // The steps over the paged pool: the batched decode step and the paged prefill chunk.
    std::unique_ptr<graph::CompiledSequence> batch, paged_prefill;
    PagedInputs batch_in, paged_prefill_in;
    uint64_t weight_bytes = 0;
    int32_t q_heads = 0, kv_heads = 0;  // of its shard
    // Tensor parallel: where logits() gathers every device's vocabulary rows, and the
    // stream it does that on (from the runtime's pools, like every stream).
    Buffer gathered;
    std::shared_ptr<exec::StreamPool> gather_streams;
  };
  using Which = std::unique_ptr<graph::CompiledSequence> Part::*;

  Gemma3Model() = default;
  static Status load_part(const GgufFile& file, const Gemma3Config& config, const Gemma3Options& options,
                          Part& part, int rank, int size, const Progress& progress);
  // Runs sequence `which` of every part with `scalars`, all started before any is waited for.
  Status run_parts(Which which, const graph::Scalars& scalars);
  // The greedy token from part 0's `next` view (a gathered pair per device when parallel).
  StatusOr<int32_t> read_next(const View Part::*next) const;
  StatusOr<int32_t> prefill_chunk_call(std::span<const int32_t> tokens);
  // Whether `tokens` fit the context from position() and the vocabulary; `what` names
  // them in the error ("prompt", "verify").
  Status check_tokens(std::span<const int32_t> tokens, const char* what) const;
  // Checks `batch` against the pool and writes it to part 0's inputs `in`; `what`
  // names the call in errors.
  Status write_paged(const PagedInputs& in, std::span<const BatchToken> batch, const char* what);
  // The scalars of a paged step of `rows` rows.
  graph::Scalars paged_scalars(size_t rows, bool prefill) const;
  // The batched decode step, or the paged prefill chunk when `prefill`, over `rows`
  // (already counted against the step): writes them, runs the step on every part and
  // returns the greedy tokens of the rows whose logits it keeps for batch_logits()
  // (every row; a prefill chunk's last only).
  StatusOr<std::vector<int32_t>> run_paged(std::span<const BatchToken> rows, bool prefill);
  // The token ids into the first tokens.size() entries of `ids`, a buffer of part `p`.
  static Status write_tokens(Part& p, const View& ids, std::span<const int32_t> tokens);

  std::vector<Part> parts_;
  int devices_ = 1;
  bool last_prefill_ = false;  // which sequence's logits are the last
  uint32_t chunk_ = 0, max_chunk_ = 0;
  uint32_t max_verify_ = 0, last_verify_ = 0;  // compiled tokens; tokens of the last verify()
  uint32_t max_batch_ = 0, max_paged_prefill_ = 0;  // compiled rows of the paged steps
  // Which paged step ran last (its inputs hold its logits), and how many rows of them.
  struct LastPaged {
    PagedInputs Part::*step = nullptr;
    uint32_t rows = 0;
  } last_paged_;
  uint32_t pool_blocks_ = 0, pool_block_positions_ = 0, pool_max_blocks_ = 0;
  Gemma3Config config_;
  uint32_t max_context_ = 0;
  int32_t position_ = 0;
};

// What a device needs to hold `file`'s model: `cores` cores and global memory for the
// weights, the KV cache of the options' context and room for activations and code
// (Runtime::create's spec for a program that only wants to decode). With `devices`,
// what each of that many devices holding a shard needs.
StatusOr<hal::DeviceSpec> gemma3_device_spec(const GgufFile& file, uint32_t cores = 8,
                                             const Gemma3Options& options = {}, int devices = 1);

}  // namespace npurt::models
