// The Gemma-3 steps (gemma3_steps.h): one layer plan, run by each step kind with its
// own kernels and buffer names.
#include "models/gemma3_steps.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "npurt/base/hazards.h"
#include "npurt/base/math.h"
#include "npurt/comm/collective_steps.h"
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

using isa::DType;

namespace {

using OpPtr = std::shared_ptr<const ops::Operator>;

StatusOr<DType> tensor_dtype(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.tensor(name);
  if (t == nullptr) return not_found("gemma3: no tensor '" + name + "'");
  return t->dtype;
}

}  // namespace

// Norm weights are bound as f32 whatever the file stores (they are converted on load).
bool is_norm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

namespace {

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
  if (c.value_dim == c.head_dim) return ok_status();
  return invalid_argument("gemma3: value_length " + std::to_string(c.value_dim) + " differs from key_length " +
                          std::to_string(c.head_dim) + "; the attention operators need them equal");
}

// The cache types the attention operators read.
Status check_kv_cache(const Gemma3Options& o) {
  if (o.kv_cache == DType::kF32 || o.kv_cache == DType::kF16 || o.kv_cache == DType::kBF16) return ok_status();
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

}  // namespace

uint32_t context_of(const Gemma3Config& c, const Gemma3Options& o) {
  const uint32_t file_ctx = static_cast<uint32_t>(c.context_length);
  return o.max_context == 0 ? file_ctx : std::min(o.max_context, file_ctx);
}

namespace {

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
  return ok_status();
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

// How a step kind runs a Gemma layer: its kernels, its activations' names and the
// arguments its operators take besides them. Every step kind (decode, prefill chunk,
// verify, batched decode, paged prefill) is this one layer with other parts.
struct LayerPlan {
  // Activations: hidden state, its norm, q, k, v, attention output, its projection,
  // gate, up and the MLP's output.
  std::string h, x, q, k, v, attn, a, g, u, f;
  OpPtr norm, norm_q, norm_k, rope_q, rope_k, append, attend_local, attend_global, add, gelu_mul;
  // Appended to the row-wise operators' bindings (the norms over hidden rows, over q
  // heads and over kv heads, the adds and the gated GELU), to RoPE's and to the
  // append's after (source, cache).
  std::vector<std::string> rows, q_rows, kv_rows, rope, append_args;
  // The attention's bindings for (q, k cache, v cache, output).
  std::function<std::vector<std::string>(const std::string&, const std::string&, const std::string&,
                                         const std::string&)>
      attend;
  // The projection `name` (m x k) of `in` into `out`, this device's `slice` of it.
  std::function<Status(const std::string& name, uint64_t m, uint64_t k, const std::string& in, const std::string& out,
                       TensorSlice slice)>
      matmul;
  // Adds a row-parallel projection's partial sums over the devices (empty on one).
  std::function<void(const std::string&)> sum_over_devices;
};

std::vector<std::string> with(std::vector<std::string> v, const std::vector<std::string>& more) {
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

// Layer l of a step, as plan `p` runs it.
Status add_layer(StepList& s, const Gemma3Config& c, const Gemma3Shard& sh, const LayerSlices& cut, int32_t l,
                 const LayerBindings& lb, const LayerPlan& p) {
  auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
  const uint64_t hidden = c.hidden, hd = c.head_dim;
  const uint64_t q_dim = sh.q_heads * hd, kv_dim = sh.kv_heads * hd, ffn = sh.ffn;
  auto sum = [&](const std::string& name) {
    if (p.sum_over_devices) p.sum_over_devices(name);
  };
  s.add(p.norm, with({p.h, lb.attn_norm, p.x}, p.rows));
  NPURT_RETURN_IF_ERROR(p.matmul(t("attn_q"), q_dim, hidden, p.x, p.q, cut.q));
  NPURT_RETURN_IF_ERROR(p.matmul(t("attn_k"), kv_dim, hidden, p.x, p.k, cut.kv));
  NPURT_RETURN_IF_ERROR(p.matmul(t("attn_v"), kv_dim, hidden, p.x, p.v, cut.kv));
  s.add(p.norm_q, with({p.q, lb.q_norm, p.q}, p.q_rows));
  s.add(p.norm_k, with({p.k, lb.k_norm, p.k}, p.kv_rows));
  s.add(p.rope_q, with({p.q, p.q, "pos", lb.rope_base}, p.rope));
  s.add(p.rope_k, with({p.k, p.k, "pos", lb.rope_base}, p.rope));
  s.add(p.append, with({p.k, lb.kc}, p.append_args));
  s.add(p.append, with({p.v, lb.vc}, p.append_args));
  s.add(c.is_global(l) ? p.attend_global : p.attend_local, p.attend(p.q, lb.kc, lb.vc, p.attn));
  NPURT_RETURN_IF_ERROR(p.matmul(t("attn_output"), hidden, q_dim, p.attn, p.a, cut.attn_out));
  sum(p.a);
  s.add(p.norm, with({p.a, lb.post_attn, p.a}, p.rows));
  s.add(p.add, with({p.h, p.a, p.h}, p.rows));

  s.add(p.norm, with({p.h, lb.ffn_norm, p.x}, p.rows));
  NPURT_RETURN_IF_ERROR(p.matmul(t("ffn_gate"), ffn, hidden, p.x, p.g, cut.ffn_rows));
  NPURT_RETURN_IF_ERROR(p.matmul(t("ffn_up"), ffn, hidden, p.x, p.u, cut.ffn_rows));
  s.add(p.gelu_mul, with({p.g, p.u, p.g}, p.rows));
  NPURT_RETURN_IF_ERROR(p.matmul(t("ffn_down"), hidden, ffn, p.g, p.f, cut.ffn_down));
  sum(p.f);
  s.add(p.norm, with({p.f, lb.post_ffw, p.f}, p.rows));
  s.add(p.add, with({p.h, p.f, p.h}, p.rows));
  return ok_status();
}

// The activations' names: lower case in the one-token decode step, capitals in the
// steps over rows.
void name_activations(LayerPlan& p, bool capitals) {
  const std::pair<std::string LayerPlan::*, const char*> names[] = {
      {&LayerPlan::h, "h"}, {&LayerPlan::x, "x"},       {&LayerPlan::q, "q"}, {&LayerPlan::k, "k"},
      {&LayerPlan::v, "v"}, {&LayerPlan::attn, "attn"}, {&LayerPlan::a, "a"}, {&LayerPlan::g, "g"},
      {&LayerPlan::u, "u"}, {&LayerPlan::f, "f"}};
  for (const auto& [member, lower] : names) {
    std::string name = lower;
    if (capitals) std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::toupper(ch); });
    p.*member = name;
  }
}

// The row-wise parts of a step over `rows` rows (the "rows" scalars say how many a call
// runs): the norms, RoPE (each row's angle from "positions" with `positions`, else from
// "pos" on), the adds and the gated GELU.
void set_row_ops(LayerPlan& p, const Gemma3Config& c, const Gemma3Shard& sh, uint32_t rows, bool positions) {
  const uint64_t hd = c.head_dim;
  p.norm = rmsnorm_rows(rows, c.hidden, c.rms_eps);
  p.norm_q = rmsnorm_rows(rows * sh.q_heads, hd, c.rms_eps);
  p.norm_k = rmsnorm_rows(rows * sh.kv_heads, hd, c.rms_eps);
  auto rope = [&](int32_t heads) {
    return std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(heads),
                                                       .head_dim = static_cast<uint32_t>(hd),
                                                       .tokens = rows,
                                                       .positions = positions});
  };
  p.rope_q = rope(sh.q_heads);
  p.rope_k = rope(sh.kv_heads);
  p.add = elementwise_rows(ops::ElementwiseKind::kAdd, rows, c.hidden);
  p.gelu_mul = elementwise_rows(ops::ElementwiseKind::kGeluTanhMul, rows, sh.ffn);
  p.rows = {kPrefillRows};
  p.q_rows = {kPrefillQRows};
  p.kv_rows = {kPrefillKvRows};
  p.rope = positions ? std::vector<std::string>{kPrefillRows, "positions"} : std::vector<std::string>{kPrefillRows};
}

// The projections of a step over `rows` rows (the "rows" scalar): matrix work
// (WeightGemm) with `gemm`, else the decode step's GEMV over a batch, bitwise the same
// per row as for one vector. `s` and `file` outlive the plan's use.
void set_row_matmul(LayerPlan& p, StepList& s, const GgufFile& file, uint32_t rows, bool gemm) {
  p.matmul = [&s, &file, rows, gemm](const std::string& name, uint64_t m, uint64_t k, const std::string& in,
                                     const std::string& out, TensorSlice slice) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    NPURT_RETURN_IF_ERROR(s.weight(file, name, m * k, slice).status());
    const OpPtr op = gemm ? OpPtr(std::make_shared<ops::WeightGemm>(ops::WeightGemmParams{
                                .m = m, .k = k, .rows = rows, .weight = t, .rows_runtime = true}))
                          : OpPtr(std::make_shared<ops::Gemv>(
                                ops::GemvParams{.m = m, .k = k, .weight = t, .batch = rows, .batch_runtime = true}));
    s.add(op, {name, in, out, kPrefillRows});
    return ok_status();
  };
}

// The LM head of a step over `rows` rows after its layers: every row's logits and
// argmax ("logits", rows x vocab; "next", rows), or with `last_only` those of row
// "last" alone, through the decode step's tail (a prompt's other rows need none).
Status add_lm_head(StepList& s, const GgufFile& file, const Gemma3Config& c, const Gemma3Shard& sh, uint32_t rows,
                   bool last_only, const std::shared_ptr<comm::Communicator>& comm) {
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  const std::string head_name(head->name);
  NPURT_ASSIGN_OR_RETURN(DType head_type, tensor_dtype(file, head_name));
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", c.hidden));
  NPURT_RETURN_IF_ERROR(s.weight(file, head_name, sh.vocab * c.hidden, vocab_slice(sh)).status());
  const auto dim = static_cast<uint32_t>(c.hidden);
  if (last_only) {
    s.size("h_last", c.hidden);
    s.size("x_last", c.hidden);
    s.add(std::make_shared<ops::StridedCopy>(
              ops::StridedCopyParams{.rows = 1, .cols = dim, .src_rows = rows, .src_row_runtime = true}),
          {"H", "h_last", kPrefillLast});
    s.add(rmsnorm(1, dim, c.rms_eps), {"h_last", out_norm, "x_last"});
    s.add(gemv(sh.vocab, c.hidden, head_type), {head_name, "x_last", "logits"});
    add_argmax(s, sh, comm);
    return ok_status();
  }
  s.size("logits", uint64_t{rows} * sh.vocab);
  s.size("next", rows);
  s.add(rmsnorm_rows(rows, c.hidden, c.rms_eps), {"H", out_norm, "X", kPrefillRows});
  s.add(std::make_shared<ops::Gemv>(ops::GemvParams{
            .m = sh.vocab, .k = static_cast<uint64_t>(c.hidden), .weight = head_type, .batch = rows, .batch_runtime = true}),
        {head_name, "X", "logits", kPrefillRows});
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = sh.vocab, .vectors = rows, .vectors_runtime = true}),
        {"logits", "next", kPrefillRows});
  return ok_status();
}

}  // namespace

StatusOr<ShardedStep> decode_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                  const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  NPURT_RETURN_IF_ERROR(check_kv_cache(o));
  const uint32_t ctx = context_of(c, o);
  const uint64_t hidden = c.hidden, hd = c.head_dim;
  const uint64_t kv_dim = sh.kv_heads * hd, ffn = sh.ffn;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  size_activations(s, c, sh, 1, /*capitals=*/false);

  LayerPlan p;
  name_activations(p, false);
  p.matmul = [&](const std::string& name, uint64_t m, uint64_t k, const std::string& in, const std::string& out,
                 TensorSlice slice) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    NPURT_RETURN_IF_ERROR(s.weight(file, name, m * k, slice).status());
    s.add(gemv(m, k, t), {name, in, out});
    return ok_status();
  };
  // Partial sums of a row-parallel projection, added over the devices.
  if (sh.parallel()) {
    p.sum_over_devices = [&](const std::string& name) {
      s.add(std::make_shared<comm::AllReduceStep>(comm, DType::kF32, hidden), {name});
    };
  }

  const std::string embd = "token_embd.weight";
  NPURT_ASSIGN_OR_RETURN(DType embd_type, tensor_dtype(file, embd));
  NPURT_RETURN_IF_ERROR(s.weight(file, embd, hidden * sh.vocab, vocab_slice(sh)).status());
  s.add(embedding(c, sh, embd_type, 0), {embd, "token", "h"});
  if (p.sum_over_devices) p.sum_over_devices("h");

  const auto norm_hidden = rmsnorm(1, dim, c.rms_eps);
  p.norm = norm_hidden;
  // The heads' norms on one block, as the RoPE and cache appends after them: a few
  // hundred values each, and a chain of one-block steps shares one phase.
  p.norm_q = rmsnorm(sh.q_heads, static_cast<uint32_t>(hd), c.rms_eps, 1);
  p.norm_k = rmsnorm(sh.kv_heads, static_cast<uint32_t>(hd), c.rms_eps, 1);
  p.rope_q = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(sh.q_heads),
                                                         .head_dim = static_cast<uint32_t>(hd)});
  p.rope_k = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(sh.kv_heads),
                                                         .head_dim = static_cast<uint32_t>(hd)});
  p.append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{
      .rows = 1, .cols = static_cast<uint32_t>(kv_dim), .dst_rows = ctx, .dst_row_runtime = true,
      .dst_dtype = o.kv_cache});
  p.append_args = {"pos"};
  p.add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = hidden});
  p.gelu_mul =
      std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kGeluTanhMul, .n = ffn});
  const auto attend_global = decode_attention(c, o, sh, ctx, true, 0);
  p.attend_local = decode_attention(c, o, sh, ctx, false, 0);
  p.attend_global = attend_global;
  const std::string partials = bind_partials(s, *attend_global, "attn_partials");
  p.attend = [&](const std::string& q, const std::string& kc, const std::string& vc, const std::string& out) {
    return std::vector<std::string>{q, kc, vc, out, "len", partials};
  };

  for (int32_t l = 0; l < c.n_layers; ++l) {
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, ctx, l, s));
    NPURT_RETURN_IF_ERROR(add_layer(s, c, sh, cut, l, lb, p));
  }
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  s.add(norm_hidden, {"h", out_norm, "x"});
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_RETURN_IF_ERROR(p.matmul(std::string(head->name), sh.vocab, hidden, "x", "logits", vocab_slice(sh)));
  add_argmax(s, sh, comm);
  return s.finish(o);
}

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
  const uint64_t kv_dim = sh.kv_heads * hd;
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  s.size("tokens", T);
  size_activations(s, c, sh, T, /*capitals=*/true);

  LayerPlan p;
  name_activations(p, true);
  // Verification runs the decode step's GEMV over a batch, bitwise the same per token.
  set_row_matmul(p, s, file, T, /*gemm=*/!verify);
  // The partial sums of the call's rows, added over the devices.
  if (sh.parallel()) {
    p.sum_over_devices = [&](const std::string& name) {
      s.add(std::make_shared<comm::AllReduceStep>(comm, DType::kF32, T * hidden, hidden), {name, kPrefillRows});
    };
  }
  NPURT_RETURN_IF_ERROR(add_embedding_rows(file, c, sh, T, s));
  if (p.sum_over_devices) p.sum_over_devices("H");

  set_row_ops(p, c, sh, T, /*positions=*/false);
  p.append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{.rows = T,
                                                                       .cols = static_cast<uint32_t>(kv_dim),
                                                                       .dst_rows = ctx,
                                                                       .dst_row_runtime = true,
                                                                       .rows_runtime = true,
                                                                       .dst_dtype = o.kv_cache});
  p.append_args = {"pos", kPrefillRows};
  auto attention = [&](bool global) -> OpPtr {
    if (verify) return decode_attention(c, o, sh, ctx, global, T);
    return std::make_shared<ops::PrefillAttention>(ops::PrefillAttentionParams{
        .n_heads = static_cast<uint32_t>(sh.q_heads),
        .n_kv_heads = static_cast<uint32_t>(sh.kv_heads),
        .head_dim = static_cast<uint32_t>(hd),
        .max_len = ctx,
        .tokens = T,
        .window = global || hazard_on(Hazard::kPrefillIgnoresWindow) ? 0u : static_cast<uint32_t>(c.sliding_window),
        .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
        .kv_dtype = o.kv_cache});
  };
  p.attend_local = attention(false);
  p.attend_global = attention(true);
  std::vector<std::string> verify_partials;  // the split verify attention's workspace
  if (verify) verify_partials = {bind_partials(s, *decode_attention(c, o, sh, ctx, true, T), "ATTN_PARTIALS")};
  p.attend = [&](const std::string& q, const std::string& kc, const std::string& vc, const std::string& out) {
    return with({q, kc, vc, out, verify ? "len" : "pos", kPrefillRows}, verify_partials);
  };

  for (int32_t l = 0; l < c.n_layers; ++l) {
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, ctx, l, s));
    NPURT_RETURN_IF_ERROR(add_layer(s, c, sh, cut, l, lb, p));
  }
  NPURT_RETURN_IF_ERROR(add_lm_head(s, file, c, sh, T, !verify, comm));
  return verify ? s.finish(o, "gemma3_verify", {"tokens"}) : s.finish(o, "gemma3_prefill", {"tokens"});
}

StatusOr<ShardedStep> prefill_chunk(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                    const Gemma3Shard& sh, const std::shared_ptr<comm::Communicator>& comm) {
  return batched_step(file, c, o, sh, comm, Batched::kPrefill);
}

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
StatusOr<ShardedStep> paged_step(const GgufFile& file, const Gemma3Config& c, const Gemma3Options& o,
                                 const Gemma3Shard& sh, Paged kind) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  NPURT_RETURN_IF_ERROR(check_kv_cache(o));
  NPURT_ASSIGN_OR_RETURN(const PoolShape pool, pool_shape(c, o));
  const bool prefill = kind == Paged::kPrefill;
  const uint32_t B = prefill ? paged_prefill_rows(c, o, pool) : o.batch_sequences;
  if (B == 0) return invalid_argument("gemma3: a paged step of 0 rows builds no sequence");
  const uint64_t hd = c.head_dim;
  const uint64_t kv_dim = sh.kv_heads * hd;
  const uint64_t pool_rows = uint64_t{pool.blocks} * pool.block_positions;
  const LayerSlices cut = layer_slices(c, sh);
  StepList s;
  for (const char* input : {"tokens", "positions", "lens", "kv_rows"}) s.size(input, B);
  s.size("tables", uint64_t{B} * pool.max_blocks);
  size_activations(s, c, sh, B, /*capitals=*/true);

  LayerPlan p;
  name_activations(p, true);
  set_row_matmul(p, s, file, B, /*gemm=*/prefill);
  NPURT_RETURN_IF_ERROR(add_embedding_rows(file, c, sh, B, s));

  set_row_ops(p, c, sh, B, /*positions=*/true);
  p.append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{.rows = B,
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
  p.attend_local = attention(false);
  p.attend_global = attention(true);
  p.append_args = {kPrefillRows, "kv_rows"};
  p.attend = [](const std::string& q, const std::string& kc, const std::string& vc, const std::string& out) {
    return std::vector<std::string>{q, kc, vc, "tables", "lens", out, kPrefillRows};
  };

  for (int32_t l = 0; l < c.n_layers; ++l) {
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, sh, pool_rows, l, s, /*paged=*/true));
    NPURT_RETURN_IF_ERROR(add_layer(s, c, sh, cut, l, lb, p));
  }
  NPURT_RETURN_IF_ERROR(add_lm_head(s, file, c, sh, B, prefill, nullptr));
  const std::vector<std::string> inputs{"tokens", "positions", "lens", "tables", "kv_rows"};
  return s.finish(o, prefill ? "gemma3_paged_prefill" : "gemma3_batch", inputs);
}

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

}  // namespace npurt::models
