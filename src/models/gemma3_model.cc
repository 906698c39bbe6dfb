#include "npurt/models/gemma3_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "models/gemma3_shard.h"
#include "npurt/base/math.h"
#include "npurt/comm/collective_steps.h"
#include "npurt/hal/handles.h"
#include "npurt/hal/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/paged_attention.h"
#include "npurt/ops/prefill_attention.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/weight_gemm.h"

namespace npurt::models {
namespace {

using isa::DType;
using OpPtr = std::shared_ptr<const ops::Operator>;

constexpr const char* kRopeLocal = "rope_local";
constexpr const char* kRopeGlobal = "rope_global";
// Scalars of the prefill chunk: its tokens, their query and kv head rows, the last row.
constexpr const char* kPrefillRows = "rows";
constexpr const char* kPrefillQRows = "rows_q";
constexpr const char* kPrefillKvRows = "rows_kv";
constexpr const char* kPrefillLast = "last";

StatusOr<DType> tensor_dtype(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.tensor(name);
  if (t == nullptr) return not_found("gemma3: no tensor '" + name + "'");
  return t->dtype;
}

// Norm weights are bound as f32 whatever the file stores (they are converted on load).
bool is_norm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

// A device's step and the part of each tensor it binds.
struct ShardedStep {
  graph::OperatorSequence sequence;
  std::map<std::string, TensorSlice> slices;
};

// Steps and buffer sizes of the decode step, built in order.
class StepList {
 public:
  void add(OpPtr op, std::vector<std::string> bindings) { steps_.push_back({std::move(op), std::move(bindings)}); }
  void size(const std::string& name, uint64_t elements) { sizes_[name] = elements; }
  // A weight's binding: its tensor name (which must be in the file), sized, and the
  // part of it this device holds.
  StatusOr<std::string> weight(const GgufFile& file, const std::string& name, uint64_t elements,
                               TensorSlice slice = {}) {
    NPURT_RETURN_IF_ERROR(tensor_dtype(file, name).status());
    sizes_[name] = elements;
    slices_[name] = slice;
    return name;
  }
  ShardedStep finish(const Gemma3Options& o, std::string name = "gemma3_step", std::vector<std::string> inputs = {}) {
    return {graph::OperatorSequence(std::move(name), std::move(steps_), std::move(inputs), {"next"}, std::move(sizes_),
                                    o.dispatch),
            std::move(slices_)};
  }

 private:
  std::vector<graph::SequenceStep> steps_;
  std::map<std::string, uint64_t> sizes_;
  std::map<std::string, TensorSlice> slices_;
};

// The attention operators need key and value heads of one width.
Status check_head_dims(const Gemma3Config& c) {
  if (c.value_dim == c.head_dim) return Status();
  return invalid_argument("gemma3: value_length " + std::to_string(c.value_dim) + " differs from key_length " +
                          std::to_string(c.head_dim) + "; the attention operators need them equal");
}

// The cache types the attention operators read.
Status check_kv_cache(const Gemma3Options& o) {
  if (o.kv_cache == DType::kF32 || o.kv_cache == DType::kF16 || o.kv_cache == DType::kBF16) return Status();
  return invalid_argument("gemma3: kv_cache " + std::string(isa::dtype_name(o.kv_cache)) + ": must be f32, f16 or bf16");
}

// A step's activations for `rows` tokens on one device (the prefill chunk names them
// in capitals), its logits and its next token.
void size_activations(StepList& s, const Gemma3Config& c, const Gemma3Shard& sh, uint64_t rows, bool capitals) {
  const uint64_t hidden = c.hidden, ffn = sh.ffn, q_dim = static_cast<uint64_t>(sh.q_heads) * c.head_dim,
                 kv_dim = static_cast<uint64_t>(sh.kv_heads) * c.head_dim;
  const std::pair<const char*, uint64_t> widths[] = {{"h", hidden}, {"x", hidden}, {"a", hidden}, {"f", hidden},
                                                     {"q", q_dim},  {"attn", q_dim}, {"k", kv_dim}, {"v", kv_dim},
                                                     {"g", ffn},    {"u", ffn}};
  for (const auto& [lower, width] : widths) {
    std::string name = lower;
    if (capitals) std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::toupper(ch); });
    s.size(name, rows * width);
  }
  s.size("logits", sh.vocab);
  s.size("next", 1);
}

std::shared_ptr<ops::Gemv> gemv(uint64_t m, uint64_t k, DType weight) {
  return std::make_shared<ops::Gemv>(ops::GemvParams{.m = m, .k = k, .weight = weight});
}

std::shared_ptr<ops::RmsNorm> rmsnorm(uint64_t rows, uint32_t dim, float eps, uint32_t cores = 0) {
  return std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = rows, .dim = dim, .eps = eps, .cores = cores});
}

// The row-wise operators of a step over a runtime number of rows (the "rows" scalars).
std::shared_ptr<ops::RmsNorm> rmsnorm_rows(uint64_t rows, uint64_t dim, float eps) {
  return std::make_shared<ops::RmsNorm>(
      ops::RmsNormParams{.rows = rows, .dim = static_cast<uint32_t>(dim), .eps = eps, .rows_runtime = true});
}
std::shared_ptr<ops::Elementwise> elementwise_rows(ops::ElementwiseKind kind, uint64_t rows, uint64_t row) {
  return std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = kind, .n = rows * row, .row_elems = row});
}

uint32_t context_of(const Gemma3Config& c, const Gemma3Options& o) {
  const uint32_t file_ctx = static_cast<uint32_t>(c.context_length);
  return o.max_context == 0 ? file_ctx : std::min(o.max_context, file_ctx);
}

// What one layer binds besides its matrices: the caches, the norm weights and the RoPE
// base scalar; the decode step and the prefill chunk bind the same names.
struct LayerBindings {
  std::string kc, vc, attn_norm, q_norm, k_norm, post_attn, ffn_norm, post_ffw;
  const char* rope_base = nullptr;
};

// `cache_rows`: rows of the layer's caches, "k_cache.<l>" and "v_cache.<l>" (ctx
// positions), or with `paged` "k_pool.<l>" and "v_pool.<l>" (the paged pool's rows).
StatusOr<LayerBindings> bind_layer(const GgufFile& file, const Gemma3Config& c, const Gemma3Shard& sh,
                                   uint64_t cache_rows, int32_t l, StepList& s, bool paged = false) {
  auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
  const uint64_t hidden = c.hidden, hd = c.head_dim, kv_dim = uint64_t(sh.kv_heads) * hd;
  LayerBindings b;
  b.kc = (paged ? "k_pool." : "k_cache.") + std::to_string(l);
  b.vc = (paged ? "v_pool." : "v_cache.") + std::to_string(l);
  s.size(b.kc, cache_rows * kv_dim);
  s.size(b.vc, cache_rows * kv_dim);
  NPURT_ASSIGN_OR_RETURN(b.attn_norm, s.weight(file, t("attn_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.q_norm, s.weight(file, t("attn_q_norm"), hd));
  NPURT_ASSIGN_OR_RETURN(b.k_norm, s.weight(file, t("attn_k_norm"), hd));
  NPURT_ASSIGN_OR_RETURN(b.post_attn, s.weight(file, t("post_attention_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.ffn_norm, s.weight(file, t("ffn_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.post_ffw, s.weight(file, t("post_ffw_norm"), hidden));
  b.rope_base = c.is_global(l) ? kRopeGlobal : kRopeLocal;
  return b;
}

// The parts of a layer's matrices a device holds: rows of q/k/v and gate/up, columns
// of the output and down projections (gemma3_shard.h).
struct LayerSlices {
  TensorSlice q, kv, attn_out, ffn_rows, ffn_down;
};

LayerSlices layer_slices(const Gemma3Config& c, const Gemma3Shard& sh) {
  const uint64_t hd = c.head_dim;
  return {TensorSlice::rows(sh.first_q_head * hd, sh.q_heads * hd),
          TensorSlice::rows(sh.first_kv_head * hd, sh.kv_heads * hd),
          TensorSlice::columns(sh.first_q_head * hd, sh.q_heads * hd), TensorSlice::rows(sh.first_ffn, sh.ffn),
          TensorSlice::columns(sh.first_ffn, sh.ffn)};
}

TensorSlice vocab_slice(const Gemma3Shard& sh) { return TensorSlice::rows(sh.first_vocab, sh.vocab); }

// The embedding of `tokens` (0: the one-token form) over this device's vocabulary rows.
std::shared_ptr<ops::Embedding> embedding(const Gemma3Config& c, const Gemma3Shard& sh, DType dtype, uint32_t tokens) {
  return std::make_shared<ops::Embedding>(ops::EmbeddingParams{.vocab = sh.vocab,
                                                               .dim = static_cast<uint32_t>(c.hidden),
                                                               .dtype = dtype,
                                                               .scale = std::sqrt(static_cast<float>(c.hidden)),
                                                               .tokens = tokens,
                                                               .shard = sh.parallel(),
                                                               .first_row = sh.first_vocab});
}

// The embedding of the "tokens" of a step of `rows` rows into "H".
Status add_embedding_rows(const GgufFile& file, const Gemma3Config& c, const Gemma3Shard& sh, uint32_t rows,
                          StepList& s) {
  const std::string embd = "token_embd.weight";
  NPURT_ASSIGN_OR_RETURN(DType embd_type, tensor_dtype(file, embd));
  NPURT_RETURN_IF_ERROR(s.weight(file, embd, c.hidden * sh.vocab, vocab_slice(sh)).status());
  s.add(embedding(c, sh, embd_type, rows), {embd, "tokens", "H", kPrefillRows});
  return Status();
}

// The greedy token from `logits`: on one device an argmax into "next"; over several,
// each device's (index, value) pair gathered into "next" (2 i32 per device), which the
// host combines (ops::argmax_pick).
void add_argmax(StepList& s, const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm) {
  if (!sh.parallel()) {
    s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = sh.vocab}), {"logits", "next"});
    return;
  }
  s.size("best", 2);
  s.size("next", 2 * static_cast<uint64_t>(sh.size));
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = sh.vocab, .with_value = true, .index_base = sh.first_vocab}),
        {"logits", "best"});
  s.add(std::make_shared<comm::AllGatherStep>(comm, DType::kI32, 2), {"best", "next"});
}

// The decode step's attention over this device's heads; with `queries` > 0, for that
// many consecutive tokens (the "rows" scalar says how many a call runs).
std::shared_ptr<ops::DecodeAttention> decode_attention(const Gemma3Config& c, const Gemma3Options& o,
                                                       const Gemma3Shard& sh, uint32_t ctx, bool global,
                                                       uint32_t queries) {
  return std::make_shared<ops::DecodeAttention>(ops::DecodeAttentionParams{
      .n_heads = static_cast<uint32_t>(sh.q_heads),
      .n_kv_heads = static_cast<uint32_t>(sh.kv_heads),
      .head_dim = static_cast<uint32_t>(c.head_dim),
      .max_len = ctx,
      .window = global ? 0u : static_cast<uint32_t>(c.sliding_window),
      .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
      .kv_dtype = o.kv_cache,
      .queries = std::max<uint32_t>(queries, 1),
      .queries_runtime = queries > 0,
      .split_positions = true});
}

// Binds "partials" of a split decode attention: `name`, sized for `op`, shared by
// every layer (each layer's attention writes it before reading it).
std::string bind_partials(StepList& s, const ops::DecodeAttention& op, const std::string& name) {
  s.size(name, op.partials_elems());
  return name;
}

StatusOr<ShardedStep> decode_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                  const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  NPURT_RETURN_IF_ERROR(check_kv_cache(o));
  const uint32_t ctx = context_of(c, o);
  const uint64_t hidden = c.hidden, hd = c.head_dim;
  const uint64_t q_dim = sh.q_heads * hd, kv_dim = sh.kv_heads * hd, ffn = sh.ffn;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  size_activations(s, c, sh, 1, /*capitals=*/false);

  auto matvec = [&](const std::string& name, uint64_t m, uint64_t k, std::string in, std::string out,
                    TensorSlice slice) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    NPURT_RETURN_IF_ERROR(s.weight(file, name, m * k, slice).status());
    s.add(gemv(m, k, t), {name, std::move(in), std::move(out)});
    return Status();
  };
  // Partial sums of a row-parallel projection, added over the devices.
  auto sum_over_devices = [&](const std::string& name) {
    if (sh.parallel()) s.add(std::make_shared<comm::AllReduceStep>(comm, DType::kF32, hidden), {name});
  };

  const std::string embd = "token_embd.weight";
  NPURT_ASSIGN_OR_RETURN(DType embd_type, tensor_dtype(file, embd));
  NPURT_RETURN_IF_ERROR(s.weight(file, embd, hidden * sh.vocab, vocab_slice(sh)).status());
  s.add(embedding(c, sh, embd_type, 0), {embd, "token", "h"});
  sum_over_devices("h");

  const auto norm_hidden = rmsnorm(1, dim, c.rms_eps);
  // The heads' norms on one block, as the RoPE and cache appends after them: a few
  // hundred values each, and a chain of one-block steps shares one phase.
  const auto norm_q = rmsnorm(sh.q_heads, static_cast<uint32_t>(hd), c.rms_eps, 1);
  const auto norm_k = rmsnorm(sh.kv_heads, static_cast<uint32_t>(hd), c.rms_eps, 1);
  const auto rope_q = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(sh.q_heads),
                                                                   .head_dim = static_cast<uint32_t>(hd)});
  const auto rope_k = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(sh.kv_heads),
                                                                   .head_dim = static_cast<uint32_t>(hd)});
  const auto append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{
      .rows = 1, .cols = static_cast<uint32_t>(kv_dim), .dst_rows = ctx, .dst_row_runtime = true,
      .dst_dtype = o.kv_cache});
  const auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = hidden});
  const auto gelu_mul =
      std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kGeluTanhMul, .n = ffn});
  const auto attend_local = decode_attention(c, o, sh, ctx, false, 0), attend_global = decode_attention(c, o, sh, ctx, true, 0);
  const std::string partials = bind_partials(s, *attend_global, "attn_partials");

  for (int32_t l = 0; l < c.n_layers; ++l) {
    auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
    const bool global = c.is_global(l);
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, ctx, l, s));

    s.add(norm_hidden, {"h", lb.attn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_q"), q_dim, hidden, "x", "q", cut.q));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_k"), kv_dim, hidden, "x", "k", cut.kv));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_v"), kv_dim, hidden, "x", "v", cut.kv));
    s.add(norm_q, {"q", lb.q_norm, "q"});
    s.add(norm_k, {"k", lb.k_norm, "k"});
    s.add(rope_q, {"q", "q", "pos", lb.rope_base});
    s.add(rope_k, {"k", "k", "pos", lb.rope_base});
    s.add(append, {"k", lb.kc, "pos"});
    s.add(append, {"v", lb.vc, "pos"});
    s.add(global ? attend_global : attend_local, {"q", lb.kc, lb.vc, "attn", "len", partials});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_output"), hidden, q_dim, "attn", "a", cut.attn_out));
    sum_over_devices("a");
    s.add(norm_hidden, {"a", lb.post_attn, "a"});
    s.add(add, {"h", "a", "h"});

    s.add(norm_hidden, {"h", lb.ffn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_gate"), ffn, hidden, "x", "g", cut.ffn_rows));
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_up"), ffn, hidden, "x", "u", cut.ffn_rows));
    s.add(gelu_mul, {"g", "u", "g"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_down"), hidden, ffn, "g", "f", cut.ffn_down));
    sum_over_devices("f");
    s.add(norm_hidden, {"f", lb.post_ffw, "f"});
    s.add(add, {"h", "f", "h"});
  }
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  s.add(norm_hidden, {"h", out_norm, "x"});
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_RETURN_IF_ERROR(matvec(std::string(head->name), sh.vocab, hidden, "x", "logits", vocab_slice(sh)));
  add_argmax(s, sh, comm);
  return s.finish(o);
}

// The two sequences that run several tokens per call: the prefill chunk (matrix work,
// only the last token's logits) and the verify step (the decode step's batch-invariant
// kernels for T tokens, every token's logits and argmax).
enum class Batched : uint8_t { kPrefill, kVerify };

StatusOr<ShardedStep> batched_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                   const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm,
                                   Batched kind) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  NPURT_RETURN_IF_ERROR(check_kv_cache(o));
  const bool verify = kind == Batched::kVerify;
  const uint32_t ctx = context_of(c, o);
  const uint32_t T = std::min(verify ? o.verify_tokens : o.prefill_chunk, ctx);
  if (T == 0) return invalid_argument("gemma3: a chunk of 0 tokens builds no sequence");
  if (verify && T > isa::kMaxTmvBatch) {
    return invalid_argument("gemma3: verify_tokens " + std::to_string(T) + " is above the batched kernels' " +
                            std::to_string(isa::kMaxTmvBatch));
  }
  if (verify && sh.parallel()) return invalid_argument("gemma3: the verify step runs on one device");
  const uint64_t hidden = c.hidden, hd = c.head_dim;
  const uint64_t q_dim = sh.q_heads * hd, kv_dim = sh.kv_heads * hd, ffn = sh.ffn;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  s.size("tokens", T);
  size_activations(s, c, sh, T, /*capitals=*/true);
  if (!verify) {
    s.size("h_last", hidden);
    s.size("x_last", hidden);
  }

  auto matmul = [&](const std::string& name, uint64_t m, uint64_t k, std::string in, std::string out,
                    TensorSlice slice) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    NPURT_RETURN_IF_ERROR(s.weight(file, name, m * k, slice).status());
    // Verification runs the decode step's GEMV over a batch, bitwise the same per token.
    OpPtr op = verify ? OpPtr(std::make_shared<ops::Gemv>(
                            ops::GemvParams{.m = m, .k = k, .weight = t, .batch = T, .batch_runtime = true}))
                      : OpPtr(std::make_shared<ops::WeightGemm>(
                            ops::WeightGemmParams{.m = m, .k = k, .rows = T, .weight = t, .rows_runtime = true}));
    s.add(std::move(op), {name, std::move(in), std::move(out), kPrefillRows});
    return Status();
  };
  // The partial sums of the call's rows, added over the devices.
  auto sum_over_devices = [&](const std::string& name) {
    if (!sh.parallel()) return;
    s.add(std::make_shared<comm::AllReduceStep>(comm, DType::kF32, T * hidden, hidden), {name, kPrefillRows});
  };
  auto rms = [&](uint64_t rows, uint64_t d) { return rmsnorm_rows(rows, d, c.rms_eps); };
  auto rowwise = [&](ops::ElementwiseKind kind, uint64_t row) { return elementwise_rows(kind, T, row); };
  NPURT_RETURN_IF_ERROR(add_embedding_rows(file, c, sh, T, s));
  sum_over_devices("H");

  const auto norm_rows = rms(T, hidden);
  const auto norm_q = rms(T * sh.q_heads, hd), norm_k = rms(T * sh.kv_heads, hd);
  auto rope = [&](int32_t heads) {
    return std::make_shared<ops::Rope>(
        ops::RopeParams{.n_heads = static_cast<uint32_t>(heads), .head_dim = static_cast<uint32_t>(hd), .tokens = T});
  };
  const auto rope_q = rope(sh.q_heads), rope_k = rope(sh.kv_heads);
  const auto append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{.rows = T,
                                                                                .cols = static_cast<uint32_t>(kv_dim),
                                                                                .dst_rows = ctx,
                                                                                .dst_row_runtime = true,
                                                                                .rows_runtime = true,
                                                                                .dst_dtype = o.kv_cache});
  const auto add = rowwise(ops::ElementwiseKind::kAdd, hidden);
  const auto gelu_mul = rowwise(ops::ElementwiseKind::kGeluTanhMul, ffn);
  auto attention = [&](bool global) -> OpPtr {
    if (verify) return decode_attention(c, o, sh, ctx, global, T);
    return std::make_shared<ops::PrefillAttention>(ops::PrefillAttentionParams{
        .n_heads = static_cast<uint32_t>(sh.q_heads),
        .n_kv_heads = static_cast<uint32_t>(sh.kv_heads),
        .head_dim = static_cast<uint32_t>(hd),
        .max_len = ctx,
        .tokens = T,
        .window = global || o.prefill_ignores_window_for_test ? 0u : static_cast<uint32_t>(c.sliding_window),
        .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
        .kv_dtype = o.kv_cache});
  };
  const OpPtr attend_local = attention(false), attend_global = attention(true);
  std::vector<std::string> verify_partials;  // the split verify attention's workspace
  if (verify) verify_partials = {bind_partials(s, *decode_attention(c, o, sh, ctx, true, T), "ATTN_PARTIALS")};

  for (int32_t l = 0; l < c.n_layers; ++l) {
    auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
    const bool global = c.is_global(l);
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, ctx, l, s));

    s.add(norm_rows, {"H", lb.attn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("attn_q"), q_dim, hidden, "X", "Q", cut.q));
    NPURT_RETURN_IF_ERROR(matmul(t("attn_k"), kv_dim, hidden, "X", "K", cut.kv));
    NPURT_RETURN_IF_ERROR(matmul(t("attn_v"), kv_dim, hidden, "X", "V", cut.kv));
    s.add(norm_q, {"Q", lb.q_norm, "Q", kPrefillQRows});
    s.add(norm_k, {"K", lb.k_norm, "K", kPrefillKvRows});
    s.add(rope_q, {"Q", "Q", "pos", lb.rope_base, kPrefillRows});
    s.add(rope_k, {"K", "K", "pos", lb.rope_base, kPrefillRows});
    s.add(append, {"K", lb.kc, "pos", kPrefillRows});
    s.add(append, {"V", lb.vc, "pos", kPrefillRows});
    std::vector<std::string> attend_args{"Q", lb.kc, lb.vc, "ATTN", verify ? "len" : "pos", kPrefillRows};
    attend_args.insert(attend_args.end(), verify_partials.begin(), verify_partials.end());
    s.add(global ? attend_global : attend_local, attend_args);
    NPURT_RETURN_IF_ERROR(matmul(t("attn_output"), hidden, q_dim, "ATTN", "A", cut.attn_out));
    sum_over_devices("A");
    s.add(norm_rows, {"A", lb.post_attn, "A", kPrefillRows});
    s.add(add, {"H", "A", "H", kPrefillRows});

    s.add(norm_rows, {"H", lb.ffn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_gate"), ffn, hidden, "X", "G", cut.ffn_rows));
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_up"), ffn, hidden, "X", "U", cut.ffn_rows));
    s.add(gelu_mul, {"G", "U", "G", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_down"), hidden, ffn, "G", "F", cut.ffn_down));
    sum_over_devices("F");
    s.add(norm_rows, {"F", lb.post_ffw, "F", kPrefillRows});
    s.add(add, {"H", "F", "H", kPrefillRows});
  }
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_ASSIGN_OR_RETURN(DType head_type, tensor_dtype(file, std::string(head->name)));
  if (verify) {
    // Every token's logits and greedy successor.
    NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
    s.add(norm_rows, {"H", out_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(s.weight(file, std::string(head->name), sh.vocab * hidden, vocab_slice(sh)).status());
    s.size("logits", T * sh.vocab);
    s.size("next", T);
    s.add(std::make_shared<ops::Gemv>(ops::GemvParams{
              .m = sh.vocab, .k = hidden, .weight = head_type, .batch = T, .batch_runtime = true}),
          {std::string(head->name), "X", "logits", kPrefillRows});
    s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = sh.vocab, .vectors = T, .vectors_runtime = true}),
          {"logits", "next", kPrefillRows});
    return s.finish(o, "gemma3_verify", {"tokens"});
  }
  // Only the last token's logits are needed: its row of H through the decode step's tail.
  s.add(std::make_shared<ops::StridedCopy>(
            ops::StridedCopyParams{.rows = 1, .cols = dim, .src_rows = T, .src_row_runtime = true}),
        {"H", "h_last", kPrefillLast});
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  s.add(rmsnorm(1, dim, c.rms_eps), {"h_last", out_norm, "x_last"});
  NPURT_RETURN_IF_ERROR(s.weight(file, std::string(head->name), sh.vocab * hidden, vocab_slice(sh)).status());
  s.add(gemv(sh.vocab, hidden, head_type), {std::string(head->name), "x_last", "logits"});
  add_argmax(s, sh, comm);
  return s.finish(o, "gemma3_prefill", {"tokens"});
}

StatusOr<ShardedStep> prefill_chunk(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                    const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm) {
  return batched_step(file, c, o, sh, comm, Batched::kPrefill);
}

// The paged KV pool's shape for `o`: positions per block, blocks, table entries per
// sequence.
struct PoolShape {
  uint32_t block_positions = 0, blocks = 0, max_blocks = 0;
};

StatusOr<PoolShape> pool_shape(const Gemma3Config& c, const Gemma3Options& o) {
  if (o.batch_sequences > isa::kMaxTmvBatch) {
    return invalid_argument("gemma3: batch_sequences " + std::to_string(o.batch_sequences) +
                            " is above the batched kernels' " + std::to_string(isa::kMaxTmvBatch));
  }
  if (o.kv_block_positions == 0) return invalid_argument("gemma3: kv_block_positions is 0");
  PoolShape p;
  p.block_positions = o.kv_block_positions;
  p.max_blocks = static_cast<uint32_t>(ceil_div(context_of(c, o), p.block_positions));
  p.blocks = o.kv_blocks ? o.kv_blocks : o.batch_sequences * p.max_blocks;
  return p;
}

// Rows of the paged prefill chunk: prefill_chunk, at most the context and the pool.
uint32_t paged_prefill_rows(const Gemma3Config& c, const Gemma3Options& o, const PoolShape& pool) {
  return static_cast<uint32_t>(
      std::min<uint64_t>({o.prefill_chunk, context_of(c, o), uint64_t{pool.blocks} * pool.block_positions}));
}

// The two steps over the paged pool, one token per row, each row at its own position
// ("positions"), its keys and values appended at its pool row ("kv_rows") and its
// attention through its block table ("tables", "lens" = position + 1):
// - the batched decode step: B sequences (the "rows" scalar, up to batch_sequences),
//   one token each, through the decode step's batch-invariant kernels; every row's
//   logits and argmax ("next", B i32);
// - the paged prefill chunk: T prompt tokens (up to prefill_chunk) as matrix work
//   (WeightGemm), each row bitwise what it is in any other chunk (the kernels work row
//   by row); the logits and argmax of row "last" only.
enum class Paged : uint8_t { kDecode, kPrefill };

StatusOr<ShardedStep> paged_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                 const Gemma3Shard& sh, Paged kind) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  NPURT_RETURN_IF_ERROR(check_kv_cache(o));
  NPURT_ASSIGN_OR_RETURN(const PoolShape pool, pool_shape(c, o));
  const bool prefill = kind == Paged::kPrefill;
  const uint32_t B = prefill ? paged_prefill_rows(c, o, pool) : o.batch_sequences;
  if (B == 0) return invalid_argument("gemma3: a paged step of 0 rows builds no sequence");
  const uint64_t hidden = c.hidden, hd = c.head_dim;
  const uint64_t q_dim = sh.q_heads * hd, kv_dim = sh.kv_heads * hd, ffn = sh.ffn;
  const uint64_t pool_rows = uint64_t{pool.blocks} * pool.block_positions;
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  for (const char* input : {"tokens", "positions", "lens", "kv_rows"}) s.size(input, B);
  s.size("tables", uint64_t{B} * pool.max_blocks);
  size_activations(s, c, sh, B, /*capitals=*/true);

  auto matvec = [&](const std::string& name, uint64_t m, uint64_t k, std::string in, std::string out,
                    TensorSlice slice) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    NPURT_RETURN_IF_ERROR(s.weight(file, name, m * k, slice).status());
    const OpPtr op =
        prefill ? OpPtr(std::make_shared<ops::WeightGemm>(
                      ops::WeightGemmParams{.m = m, .k = k, .rows = B, .weight = t, .rows_runtime = true}))
                : OpPtr(std::make_shared<ops::Gemv>(
                      ops::GemvParams{.m = m, .k = k, .weight = t, .batch = B, .batch_runtime = true}));
    s.add(op, {name, std::move(in), std::move(out), kPrefillRows});
    return Status();
  };
  auto rms = [&](uint64_t rows, uint64_t d) { return rmsnorm_rows(rows, d, c.rms_eps); };
  auto rowwise = [&](ops::ElementwiseKind kind, uint64_t row) { return elementwise_rows(kind, B, row); };
  NPURT_RETURN_IF_ERROR(add_embedding_rows(file, c, sh, B, s));

  const auto norm_rows = rms(B, hidden);
  const auto norm_q = rms(B * sh.q_heads, hd), norm_k = rms(B * sh.kv_heads, hd);
  auto rope = [&](int32_t heads) {
    return std::make_shared<ops::Rope>(ops::RopeParams{
        .n_heads = static_cast<uint32_t>(heads), .head_dim = static_cast<uint32_t>(hd), .tokens = B, .positions = true});
  };
  const auto rope_q = rope(sh.q_heads), rope_k = rope(sh.kv_heads);
  const auto append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{.rows = B,
                                                                                .cols = static_cast<uint32_t>(kv_dim),
                                                                                .dst_rows = pool_rows,
                                                                                .rows_runtime = true,
                                                                                .dst_row_index = true,
                                                                                .dst_dtype = o.kv_cache});
  auto attention = [&](bool global) {
    return std::make_shared<ops::PagedDecodeAttention>(ops::PagedDecodeAttentionParams{
        .n_heads = static_cast<uint32_t>(sh.q_heads),
        .n_kv_heads = static_cast<uint32_t>(sh.kv_heads),
        .head_dim = static_cast<uint32_t>(hd),
        .block_positions = pool.block_positions,
        .blocks = pool.blocks,
        .max_blocks = pool.max_blocks,
        .sequences = B,
        .window = global ? 0u : static_cast<uint32_t>(c.sliding_window),
        .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
        .kv_dtype = o.kv_cache});
  };
  const auto attend_local = attention(false), attend_global = attention(true);
  const auto add = rowwise(ops::ElementwiseKind::kAdd, hidden);
  const auto gelu_mul = rowwise(ops::ElementwiseKind::kGeluTanhMul, ffn);

  for (int32_t l = 0; l < c.n_layers; ++l) {
    auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, pool_rows, l, s, /*paged=*/true));
    s.add(norm_rows, {"H", lb.attn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_q"), q_dim, hidden, "X", "Q", cut.q));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_k"), kv_dim, hidden, "X", "K", cut.kv));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_v"), kv_dim, hidden, "X", "V", cut.kv));
    s.add(norm_q, {"Q", lb.q_norm, "Q", kPrefillQRows});
    s.add(norm_k, {"K", lb.k_norm, "K", kPrefillKvRows});
    s.add(rope_q, {"Q", "Q", "pos", lb.rope_base, kPrefillRows, "positions"});
    s.add(rope_k, {"K", "K", "pos", lb.rope_base, kPrefillRows, "positions"});
    s.add(append, {"K", lb.kc, kPrefillRows, "kv_rows"});
    s.add(append, {"V", lb.vc, kPrefillRows, "kv_rows"});
    s.add(c.is_global(l) ? attend_global : attend_local, {"Q", lb.kc, lb.vc, "tables", "lens", "ATTN", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_output"), hidden, q_dim, "ATTN", "A", cut.attn_out));
    s.add(norm_rows, {"A", lb.post_attn, "A", kPrefillRows});
    s.add(add, {"H", "A", "H", kPrefillRows});
    s.add(norm_rows, {"H", lb.ffn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_gate"), ffn, hidden, "X", "G", cut.ffn_rows));
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_up"), ffn, hidden, "X", "U", cut.ffn_rows));
    s.add(gelu_mul, {"G", "U", "G", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_down"), hidden, ffn, "G", "F", cut.ffn_down));
    s.add(norm_rows, {"F", lb.post_ffw, "F", kPrefillRows});
    s.add(add, {"H", "F", "H", kPrefillRows});
  }
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  const std::vector<std::string> inputs{"tokens", "positions", "lens", "tables", "kv_rows"};
  if (prefill) {
    // Only the last row's logits are wanted: that row through the decode step's tail.
    NPURT_ASSIGN_OR_RETURN(DType head_type, tensor_dtype(file, std::string(head->name)));
    NPURT_RETURN_IF_ERROR(s.weight(file, std::string(head->name), sh.vocab * hidden, vocab_slice(sh)).status());
    s.size("h_last", hidden);
    s.size("x_last", hidden);
    s.add(std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{
              .rows = 1, .cols = static_cast<uint32_t>(hidden), .src_rows = B, .src_row_runtime = true}),
          {"H", "h_last", kPrefillLast});
    s.add(rmsnorm(1, static_cast<uint32_t>(hidden), c.rms_eps), {"h_last", out_norm, "x_last"});
    s.add(gemv(sh.vocab, hidden, head_type), {std::string(head->name), "x_last", "logits"});
    add_argmax(s, sh, nullptr);
    return s.finish(o, "gemma3_paged_prefill", inputs);
  }
  s.add(norm_rows, {"H", out_norm, "X", kPrefillRows});
  s.size("logits", uint64_t{B} * sh.vocab);
  s.size("next", B);
  NPURT_RETURN_IF_ERROR(matvec(std::string(head->name), sh.vocab, hidden, "X", "logits", vocab_slice(sh)));
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = sh.vocab, .vectors = B, .vectors_runtime = true}),
        {"logits", "next", kPrefillRows});
  return s.finish(o, "gemma3_batch", inputs);
}

}  // namespace

StatusOr<graph::OperatorSequence> gemma3_decode_step(const GgufFile& file, const Gemma3Config& c,
                                                     const Gemma3Options& o) {
  NPURT_ASSIGN_OR_RETURN(ShardedStep step, decode_step(file, c, o, Gemma3Shard::whole(c), nullptr));
  return std::move(step.sequence);
}

StatusOr<graph::OperatorSequence> gemma3_prefill_chunk(const GgufFile& file, const Gemma3Config& c,
                                                       const Gemma3Options& o) {
  NPURT_ASSIGN_OR_RETURN(ShardedStep step, prefill_chunk(file, c, o, Gemma3Shard::whole(c), nullptr));
  return std::move(step.sequence);
}

StatusOr<graph::OperatorSequence> gemma3_verify_step(const GgufFile& file, const Gemma3Config& c,
                                                     const Gemma3Options& o) {
  NPURT_ASSIGN_OR_RETURN(ShardedStep step,
                         batched_step(file, c, o, Gemma3Shard::whole(c), nullptr, Batched::kVerify));
  return std::move(step.sequence);
}

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
    {
      NPURT_ASSIGN_OR_RETURN(WriteGuard g, memory.overwrite(v));
      const std::span<uint8_t> dst = g.bytes();
      if (is_norm(std::string(t->name)) && t->dtype != DType::kF32) {
        const std::vector<float> f = isa::to_f32(t->data, t->dtype);
        if (f.size() * sizeof(float) != dst.size()) return internal_error("gemma3: norm size mismatch");
        std::memcpy(dst.data(), f.data(), dst.size());
      } else {
        NPURT_RETURN_IF_ERROR(copy_slice(*t, step.slices.at(std::string(t->name)), dst));
      }
    }
    NPURT_RETURN_IF_ERROR(memory.to_device(v));
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
  auto compiled = step.sequence.compile(runtime);
  if (!compiled.ok()) return compiled.status().with_context(sizes);
  part.seq = std::move(compiled).value();
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
    auto prefill = chunk.sequence.compile(runtime, co);
    if (!prefill.ok()) return prefill.status().with_context(sizes + ", compiling the prefill chunk");
    part.prefill = std::move(prefill).value();
    NPURT_ASSIGN_OR_RETURN(part.prefill_tokens, part.prefill->get_buffer("tokens"));
    NPURT_ASSIGN_OR_RETURN(part.prefill_next, part.prefill->get_buffer("next"));
    NPURT_ASSIGN_OR_RETURN(part.prefill_logits, part.prefill->get_buffer("logits"));
  }
  if (options.verify_tokens > 0 && size == 1) {
    NPURT_ASSIGN_OR_RETURN(ShardedStep v, batched_step(file, config, options, shard, part.comm, Batched::kVerify));
    auto verify = v.sequence.compile(runtime, co);
    if (!verify.ok()) return verify.status().with_context(sizes + ", compiling the verify step");
    part.verify = std::move(verify).value();
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
      return Status();
    };
    graph::CompileOptions weights_only = co;  // its caches are the pool's, not these
    std::erase_if(weights_only.shared, [&](const auto& kv) { return file.tensor(kv.first) == nullptr; });
    auto batch = compile_paged(file, config, options, shard, Paged::kDecode, runtime, weights_only);
    if (!batch.ok()) return batch.status().with_context(sizes + ", compiling the batched decode step");
    part.batch = std::move(batch).value();
    NPURT_RETURN_IF_ERROR(views(*part.batch, part.batch_in));
    if (options.prefill_chunk > 0) {
      // The prefill chunk writes the pool the decode step reads: the same buffers.
      graph::CompileOptions with_pool = weights_only;
      for (const graph::BufferPlacement& p : part.batch->placements()) {
        if (p.name.starts_with("k_pool.") || p.name.starts_with("v_pool.")) {
          NPURT_ASSIGN_OR_RETURN(with_pool.shared[p.name], part.batch->get_buffer(p.name));
        }
      }
      auto prefill = compile_paged(file, config, options, shard, Paged::kPrefill, runtime, with_pool);
      if (!prefill.ok()) return prefill.status().with_context(sizes + ", compiling the paged prefill chunk");
      part.paged_prefill = std::move(prefill).value();
      NPURT_RETURN_IF_ERROR(views(*part.paged_prefill, part.paged_prefill_in));
    }
  }
  NPURT_ASSIGN_OR_RETURN(part.weight_bytes, upload_weights(file, step, *part.seq, runtime.memory(), progress));
  return Status();
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
    return Status();
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
  return Status();
}

Status Gemma3Model::rewind(int32_t position) {
  if (position < 0 || position > position_) {
    return invalid_argument("gemma3: cannot rewind to position " + std::to_string(position) + " (the context holds " +
                            std::to_string(position_) + ")");
  }
  position_ = position;
  return Status();
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

StatusOr<std::vector<int32_t>> Gemma3Model::decode_batch(std::span<const BatchToken> batch) {
  if (max_batch_ == 0) return failed_precondition("gemma3: loaded without a batched decode step (batch_sequences 0)");
  if (batch.empty() || batch.size() > max_batch_) {
    return invalid_argument("gemma3: decode_batch of " + std::to_string(batch.size()) +
                            " sequences; the compiled step takes 1 .. " + std::to_string(max_batch_));
  }
  Part& p = parts_[0];
  NPURT_RETURN_IF_ERROR(write_paged(p.batch_in, batch, "decode_batch"));
  last_paged_ = {};
  NPURT_RETURN_IF_ERROR(run_parts(&Part::batch, paged_scalars(batch.size(), false)));
  last_paged_ = {&PagedInputs::logits, static_cast<uint32_t>(batch.size()), &Part::batch_in};
  return read_leading<int32_t>(p.runtime->memory(), p.batch_in.next, batch.size());
}

StatusOr<int32_t> Gemma3Model::prefill_paged(std::span<const BatchToken> rows) {
  if (max_paged_prefill_ == 0) {
    return failed_precondition("gemma3: loaded without a paged prefill chunk (batch_sequences or prefill_chunk 0)");
  }
  if (rows.empty() || rows.size() > max_paged_prefill_) {
    return invalid_argument("gemma3: prefill_paged of " + std::to_string(rows.size()) +
                            " rows; the compiled chunk takes 1 .. " + std::to_string(max_paged_prefill_));
  }
  Part& p = parts_[0];
  NPURT_RETURN_IF_ERROR(write_paged(p.paged_prefill_in, rows, "prefill_paged"));
  last_paged_ = {};
  NPURT_RETURN_IF_ERROR(run_parts(&Part::paged_prefill, paged_scalars(rows.size(), true)));
  last_paged_ = {&PagedInputs::logits, 1, &Part::paged_prefill_in};
  NPURT_ASSIGN_OR_RETURN(const std::vector<int32_t> next, read_leading<int32_t>(p.runtime->memory(), p.paged_prefill_in.next, 1));
  return next[0];
}

StatusOr<std::vector<float>> Gemma3Model::batch_logits() const {
  if (last_paged_.rows == 0) return failed_precondition("gemma3: no decode_batch() or prefill_paged() call yet");
  const Part& p = parts_[0];
  return read_leading<float>(p.runtime->memory(), p.*last_paged_.step.*last_paged_.logits,
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
  return Status();
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
  return Status();
}

Status Gemma3Model::write_tokens(Part& p, const View& ids, std::span<const int32_t> tokens) {
  NPURT_ASSIGN_OR_RETURN(View head, ids.subview(0, tokens.size() * sizeof(int32_t)));
  NPURT_ASSIGN_OR_RETURN(WriteGuard g, p.runtime->memory().overwrite(head));
  std::memcpy(g.bytes().data(), tokens.data(), tokens.size_bytes());
  return Status();
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
  std::vector<Buffer> gathered;
  std::vector<hal::Stream> streams;
  Status s;
  for (const Part& p : parts_) {
    auto b = p.runtime->memory().create_buffer(out.size() * sizeof(float));
    auto st = hal::Stream::create(p.runtime->shared_device());
    if (!b.ok() || !st.ok()) {
      s = !b.ok() ? b.status() : st.status();
      break;
    }
    s = p.comm->all_gather(st->id(), p.*which, b->view());
    gathered.push_back(std::move(b).value());
    streams.push_back(std::move(st).value());
    if (!s.ok()) break;
  }
  if (!s.ok() && parts_.size() > 1) parts_[0].comm->abort(s);
  for (hal::Stream& st : streams) st.device().stream_synchronize(st.id()).ignore();
  NPURT_RETURN_IF_ERROR(s.with_context("gemma3: gathering the logits"));
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, parts_[0].runtime->memory().read(gathered[0].view()));
  std::memcpy(out.data(), g.bytes().data(), out.size() * sizeof(float));
  return out;
}

StatusOr<hal::SimOptions> gemma3_sim_options(const GgufFile& file, uint32_t cores, const Gemma3Options& options,
                                             int devices) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config c, Gemma3Config::from_gguf(file));
  if (devices < 1) return invalid_argument("gemma3: " + std::to_string(devices) + " devices");
  // Weights take at most the file's bytes (a device's share of them), the KV cache
  // 2 elements per layer, position and kv dim of the device's heads; the rest is
  // intermediates and code. GM pages are reserved lazily, so the margin costs nothing.
  const uint64_t kv_heads = c.n_kv_heads % devices == 0 ? c.n_kv_heads / devices : 1;
  uint64_t positions = context_of(c, options);
  if (options.batch_sequences > 0) {  // the paged pool's positions too
    NPURT_ASSIGN_OR_RETURN(const PoolShape pool, pool_shape(c, options));
    positions += uint64_t{pool.blocks} * pool.block_positions;
  }
  const uint64_t kv = positions * c.n_layers * 2 * kv_heads * c.head_dim *
                      std::max<uint64_t>(isa::dtype_size(options.kv_cache), 1);
  hal::SimOptions o;
  o.num_cores = cores;
  o.global_memory_bytes = (file.bytes().size() / devices + kv + (256ull << 20) + 4095) / 4096 * 4096;
  return o;
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load_sim(const GgufFile& file, uint32_t cores,
                                                              const Gemma3Options& options,
                                                              const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(hal::SimOptions sim, gemma3_sim_options(file, cores, options));
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<Runtime> runtime, Runtime::create_sim(sim));
  return load(file, *runtime, options, progress);
}

}  // namespace npurt::models
