#include "npurt/models/gemma3_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "models/gemma3_shard.h"
#include "models/gemma3_steps.h"
#include "npurt/base/math.h"
#include "npurt/hal/handles.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/argmax.h"

namespace npurt::models {
namespace {

// Bytes a device needs for its shard's weights (norms as f32) and KV cache.
uint64_t resident_bytes(const GgufFile& file, const ShardedStep& step, const Gemma3Config& c, const Gemma3Shard& sh,
                        uint32_t ctx) {
  uint64_t bytes = uint64_t{ctx} * c.n_layers * 2 * sh.kv_heads * c.head_dim * 4;
  for (const auto& [name, slice] : step.slices) {
    const GgufTensor* t = file.tensor(name);
    bytes += is_norm(name) ? t->elements() * 4 : slice_bytes(*t, slice);
  }
  return bytes;
}

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

// Bytes of a tensor copied to the device at a time: loading holds about this much
// of it on the host (mirror and file pages), not the whole model.
constexpr uint64_t kUploadPiece = 8ull << 20;

// Copies `t`'s slice to `v` a few rows at a time; each piece's host pages, the
// buffer's mirror and the file's, are given back once the device holds it (the device
// keeps the only copy of a weight).
Status upload_tensor(const GgufFile& file, const GgufTensor& t, const TensorSlice& slice, const View& v,
                     MemoryContext& memory) {
  if (is_norm(std::string(t.name)) && t.dtype != isa::DType::kF32) {
    const std::vector<float> f = isa::to_f32(t.data, t.dtype);
    if (f.size() * sizeof(float) != v.size()) return internal_error("gemma3: norm size mismatch");
    NPURT_ASSIGN_OR_RETURN(WriteGuard g, memory.overwrite(v));
    std::memcpy(g.bytes().data(), f.data(), v.size());
  } else {
    NPURT_ASSIGN_OR_RETURN(const SliceRows rows, slice_rows(t, slice));
    if (rows.rows * rows.row_bytes != v.size()) {
      return invalid_argument("gemma3: tensor '" + std::string(t.name) + "': its slice holds " +
                              std::to_string(rows.rows * rows.row_bytes) + " bytes, the step binds " +
                              std::to_string(v.size()));
    }
    const uint64_t step = std::max<uint64_t>(1, kUploadPiece / std::max<uint64_t>(rows.row_bytes, 1));
    for (uint64_t r = 0; r < rows.rows; r += step) {
      const uint64_t end = std::min(rows.rows, r + step);
      NPURT_ASSIGN_OR_RETURN(View piece, v.subview(r * rows.row_bytes, (end - r) * rows.row_bytes));
      {
        NPURT_ASSIGN_OR_RETURN(WriteGuard g, memory.overwrite(piece));
        rows.copy(t, r, end, g.bytes().data());
      }
      NPURT_RETURN_IF_ERROR(memory.drop_host_copy(piece));
      file.release_pages(rows.source(t, r, end));
    }
  }
  // The pages that straddle two pieces (and a norm's) were kept by the per-piece
  // drops, which give back only pages wholly inside their piece.
  return memory.drop_host_copy(v);
}

// Copies every bound tensor's slice (norms converted to f32) to the device, so the
// first step moves no weight. Returns the bytes a step reads.
StatusOr<uint64_t> upload_weights(const GgufFile& file, const ShardedStep& step, graph::CompiledSequence& seq,
                                  MemoryContext& memory, const Gemma3Model::Progress& progress) {
  std::vector<std::pair<const GgufTensor*, View>> tensors;
  uint64_t total = 0;
  for (const graph::BufferPlacement& p : seq.placements()) {
    const GgufTensor* t = file.tensor(p.name);
    if (t == nullptr) continue;
    NPURT_ASSIGN_OR_RETURN(View v, seq.get_buffer(t->name));
    tensors.push_back({t, v});
    total += p.bytes;
  }
  uint64_t done = 0;
  for (const auto& [t, v] : tensors) {
    NPURT_RETURN_IF_ERROR(upload_tensor(file, *t, step.slices.at(std::string(t->name)), v, memory));
    done += v.size();
    if (progress) progress(done, total);
  }
  uint64_t read = done;
  // The embedding reads one row of its table: with a separate LM head the table's
  // other rows are not read by a step (a tied table is, by the LM head).
  if (const GgufTensor* e = file.tensor("token_embd.weight"); e != gemma3_output_weight(file)) {
    NPURT_ASSIGN_OR_RETURN(View v, seq.get_buffer(e->name));
    read -= v.size() - v.size() / (e->elements() / e->dims[0]);
  }
  return read;
}

// The first n elements of `v`, read back from the device.
template <typename T>
StatusOr<std::vector<T>> read_leading(MemoryContext& memory, const View& v, size_t n) {
  NPURT_ASSIGN_OR_RETURN(View head, v.subview(0, n * sizeof(T)));
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, memory.read(head));
  std::vector<T> out(n);
  std::memcpy(out.data(), g.bytes().data(), n * sizeof(T));
  return out;
}

// A step over the paged pool, compiled.
StatusOr<std::unique_ptr<graph::CompiledSequence>> compile_paged(const GgufFile& file, const Gemma3Config& c,
                                                                 const Gemma3Options& o, const Gemma3Shard& sh,
                                                                 Paged kind, Runtime& runtime,
                                                                 const graph::CompileOptions& co) {
  NPURT_ASSIGN_OR_RETURN(ShardedStep step, paged_step(file, c, o, sh, kind));
  return step.sequence.compile(runtime, co);
}

}  // namespace

Status Gemma3Model::load_part(const GgufFile& file, const Gemma3Config& config, const Gemma3Options& options,
                              Part& part, int rank, int size, const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(const Gemma3Shard shard, Gemma3Shard::plan(file, config, rank, size));
  Runtime& runtime = *part.runtime;
  part.q_heads = shard.q_heads;
  part.kv_heads = shard.kv_heads;
  const std::string who = size > 1 ? "gemma3: rank " + std::to_string(rank) + " of " + std::to_string(size) : "gemma3";
  NPURT_ASSIGN_OR_RETURN(ShardedStep step, decode_step(file, config, options, shard, part.comm));
  const uint32_t ctx = context_of(config, options);
  const uint64_t need = resident_bytes(file, step, config, shard, ctx), have = runtime.device().info().global_memory_bytes;
  if (need > have) {
    return resource_exhausted(who + ": the model needs " + mib(need) + " of device memory (weights and a " +
                              std::to_string(ctx) + "-position KV cache), the device has " + mib(have) +
                              (size > 1 ? "" : "; split it over more devices"));
  }
  const std::string sizes = who + " (" + mib(need) + " of weights and KV cache on a device of " + mib(have) + ")";
  NPURT_ASSIGN_OR_RETURN_CTX(part.seq, step.sequence.compile(runtime), sizes);
  NPURT_ASSIGN_OR_RETURN(part.next, part.seq->get_buffer("next"));
  NPURT_ASSIGN_OR_RETURN(part.logits, part.seq->get_buffer("logits"));
  // The batched sequences bind the decode step's weights and caches, not copies.
  graph::CompileOptions co;
  for (const graph::BufferPlacement& p : part.seq->placements()) {
    if (p.intermediate) continue;
    if (file.tensor(p.name) != nullptr || p.name.starts_with("k_cache.") || p.name.starts_with("v_cache.")) {
      NPURT_ASSIGN_OR_RETURN(co.shared[p.name], part.seq->get_buffer(p.name));
    }
  }
  if (options.prefill_chunk > 0) {
    NPURT_ASSIGN_OR_RETURN(ShardedStep chunk, models::prefill_chunk(file, config, options, shard, part.comm));
    NPURT_ASSIGN_OR_RETURN_CTX(part.prefill, chunk.sequence.compile(runtime, co), sizes + ", compiling the prefill chunk");
    NPURT_ASSIGN_OR_RETURN(part.prefill_tokens, part.prefill->get_buffer("tokens"));
    NPURT_ASSIGN_OR_RETURN(part.prefill_next, part.prefill->get_buffer("next"));
    NPURT_ASSIGN_OR_RETURN(part.prefill_logits, part.prefill->get_buffer("logits"));
  }
  if (size > 1) {
    NPURT_ASSIGN_OR_RETURN(part.gathered, runtime.memory().create_buffer(uint64_t(config.vocab) * sizeof(float),
                                                                         {.name = "gemma3.gathered_logits"}));
    NPURT_ASSIGN_OR_RETURN(part.gather_streams, runtime.make_stream_pool("gemma3 logits gather"));
  }
  if (options.verify_tokens > 0 && size == 1) {
    NPURT_ASSIGN_OR_RETURN(ShardedStep v, batched_step(file, config, options, shard, part.comm, Batched::kVerify));
    NPURT_ASSIGN_OR_RETURN_CTX(part.verify, v.sequence.compile(runtime, co), sizes + ", compiling the verify step");
    NPURT_ASSIGN_OR_RETURN(part.verify_tokens, part.verify->get_buffer("tokens"));
    NPURT_ASSIGN_OR_RETURN(part.verify_next, part.verify->get_buffer("next"));
    NPURT_ASSIGN_OR_RETURN(part.verify_logits, part.verify->get_buffer("logits"));
  }
  if (options.batch_sequences > 0) {
    if (size > 1) return invalid_argument(who + ": the batched decode step runs on one device");
    auto views = [](const graph::CompiledSequence& seq, PagedInputs& in) -> Status {
      const std::pair<View PagedInputs::*, const char*> names[] = {
          {&PagedInputs::tokens, "tokens"}, {&PagedInputs::positions, "positions"}, {&PagedInputs::lens, "lens"},
          {&PagedInputs::tables, "tables"}, {&PagedInputs::rows, "kv_rows"},        {&PagedInputs::next, "next"},
          {&PagedInputs::logits, "logits"}};
      for (const auto& [view, name] : names) {
        NPURT_ASSIGN_OR_RETURN(in.*view, seq.get_buffer(name));
      }
      return ok_status();
    };
    graph::CompileOptions weights_only = co;  // its caches are the pool's, not these
    std::erase_if(weights_only.shared, [&](const auto& kv) { return file.tensor(kv.first) == nullptr; });
    NPURT_ASSIGN_OR_RETURN_CTX(part.batch, compile_paged(file, config, options, shard, Paged::kDecode, runtime, weights_only),
                               sizes + ", compiling the batched decode step");
    NPURT_RETURN_IF_ERROR(views(*part.batch, part.batch_in));
    if (options.prefill_chunk > 0) {
      // The prefill chunk writes the pool the decode step reads: the same buffers.
      graph::CompileOptions with_pool = weights_only;
      for (const graph::BufferPlacement& p : part.batch->placements()) {
        if (p.name.starts_with("k_pool.") || p.name.starts_with("v_pool.")) {
          NPURT_ASSIGN_OR_RETURN(with_pool.shared[p.name], part.batch->get_buffer(p.name));
        }
      }
      NPURT_ASSIGN_OR_RETURN_CTX(part.paged_prefill,
                                 compile_paged(file, config, options, shard, Paged::kPrefill, runtime, with_pool),
                                 sizes + ", compiling the paged prefill chunk");
      NPURT_RETURN_IF_ERROR(views(*part.paged_prefill, part.paged_prefill_in));
    }
  }
  NPURT_ASSIGN_OR_RETURN(part.weight_bytes, upload_weights(file, step, *part.seq, runtime.memory(), progress));
  return ok_status();
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load(const GgufFile& file, Runtime& runtime,
                                                          const Gemma3Options& options, const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config config, Gemma3Config::from_gguf(file));
  NPURT_RETURN_IF_ERROR(validate_gemma3_tensors(file, config));
  auto model = std::unique_ptr<Gemma3Model>(new Gemma3Model());
  model->config_ = config;
  model->max_context_ = context_of(config, options);
  model->parts_.resize(1);
  model->parts_[0].runtime = runtime.shared_from_this();
  NPURT_RETURN_IF_ERROR(load_part(file, config, options, model->parts_[0], 0, 1, progress));
  if (options.prefill_chunk > 0) model->chunk_ = model->max_chunk_ = std::min(options.prefill_chunk, model->max_context_);
  model->max_verify_ = std::min(options.verify_tokens, model->max_context_);
  if (options.batch_sequences > 0) {
    NPURT_ASSIGN_OR_RETURN(const PoolShape pool, pool_shape(config, options));
    model->max_batch_ = options.batch_sequences;
    model->max_paged_prefill_ = paged_prefill_rows(config, options, pool);
    model->pool_blocks_ = pool.blocks;
    model->pool_block_positions_ = pool.block_positions;
    model->pool_max_blocks_ = pool.max_blocks;
  }
  return model;
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load_parallel(
    const GgufFile& file, std::vector<std::shared_ptr<comm::Communicator>> ranks, const Gemma3Options& options,
    const Progress& progress) {
  if (ranks.empty()) return invalid_argument("gemma3: load_parallel with no ranks");
  const int size = ranks[0]->size();
  // Every rank reports whether it loaded, so none waits for a peer that gave up.
  Status loaded = [&]() -> Status {
    NPURT_ASSIGN_OR_RETURN(Gemma3Config config, Gemma3Config::from_gguf(file));
    NPURT_RETURN_IF_ERROR(validate_gemma3_tensors(file, config));
    return ok_status();
  }();
  auto model = std::unique_ptr<Gemma3Model>(new Gemma3Model());
  model->devices_ = size;
  if (loaded.ok()) {
    model->config_ = *Gemma3Config::from_gguf(file);
    model->max_context_ = context_of(model->config_, options);
    // One bar over every device this process loads (shards are about equal).
    const uint64_t parts = ranks.size();
    for (const auto& c : ranks) {
      Part part;
      part.comm = c;
      part.runtime = c->runtime().shared_from_this();
      const uint64_t index = model->parts_.size();
      const Progress each = !progress ? Progress() : [&](uint64_t done, uint64_t total) {
        progress(index * total + done, parts * total);
      };
      if (c->size() != size) loaded = invalid_argument("gemma3: ranks of groups of different sizes");
      if (loaded.ok()) loaded = load_part(file, model->config_, options, part, c->rank(), size, each);
      if (!loaded.ok()) break;
      model->parts_.push_back(std::move(part));
    }
  }
  NPURT_RETURN_IF_ERROR(ranks[0]->agree(loaded));
  if (options.prefill_chunk > 0) model->chunk_ = model->max_chunk_ = std::min(options.prefill_chunk, model->max_context_);
  return model;
}

uint64_t Gemma3Model::weight_bytes_per_step() const {
  uint64_t most = 0;
  for (const Part& p : parts_) most = std::max(most, p.weight_bytes);
  return most;
}

Status Gemma3Model::reset() {
  position_ = 0;
  return ok_status();
}

Status Gemma3Model::rewind(int32_t position) {
  if (position < 0 || position > position_) {
    return invalid_argument("gemma3: cannot rewind to position " + std::to_string(position) + " (the context holds " +
                            std::to_string(position_) + ")");
  }
  position_ = position;
  return ok_status();
}

StatusOr<std::vector<int32_t>> Gemma3Model::verify(std::span<const int32_t> tokens) {
  if (max_verify_ == 0) return failed_precondition("gemma3: loaded without a verify step (verify_tokens 0, or several devices)");
  if (tokens.empty() || tokens.size() > max_verify_) {
    return invalid_argument("gemma3: verify of " + std::to_string(tokens.size()) + " tokens; the compiled verify step takes 1 .. " +
                            std::to_string(max_verify_));
  }
  NPURT_RETURN_IF_ERROR(check_tokens(tokens, "verify"));
  Part& p = parts_[0];
  NPURT_RETURN_IF_ERROR(write_tokens(p, p.verify_tokens, tokens));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const graph::Scalars scalars{{kPrefillRows, n},
                               {kPrefillQRows, n * p.q_heads},
                               {kPrefillKvRows, n * p.kv_heads},
                               {"pos", int64_t{position_}},
                               {"len", int64_t{position_} + 1},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(run_parts(&Part::verify, scalars));
  position_ += static_cast<int32_t>(n);
  last_verify_ = static_cast<uint32_t>(n);
  return read_leading<int32_t>(p.runtime->memory(), p.verify_next, tokens.size());
}

Status Gemma3Model::write_paged(const PagedInputs& in, std::span<const BatchToken> batch, const char* what) {
  const uint32_t bp = pool_block_positions_, mb = pool_max_blocks_;
  const size_t n = batch.size();
  std::vector<int32_t> tokens(n), positions(n), lens(n), rows(n), tables(n * mb, -1);
  for (size_t i = 0; i < n; ++i) {
    const BatchToken& b = batch[i];
    const std::string who = std::string("gemma3: ") + what + " row " + std::to_string(i);
    if (b.token < 0 || b.token >= config_.vocab) {
      return invalid_argument(who + ": token " + std::to_string(b.token) + " is outside the vocabulary of " +
                              std::to_string(config_.vocab));
    }
    if (b.position < 0 || static_cast<uint64_t>(b.position) >= uint64_t{mb} * bp) {
      return out_of_range(who + ": position " + std::to_string(b.position) + " is outside 0 .. " +
                          std::to_string(uint64_t{mb} * bp - 1));
    }
    const size_t need = static_cast<size_t>(b.position) / bp + 1;
    if (b.table.size() < need || b.table.size() > mb) {
      return invalid_argument(who + ": a table of " + std::to_string(b.table.size()) + " blocks; position " +
                              std::to_string(b.position) + " needs " + std::to_string(need) + " (at most " +
                              std::to_string(mb) + ")");
    }
    if (b.row >= uint64_t{pool_blocks_} * bp || b.row / bp != b.table[need - 1] || b.row % bp != b.position % bp) {
      return invalid_argument(who + ": row " + std::to_string(b.row) + " is not position " +
                              std::to_string(b.position) + "'s row of its table");
    }
    for (size_t j = 0; j < b.table.size(); ++j) {
      // Blocks the window released (KvBlocks::kNoBlock) read as -1; the kernel reads
      // only the attended ones, and faults on one outside the pool.
      tables[i * mb + j] = b.table[j] < pool_blocks_ ? static_cast<int32_t>(b.table[j]) : -1;
    }
    tokens[i] = b.token;
    positions[i] = b.position;
    lens[i] = b.position + 1;
    rows[i] = static_cast<int32_t>(b.row);
  }
  Part& p = parts_[0];
  NPURT_RETURN_IF_ERROR(write_tokens(p, in.tokens, tokens));
  NPURT_RETURN_IF_ERROR(write_tokens(p, in.positions, positions));
  NPURT_RETURN_IF_ERROR(write_tokens(p, in.lens, lens));
  NPURT_RETURN_IF_ERROR(write_tokens(p, in.tables, tables));
  return write_tokens(p, in.rows, rows);
}

graph::Scalars Gemma3Model::paged_scalars(size_t rows, bool prefill) const {
  const auto n = static_cast<int64_t>(rows);
  graph::Scalars s{{kPrefillRows, n},
                   {kPrefillQRows, n * parts_[0].q_heads},
                   {kPrefillKvRows, n * parts_[0].kv_heads},
                   {"pos", 0},  // RoPE reads "positions" instead
                   {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                   {kRopeGlobal, config_.rope_base_global}};
  if (prefill) s[kPrefillLast] = n - 1;
  return s;
}

StatusOr<std::vector<int32_t>> Gemma3Model::run_paged(std::span<const BatchToken> rows, bool prefill) {
  const Which step = prefill ? &Part::paged_prefill : &Part::batch;
  PagedInputs Part::*const in = prefill ? &Part::paged_prefill_in : &Part::batch_in;
  const auto kept = static_cast<uint32_t>(prefill ? 1 : rows.size());
  Part& p = parts_[0];
  NPURT_RETURN_IF_ERROR(write_paged(p.*in, rows, prefill ? "prefill_paged" : "decode_batch"));
  last_paged_ = {};
  NPURT_RETURN_IF_ERROR(run_parts(step, paged_scalars(rows.size(), prefill)));
  last_paged_ = {in, kept};
  return read_leading<int32_t>(p.runtime->memory(), (p.*in).next, kept);
}

StatusOr<std::vector<int32_t>> Gemma3Model::decode_batch(std::span<const BatchToken> batch) {
  if (max_batch_ == 0) return failed_precondition("gemma3: loaded without a batched decode step (batch_sequences 0)");
  if (batch.empty() || batch.size() > max_batch_) {
    return invalid_argument("gemma3: decode_batch of " + std::to_string(batch.size()) +
                            " sequences; the compiled step takes 1 .. " + std::to_string(max_batch_));
  }
  return run_paged(batch, /*prefill=*/false);
}

StatusOr<int32_t> Gemma3Model::prefill_paged(std::span<const BatchToken> rows) {
  if (max_paged_prefill_ == 0) {
    return failed_precondition("gemma3: loaded without a paged prefill chunk (batch_sequences or prefill_chunk 0)");
  }
  if (rows.empty() || rows.size() > max_paged_prefill_) {
    return invalid_argument("gemma3: prefill_paged of " + std::to_string(rows.size()) +
                            " rows; the compiled chunk takes 1 .. " + std::to_string(max_paged_prefill_));
  }
  NPURT_ASSIGN_OR_RETURN(const std::vector<int32_t> next, run_paged(rows, /*prefill=*/true));
  return next[0];
}

StatusOr<std::vector<float>> Gemma3Model::batch_logits() const {
  if (last_paged_.rows == 0) return failed_precondition("gemma3: no decode_batch() or prefill_paged() call yet");
  const Part& p = parts_[0];
  return read_leading<float>(p.runtime->memory(), (p.*last_paged_.step).logits,
                             size_t{last_paged_.rows} * config_.vocab);
}

StatusOr<std::vector<float>> Gemma3Model::verify_logits() const {
  if (last_verify_ == 0) return failed_precondition("gemma3: no verify() call yet");
  const Part& p = parts_[0];
  return read_leading<float>(p.runtime->memory(), p.verify_logits, size_t{last_verify_} * config_.vocab);
}

Status Gemma3Model::run_parts(Which which, const graph::Scalars& scalars) {
  size_t started = 0;
  Status s;
  for (; started < parts_.size(); ++started) {
    s = ((parts_[started]).*which)->start(scalars);
    if (!s.ok()) break;
  }
  if (!s.ok() && parts_.size() > 1) parts_[0].comm->abort(s);  // the started ones wait for the one that failed
  for (size_t i = 0; i < started; ++i) {
    Status f = ((parts_[i]).*which)->finish();
    if (s.ok()) s = f;
  }
  return s;
}

StatusOr<int32_t> Gemma3Model::read_next(const View Part::*next) const {
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, parts_[0].runtime->memory().read(parts_[0].*next));
  std::vector<int32_t> words(g.bytes().size() / sizeof(int32_t));
  std::memcpy(words.data(), g.bytes().data(), words.size() * sizeof(int32_t));
  return devices_ > 1 ? ops::argmax_pick(words) : words[0];
}

StatusOr<int32_t> Gemma3Model::step(int32_t token) {
  if (token < 0 || token >= config_.vocab) {
    return invalid_argument("gemma3: token " + std::to_string(token) + " is outside [0, " +
                            std::to_string(config_.vocab) + ")");
  }
  if (position_ >= static_cast<int32_t>(max_context_)) {
    return out_of_range("gemma3: the context is full (" + std::to_string(max_context_) + " positions); reset() first");
  }
  const graph::Scalars scalars{{"token", int64_t{token}},
                               {"pos", int64_t{position_}},
                               {"len", int64_t{position_} + 1},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(run_parts(&Part::seq, scalars));
  ++position_;
  last_prefill_ = false;
  return read_next(&Part::next);
}

Status Gemma3Model::set_prefill_chunk(uint32_t chunk) {
  if (chunk > max_chunk_) {
    return invalid_argument("gemma3: prefill chunk " + std::to_string(chunk) + " is above the compiled maximum " +
                            std::to_string(max_chunk_) + " (0: token by token)");
  }
  chunk_ = chunk;
  return ok_status();
}

StatusOr<int32_t> Gemma3Model::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("gemma3: prefill of an empty prompt");
  NPURT_RETURN_IF_ERROR(check_tokens(tokens, "prompt"));
  if (chunk_ == 0) return TokenModel::prefill(tokens);
  int32_t next = 0;
  for (size_t i = 0; i < tokens.size(); i += chunk_) {
    NPURT_ASSIGN_OR_RETURN(next, prefill_chunk_call(tokens.subspan(i, std::min<size_t>(chunk_, tokens.size() - i))));
  }
  return next;
}

Status Gemma3Model::check_tokens(std::span<const int32_t> tokens, const char* what) const {
  if (position_ + tokens.size() > max_context_) {
    return out_of_range("gemma3: " + std::to_string(tokens.size()) + " " + what + " tokens at position " +
                        std::to_string(position_) + " do not fit the context of " + std::to_string(max_context_) +
                        " positions");
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= config_.vocab) {
      return invalid_argument("gemma3: " + std::string(what) + " token " + std::to_string(token) + " is outside [0, " +
                              std::to_string(config_.vocab) + ")");
    }
  }
  return ok_status();
}

Status Gemma3Model::write_tokens(Part& p, const View& ids, std::span<const int32_t> tokens) {
  NPURT_ASSIGN_OR_RETURN(View head, ids.subview(0, tokens.size() * sizeof(int32_t)));
  NPURT_ASSIGN_OR_RETURN(WriteGuard g, p.runtime->memory().overwrite(head));
  std::memcpy(g.bytes().data(), tokens.data(), tokens.size_bytes());
  return ok_status();
}

StatusOr<int32_t> Gemma3Model::prefill_chunk_call(std::span<const int32_t> tokens) {
  for (Part& p : parts_) NPURT_RETURN_IF_ERROR(write_tokens(p, p.prefill_tokens, tokens));
  const int64_t n = static_cast<int64_t>(tokens.size());
  const graph::Scalars scalars{{kPrefillRows, n},
                               {kPrefillQRows, n * parts_[0].q_heads},
                               {kPrefillKvRows, n * parts_[0].kv_heads},
                               {kPrefillLast, n - 1},
                               {"pos", int64_t{position_}},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(run_parts(&Part::prefill, scalars));
  position_ += static_cast<int32_t>(n);
  last_prefill_ = true;
  return read_next(&Part::prefill_next);
}

StatusOr<std::vector<float>> Gemma3Model::logits() const {
  const View Part::*which = last_prefill_ ? &Part::prefill_logits : &Part::logits;
  std::vector<float> out(static_cast<size_t>(config_.vocab));
  if (devices_ == 1) {
    NPURT_ASSIGN_OR_RETURN(ReadGuard g, parts_[0].runtime->memory().read(parts_[0].*which));
    std::memcpy(out.data(), g.bytes().data(), out.size() * sizeof(float));
    return out;
  }
  // Every device's vocabulary rows, gathered on each device by the communicator.
  std::vector<std::pair<exec::StreamPool*, exec::SlotLease>> leases;
  Status s;
  for (const Part& p : parts_) {
    auto lease = p.gather_streams->acquire();
    if (!lease.ok()) {
      s = lease.status();
      break;
    }
    leases.push_back({p.gather_streams.get(), *lease});
    s = p.comm->all_gather(lease->stream, p.*which, p.gathered.view());
    if (!s.ok()) break;
  }
  if (!s.ok()) parts_[0].comm->abort(s);
  // A stream that failed is replaced at its next acquire.
  for (const auto& [pool, lease] : leases) pool->finish(lease).ignore();
  NPURT_RETURN_IF_ERROR(s.with_context("gemma3: gathering the logits"));
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, parts_[0].runtime->memory().read(parts_[0].gathered.view()));
  std::memcpy(out.data(), g.bytes().data(), out.size() * sizeof(float));
  return out;
}

StatusOr<hal::DeviceSpec> gemma3_device_spec(const GgufFile& file, uint32_t cores, const Gemma3Options& options,
                                             int devices) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config c, Gemma3Config::from_gguf(file));
  if (devices < 1) return invalid_argument("gemma3: " + std::to_string(devices) + " devices");
  if (cores < 1) return invalid_argument("gemma3: 0 cores");
  // Weights take at most the file's bytes (a device's share of them), the KV cache
  // 2 elements per layer, position and kv dim of the device's heads; the rest is
  // intermediates and code.
  const uint64_t kv_heads = c.n_kv_heads % devices == 0 ? c.n_kv_heads / devices : 1;
  uint64_t positions = context_of(c, options);
  if (options.batch_sequences > 0) {  // the paged pool's positions too
    NPURT_ASSIGN_OR_RETURN(const PoolShape pool, pool_shape(c, options));
    positions += uint64_t{pool.blocks} * pool.block_positions;
  }
  const uint64_t kv = positions * c.n_layers * 2 * kv_heads * c.head_dim *
                      std::max<uint64_t>(isa::dtype_size(options.kv_cache), 1);
  hal::DeviceSpec spec;
  spec.cores = cores;
  spec.memory_bytes = (file.bytes().size() / devices + kv + (256ull << 20) + 4095) / 4096 * 4096;
  return spec;
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load_on(const GgufFile& file, std::string_view driver,
                                                             uint32_t cores, const Gemma3Options& options,
                                                             const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(hal::DeviceSpec spec, gemma3_device_spec(file, cores, options));
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<Runtime> runtime, Runtime::create(driver, spec));
  return load(file, *runtime, options, progress);
}

}  // namespace npurt::models
