#include "npurt/models/gemma3_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "npurt/hal/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/gemv.h"
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

// Steps and buffer sizes of the decode step, built in order.
class StepList {
 public:
  void add(OpPtr op, std::vector<std::string> bindings) { steps_.push_back({std::move(op), std::move(bindings)}); }
  void size(const std::string& name, uint64_t elements) { sizes_[name] = elements; }
  // A weight's binding: its tensor name (which must be in the file), sized.
  StatusOr<std::string> weight(const GgufFile& file, const std::string& name, uint64_t elements) {
    NPURT_RETURN_IF_ERROR(tensor_dtype(file, name).status());
    sizes_[name] = elements;
    return name;
  }
  graph::OperatorSequence finish(const Gemma3Options& o, std::string name = "gemma3_step",
                                 std::vector<std::string> inputs = {}) {
    return graph::OperatorSequence(std::move(name), std::move(steps_), std::move(inputs), {"next"}, std::move(sizes_),
                                   o.dispatch);
  }

 private:
  std::vector<graph::SequenceStep> steps_;
  std::map<std::string, uint64_t> sizes_;
};

// The attention operators need key and value heads of one width.
Status check_head_dims(const Gemma3Config& c) {
  if (c.value_dim == c.head_dim) return Status();
  return invalid_argument("gemma3: value_length " + std::to_string(c.value_dim) + " differs from key_length " +
                          std::to_string(c.head_dim) + "; the attention operators need them equal");
}

// A step's activations for `rows` tokens (the prefill chunk names them in capitals),
// its logits and its next token.
void size_activations(StepList& s, const Gemma3Config& c, uint64_t rows, bool capitals) {
  const uint64_t hidden = c.hidden, ffn = c.ffn, q_dim = static_cast<uint64_t>(c.n_heads) * c.head_dim,
                 kv_dim = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim;
  const std::pair<const char*, uint64_t> widths[] = {{"h", hidden}, {"x", hidden}, {"a", hidden}, {"f", hidden},
                                                     {"q", q_dim},  {"attn", q_dim}, {"k", kv_dim}, {"v", kv_dim},
                                                     {"g", ffn},    {"u", ffn}};
  for (const auto& [lower, width] : widths) {
    std::string name = lower;
    if (capitals) std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::toupper(ch); });
    s.size(name, rows * width);
  }
  s.size("logits", static_cast<uint64_t>(c.vocab));
  s.size("next", 1);
}

std::shared_ptr<ops::Gemv> gemv(uint64_t m, uint64_t k, DType weight) {
  return std::make_shared<ops::Gemv>(ops::GemvParams{.m = m, .k = k, .weight = weight});
}

std::shared_ptr<ops::RmsNorm> rmsnorm(uint64_t rows, uint32_t dim, float eps) {
  return std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = rows, .dim = dim, .eps = eps});
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

StatusOr<LayerBindings> bind_layer(const GgufFile& file, const Gemma3Config& c, uint32_t ctx, int32_t l, StepList& s) {
  auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
  const uint64_t hidden = c.hidden, hd = c.head_dim, kv_dim = uint64_t(c.n_kv_heads) * hd;
  LayerBindings b;
  b.kc = "k_cache." + std::to_string(l);
  b.vc = "v_cache." + std::to_string(l);
  s.size(b.kc, ctx * kv_dim);
  s.size(b.vc, ctx * kv_dim);
  NPURT_ASSIGN_OR_RETURN(b.attn_norm, s.weight(file, t("attn_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.q_norm, s.weight(file, t("attn_q_norm"), hd));
  NPURT_ASSIGN_OR_RETURN(b.k_norm, s.weight(file, t("attn_k_norm"), hd));
  NPURT_ASSIGN_OR_RETURN(b.post_attn, s.weight(file, t("post_attention_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.ffn_norm, s.weight(file, t("ffn_norm"), hidden));
  NPURT_ASSIGN_OR_RETURN(b.post_ffw, s.weight(file, t("post_ffw_norm"), hidden));
  b.rope_base = c.is_global(l) ? kRopeGlobal : kRopeLocal;
  return b;
}

}  // namespace

StatusOr<graph::OperatorSequence> gemma3_decode_step(const GgufFile& file, const Gemma3Config& c,
                                                     const Gemma3Options& o) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  const uint32_t ctx = context_of(c, o);
  const uint64_t hidden = c.hidden, ffn = c.ffn, hd = c.head_dim;
  const uint64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  StepList s;
  size_activations(s, c, 1, /*capitals=*/false);

  auto matvec = [&](const std::string& name, uint64_t m, uint64_t k, std::string in, std::string out) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    s.size(name, m * k);
    s.add(gemv(m, k, t), {name, std::move(in), std::move(out)});
    return Status();
  };

  const std::string embd = "token_embd.weight";
  NPURT_ASSIGN_OR_RETURN(DType embd_type, tensor_dtype(file, embd));
  s.size(embd, hidden * c.vocab);
  s.add(std::make_shared<ops::Embedding>(ops::EmbeddingParams{.vocab = static_cast<uint64_t>(c.vocab),
                                                              .dim = dim,
                                                              .dtype = embd_type,
                                                              .scale = std::sqrt(static_cast<float>(hidden))}),
        {embd, "token", "h"});

  const auto norm_hidden = rmsnorm(1, dim, c.rms_eps);
  const auto norm_q = rmsnorm(c.n_heads, static_cast<uint32_t>(hd), c.rms_eps);
  const auto norm_k = rmsnorm(c.n_kv_heads, static_cast<uint32_t>(hd), c.rms_eps);
  const auto rope_q = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(c.n_heads),
                                                                   .head_dim = static_cast<uint32_t>(hd)});
  const auto rope_k = std::make_shared<ops::Rope>(ops::RopeParams{.n_heads = static_cast<uint32_t>(c.n_kv_heads),
                                                                   .head_dim = static_cast<uint32_t>(hd)});
  const auto append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{
      .rows = 1, .cols = static_cast<uint32_t>(kv_dim), .dst_rows = ctx, .dst_row_runtime = true});
  const auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = hidden});
  const auto gelu_mul =
      std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kGeluTanhMul, .n = ffn});
  auto attention = [&](bool global) {
    return std::make_shared<ops::DecodeAttention>(ops::DecodeAttentionParams{
        .n_heads = static_cast<uint32_t>(c.n_heads),
        .n_kv_heads = static_cast<uint32_t>(c.n_kv_heads),
        .head_dim = static_cast<uint32_t>(hd),
        .max_len = ctx,
        .window = global ? 0u : static_cast<uint32_t>(c.sliding_window),
        .scale = 1.0f / std::sqrt(static_cast<float>(hd))});
  };
  const OpPtr attend_local = attention(false), attend_global = attention(true);

  for (int32_t l = 0; l < c.n_layers; ++l) {
    auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
    const bool global = c.is_global(l);
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, ctx, l, s));

    s.add(norm_hidden, {"h", lb.attn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_q"), q_dim, hidden, "x", "q"));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_k"), kv_dim, hidden, "x", "k"));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_v"), kv_dim, hidden, "x", "v"));
    s.add(norm_q, {"q", lb.q_norm, "q"});
    s.add(norm_k, {"k", lb.k_norm, "k"});
    s.add(rope_q, {"q", "q", "pos", lb.rope_base});
    s.add(rope_k, {"k", "k", "pos", lb.rope_base});
    s.add(append, {"k", lb.kc, "pos"});
    s.add(append, {"v", lb.vc, "pos"});
    s.add(global ? attend_global : attend_local, {"q", lb.kc, lb.vc, "attn", "len"});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_output"), hidden, q_dim, "attn", "a"));
    s.add(norm_hidden, {"a", lb.post_attn, "a"});
    s.add(add, {"h", "a", "h"});

    s.add(norm_hidden, {"h", lb.ffn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_gate"), ffn, hidden, "x", "g"));
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_up"), ffn, hidden, "x", "u"));
    s.add(gelu_mul, {"g", "u", "g"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_down"), hidden, ffn, "g", "f"));
    s.add(norm_hidden, {"f", lb.post_ffw, "f"});
    s.add(add, {"h", "f", "h"});
  }
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  s.add(norm_hidden, {"h", out_norm, "x"});
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_RETURN_IF_ERROR(matvec(std::string(head->name), static_cast<uint64_t>(c.vocab), hidden, "x", "logits"));
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = static_cast<uint64_t>(c.vocab)}), {"logits", "next"});
  return s.finish(o);
}

StatusOr<graph::OperatorSequence> gemma3_prefill_chunk(const GgufFile& file, const Gemma3Config& c,
                                                       const Gemma3Options& o) {
  NPURT_RETURN_IF_ERROR(check_head_dims(c));
  const uint32_t ctx = context_of(c, o);
  const uint32_t T = std::min(o.prefill_chunk, ctx);
  if (T == 0) return invalid_argument("gemma3: prefill_chunk 0 builds no prefill sequence");
  const uint64_t hidden = c.hidden, ffn = c.ffn, hd = c.head_dim;
  const uint64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  StepList s;
  s.size("tokens", T);
  size_activations(s, c, T, /*capitals=*/true);
  s.size("h_last", hidden);
  s.size("x_last", hidden);

  auto matmul = [&](const std::string& name, uint64_t m, uint64_t k, std::string in, std::string out) -> Status {
    NPURT_ASSIGN_OR_RETURN(DType t, tensor_dtype(file, name));
    s.size(name, m * k);
    s.add(std::make_shared<ops::WeightGemm>(
              ops::WeightGemmParams{.m = m, .k = k, .rows = T, .weight = t, .rows_runtime = true}),
          {name, std::move(in), std::move(out), kPrefillRows});
    return Status();
  };
  auto rms = [&](uint64_t rows, uint64_t d) {
    return std::make_shared<ops::RmsNorm>(ops::RmsNormParams{
        .rows = rows, .dim = static_cast<uint32_t>(d), .eps = c.rms_eps, .rows_runtime = true});
  };
  auto rowwise = [&](ops::ElementwiseKind kind, uint64_t row) {
    return std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = kind, .n = T * row, .row_elems = row});
  };

  const std::string embd = "token_embd.weight";
  NPURT_ASSIGN_OR_RETURN(DType embd_type, tensor_dtype(file, embd));
  s.size(embd, hidden * c.vocab);
  s.add(std::make_shared<ops::Embedding>(ops::EmbeddingParams{.vocab = static_cast<uint64_t>(c.vocab),
                                                              .dim = dim,
                                                              .dtype = embd_type,
                                                              .scale = std::sqrt(static_cast<float>(hidden)),
                                                              .tokens = T}),
        {embd, "tokens", "H", kPrefillRows});

  const auto norm_rows = rms(T, hidden);
  const auto norm_q = rms(T * c.n_heads, hd), norm_k = rms(T * c.n_kv_heads, hd);
  auto rope = [&](int32_t heads) {
    return std::make_shared<ops::Rope>(
        ops::RopeParams{.n_heads = static_cast<uint32_t>(heads), .head_dim = static_cast<uint32_t>(hd), .tokens = T});
  };
  const auto rope_q = rope(c.n_heads), rope_k = rope(c.n_kv_heads);
  const auto append = std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{.rows = T,
                                                                                .cols = static_cast<uint32_t>(kv_dim),
                                                                                .dst_rows = ctx,
                                                                                .dst_row_runtime = true,
                                                                                .rows_runtime = true});
  const auto add = rowwise(ops::ElementwiseKind::kAdd, hidden);
  const auto gelu_mul = rowwise(ops::ElementwiseKind::kGeluTanhMul, ffn);
  auto attention = [&](bool global) {
    return std::make_shared<ops::PrefillAttention>(ops::PrefillAttentionParams{
        .n_heads = static_cast<uint32_t>(c.n_heads),
        .n_kv_heads = static_cast<uint32_t>(c.n_kv_heads),
        .head_dim = static_cast<uint32_t>(hd),
        .max_len = ctx,
        .tokens = T,
        .window = global || o.prefill_ignores_window_for_test ? 0u : static_cast<uint32_t>(c.sliding_window),
        .scale = 1.0f / std::sqrt(static_cast<float>(hd))});
  };
  const OpPtr attend_local = attention(false), attend_global = attention(true);

  for (int32_t l = 0; l < c.n_layers; ++l) {
    auto t = [&](const char* what) { return gemma3_block_tensor(l, what); };
    const bool global = c.is_global(l);
    NPURT_ASSIGN_OR_RETURN(const LayerBindings lb, bind_layer(file, c, ctx, l, s));

    s.add(norm_rows, {"H", lb.attn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("attn_q"), q_dim, hidden, "X", "Q"));
    NPURT_RETURN_IF_ERROR(matmul(t("attn_k"), kv_dim, hidden, "X", "K"));
    NPURT_RETURN_IF_ERROR(matmul(t("attn_v"), kv_dim, hidden, "X", "V"));
    s.add(norm_q, {"Q", lb.q_norm, "Q", kPrefillQRows});
    s.add(norm_k, {"K", lb.k_norm, "K", kPrefillKvRows});
    s.add(rope_q, {"Q", "Q", "pos", lb.rope_base, kPrefillRows});
    s.add(rope_k, {"K", "K", "pos", lb.rope_base, kPrefillRows});
    s.add(append, {"K", lb.kc, "pos", kPrefillRows});
    s.add(append, {"V", lb.vc, "pos", kPrefillRows});
    s.add(global ? attend_global : attend_local, {"Q", lb.kc, lb.vc, "ATTN", "pos", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("attn_output"), hidden, q_dim, "ATTN", "A"));
    s.add(norm_rows, {"A", lb.post_attn, "A", kPrefillRows});
    s.add(add, {"H", "A", "H", kPrefillRows});

    s.add(norm_rows, {"H", lb.ffn_norm, "X", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_gate"), ffn, hidden, "X", "G"));
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_up"), ffn, hidden, "X", "U"));
    s.add(gelu_mul, {"G", "U", "G", kPrefillRows});
    NPURT_RETURN_IF_ERROR(matmul(t("ffn_down"), hidden, ffn, "G", "F"));
    s.add(norm_rows, {"F", lb.post_ffw, "F", kPrefillRows});
    s.add(add, {"H", "F", "H", kPrefillRows});
  }
  // Only the last token's logits are needed: its row of H through the decode step's tail.
  s.add(std::make_shared<ops::StridedCopy>(
            ops::StridedCopyParams{.rows = 1, .cols = dim, .src_rows = T, .src_row_runtime = true}),
        {"H", "h_last", kPrefillLast});
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, s.weight(file, "output_norm.weight", hidden));
  s.add(rmsnorm(1, dim, c.rms_eps), {"h_last", out_norm, "x_last"});
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return not_found("gemma3: no output.weight or token_embd.weight");
  NPURT_ASSIGN_OR_RETURN(DType head_type, tensor_dtype(file, std::string(head->name)));
  s.size(std::string(head->name), static_cast<uint64_t>(c.vocab) * hidden);
  s.add(gemv(static_cast<uint64_t>(c.vocab), hidden, head_type), {std::string(head->name), "x_last", "logits"});
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = static_cast<uint64_t>(c.vocab)}), {"logits", "next"});
  return s.finish(o, "gemma3_prefill", {"tokens"});
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load(const GgufFile& file, Runtime& runtime,
                                                          const Gemma3Options& options, const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config config, Gemma3Config::from_gguf(file));
  NPURT_RETURN_IF_ERROR(validate_gemma3_tensors(file, config));
  NPURT_ASSIGN_OR_RETURN(graph::OperatorSequence step, gemma3_decode_step(file, config, options));
  auto model = std::unique_ptr<Gemma3Model>(new Gemma3Model());
  model->runtime_ = runtime.shared_from_this();
  model->config_ = config;
  model->max_context_ = context_of(config, options);
  MemoryContext& memory = runtime.memory();
  NPURT_ASSIGN_OR_RETURN(model->seq_, step.compile(runtime));
  NPURT_ASSIGN_OR_RETURN(model->next_, model->seq_->get_buffer("next"));
  NPURT_ASSIGN_OR_RETURN(model->logits_, model->seq_->get_buffer("logits"));
  if (options.prefill_chunk > 0) {
    // The prefill sequence binds the decode step's weights and caches, not copies.
    NPURT_ASSIGN_OR_RETURN(graph::OperatorSequence chunk, gemma3_prefill_chunk(file, config, options));
    graph::CompileOptions co;
    for (const graph::BufferPlacement& p : model->seq_->placements()) {
      if (p.intermediate) continue;
      if (file.tensor(p.name) != nullptr || p.name.starts_with("k_cache.") || p.name.starts_with("v_cache.")) {
        NPURT_ASSIGN_OR_RETURN(co.shared[p.name], model->seq_->get_buffer(p.name));
      }
    }
    NPURT_ASSIGN_OR_RETURN(model->prefill_, chunk.compile(runtime, co));
    NPURT_ASSIGN_OR_RETURN(model->prefill_tokens_, model->prefill_->get_buffer("tokens"));
    NPURT_ASSIGN_OR_RETURN(model->prefill_next_, model->prefill_->get_buffer("next"));
    NPURT_ASSIGN_OR_RETURN(model->prefill_logits_, model->prefill_->get_buffer("logits"));
    model->max_chunk_ = std::min(options.prefill_chunk, model->max_context_);
    model->chunk_ = model->max_chunk_;
  }

  // Every bound tensor, copied once in its stored bytes (norms as f32) and pushed to
  // the device, so the first step moves no weight.
  std::vector<const GgufTensor*> tensors;
  uint64_t total = 0;
  for (const graph::BufferPlacement& p : model->seq_->placements()) {
    const GgufTensor* t = file.tensor(p.name);
    if (t == nullptr) continue;
    tensors.push_back(t);
    total += p.bytes;
  }
  uint64_t done = 0;
  for (const GgufTensor* t : tensors) {
    NPURT_ASSIGN_OR_RETURN(View v, model->seq_->get_buffer(t->name));
    {
      NPURT_ASSIGN_OR_RETURN(WriteGuard g, memory.overwrite(v));
      const std::span<uint8_t> dst = g.bytes();
      if (is_norm(std::string(t->name)) && t->dtype != DType::kF32) {
        const std::vector<float> f = isa::to_f32(t->data, t->dtype);
        if (f.size() * sizeof(float) != dst.size()) return internal_error("gemma3: norm size mismatch");
        std::memcpy(dst.data(), f.data(), dst.size());
      } else {
        if (t->data.size() != dst.size()) {
          return invalid_argument("gemma3: tensor '" + std::string(t->name) + "' holds " +
                                                          std::to_string(t->data.size()) + " bytes, the step binds " +
                                                          std::to_string(dst.size()));
        }
        std::memcpy(dst.data(), t->data.data(), dst.size());
      }
    }
    NPURT_RETURN_IF_ERROR(memory.to_device(v));
    model->weight_bytes_per_step_ += v.size();
    done += v.size();
    if (progress) progress(done, total);
  }
  // The embedding reads one row of its table: with a separate LM head the table's
  // other rows are not read by a step (a tied table is, by the LM head).
  if (const GgufTensor* e = file.tensor("token_embd.weight"); e != gemma3_output_weight(file)) {
    model->weight_bytes_per_step_ -= e->data.size() - e->data.size() / static_cast<uint64_t>(config.vocab);
  }
  return model;
}

Status Gemma3Model::reset() {
  position_ = 0;
  return Status();
}

StatusOr<int32_t> Gemma3Model::step(int32_t token) {
  if (token < 0 || token >= config_.vocab) {
    return invalid_argument(                  "gemma3: token " + std::to_string(token) + " is outside [0, " + std::to_string(config_.vocab) + ")");
  }
  if (position_ >= static_cast<int32_t>(max_context_)) {
    return out_of_range(                  "gemma3: the context is full (" + std::to_string(max_context_) + " positions); reset() first");
  }
  const graph::Scalars scalars{{"token", int64_t{token}},
                               {"pos", int64_t{position_}},
                               {"len", int64_t{position_} + 1},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(seq_->call(scalars));
  ++position_;
  last_logits_ = &logits_;
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, runtime_->memory().read(next_));
  int32_t next = 0;
  std::memcpy(&next, g.bytes().data(), sizeof next);
  return next;
}

Status Gemma3Model::set_prefill_chunk(uint32_t chunk) {
  if (chunk > max_chunk_) {
    return invalid_argument("gemma3: prefill chunk " + std::to_string(chunk) +
                                                    " is above the compiled maximum " + std::to_string(max_chunk_) +
                                                    " (0: token by token)");
  }
  chunk_ = chunk;
  return Status();
}

StatusOr<int32_t> Gemma3Model::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("gemma3: prefill of an empty prompt");
  if (position_ + tokens.size() > max_context_) {
    return out_of_range("gemma3: " + std::to_string(tokens.size()) + " prompt tokens at position " +
                                               std::to_string(position_) + " do not fit the context of " +
                                               std::to_string(max_context_) + " positions");
  }
  for (int32_t token : tokens) {
    if (token < 0 || token >= config_.vocab) {
      return invalid_argument("gemma3: prompt token " + std::to_string(token) +
                                                      " is outside [0, " + std::to_string(config_.vocab) + ")");
    }
  }
  if (chunk_ == 0) return TokenModel::prefill(tokens);
  int32_t next = 0;
  for (size_t i = 0; i < tokens.size(); i += chunk_) {
    NPURT_ASSIGN_OR_RETURN(next, prefill_chunk_call(tokens.subspan(i, std::min<size_t>(chunk_, tokens.size() - i))));
  }
  return next;
}

StatusOr<int32_t> Gemma3Model::prefill_chunk_call(std::span<const int32_t> tokens) {
  {
    NPURT_ASSIGN_OR_RETURN(View ids, prefill_tokens_.subview(0, tokens.size() * sizeof(int32_t)));
    NPURT_ASSIGN_OR_RETURN(WriteGuard g, runtime_->memory().overwrite(ids));
    std::memcpy(g.bytes().data(), tokens.data(), tokens.size_bytes());
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const graph::Scalars scalars{{kPrefillRows, n},
                               {kPrefillQRows, n * config_.n_heads},
                               {kPrefillKvRows, n * config_.n_kv_heads},
                               {kPrefillLast, n - 1},
                               {"pos", int64_t{position_}},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(prefill_->call(scalars));
  position_ += static_cast<int32_t>(n);
  last_logits_ = &prefill_logits_;
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, runtime_->memory().read(prefill_next_));
  int32_t next = 0;
  std::memcpy(&next, g.bytes().data(), sizeof next);
  return next;
}

StatusOr<std::vector<float>> Gemma3Model::logits() const {
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, runtime_->memory().read(*last_logits_));
  std::vector<float> out(g.bytes().size() / sizeof(float));
  std::memcpy(out.data(), g.bytes().data(), out.size() * sizeof(float));
  return out;
}

StatusOr<hal::SimOptions> gemma3_sim_options(const GgufFile& file, uint32_t cores, const Gemma3Options& options) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config c, Gemma3Config::from_gguf(file));
  // Weights take at most the file's bytes, the f32 KV cache 2 x 4 bytes per layer,
  // position and kv dim; the rest is intermediates and code. GM pages are reserved
  // lazily, so the margin costs nothing.
  const uint64_t kv = uint64_t{context_of(c, options)} * c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4;
  hal::SimOptions o;
  o.num_cores = cores;
  o.global_memory_bytes = (file.bytes().size() + kv + (256ull << 20) + 4095) / 4096 * 4096;
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
