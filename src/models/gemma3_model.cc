#include "npurt/models/gemma3_model.h"

#include <algorithm>
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
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"

namespace npurt::models {
namespace {

using isa::DType;
using OpPtr = std::shared_ptr<const ops::Operator>;

constexpr const char* kRopeLocal = "rope_local";
constexpr const char* kRopeGlobal = "rope_global";

StatusOr<DType> tensor_dtype(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.tensor(name);
  if (t == nullptr) return Status(StatusCode::kNotFound, "gemma3: no tensor '" + name + "'");
  return t->dtype;
}

// Norm weights are bound as f32 whatever the file stores (they are converted on load).
bool is_norm(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

// Steps and buffer sizes of the decode step, built in order.
class StepList {
 public:
  void add(OpPtr op, std::vector<std::string> bindings) { steps_.push_back({std::move(op), std::move(bindings)}); }
  void size(const std::string& name, uint64_t elements) { sizes_[name] = elements; }
  graph::OperatorSequence finish(const Gemma3Options& o) {
    return graph::OperatorSequence("gemma3_step", std::move(steps_), {}, {"next"}, std::move(sizes_), o.dispatch);
  }

 private:
  std::vector<graph::SequenceStep> steps_;
  std::map<std::string, uint64_t> sizes_;
};

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

}  // namespace

StatusOr<graph::OperatorSequence> gemma3_decode_step(const GgufFile& file, const Gemma3Config& c,
                                                     const Gemma3Options& o) {
  if (c.value_dim != c.head_dim) {
    return Status(StatusCode::kInvalidArgument, "gemma3: value_length " + std::to_string(c.value_dim) +
                                                    " differs from key_length " + std::to_string(c.head_dim) +
                                                    "; the attention operator needs them equal");
  }
  const uint32_t ctx = context_of(c, o);
  const uint64_t hidden = c.hidden, ffn = c.ffn, hd = c.head_dim;
  const uint64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const uint32_t dim = static_cast<uint32_t>(hidden);
  StepList s;
  for (const char* n : {"h", "x", "a", "f"}) s.size(n, hidden);
  s.size("q", q_dim);
  s.size("attn", q_dim);
  s.size("k", kv_dim);
  s.size("v", kv_dim);
  s.size("g", ffn);
  s.size("u", ffn);
  s.size("logits", static_cast<uint64_t>(c.vocab));
  s.size("next", 1);

  // A weight's binding: its tensor name, sized from the config.
  auto weight = [&](const std::string& name, uint64_t elements) -> StatusOr<std::string> {
    NPURT_RETURN_IF_ERROR(tensor_dtype(file, name).status());
    s.size(name, elements);
    return name;
  };
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
    const std::string kc = "k_cache." + std::to_string(l), vc = "v_cache." + std::to_string(l);
    s.size(kc, ctx * kv_dim);
    s.size(vc, ctx * kv_dim);
    NPURT_ASSIGN_OR_RETURN(std::string attn_norm, weight(t("attn_norm"), hidden));
    NPURT_ASSIGN_OR_RETURN(std::string q_norm, weight(t("attn_q_norm"), hd));
    NPURT_ASSIGN_OR_RETURN(std::string k_norm, weight(t("attn_k_norm"), hd));
    NPURT_ASSIGN_OR_RETURN(std::string post_attn, weight(t("post_attention_norm"), hidden));
    NPURT_ASSIGN_OR_RETURN(std::string ffn_norm, weight(t("ffn_norm"), hidden));
    NPURT_ASSIGN_OR_RETURN(std::string post_ffw, weight(t("post_ffw_norm"), hidden));
    const char* base = global ? kRopeGlobal : kRopeLocal;

    s.add(norm_hidden, {"h", attn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_q"), q_dim, hidden, "x", "q"));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_k"), kv_dim, hidden, "x", "k"));
    NPURT_RETURN_IF_ERROR(matvec(t("attn_v"), kv_dim, hidden, "x", "v"));
    s.add(norm_q, {"q", q_norm, "q"});
    s.add(norm_k, {"k", k_norm, "k"});
    s.add(rope_q, {"q", "q", "pos", base});
    s.add(rope_k, {"k", "k", "pos", base});
    s.add(append, {"k", kc, "pos"});
    s.add(append, {"v", vc, "pos"});
    s.add(global ? attend_global : attend_local, {"q", kc, vc, "attn", "len"});
    NPURT_RETURN_IF_ERROR(matvec(t("attn_output"), hidden, q_dim, "attn", "a"));
    s.add(norm_hidden, {"a", post_attn, "a"});
    s.add(add, {"h", "a", "h"});

    s.add(norm_hidden, {"h", ffn_norm, "x"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_gate"), ffn, hidden, "x", "g"));
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_up"), ffn, hidden, "x", "u"));
    s.add(gelu_mul, {"g", "u", "g"});
    NPURT_RETURN_IF_ERROR(matvec(t("ffn_down"), hidden, ffn, "g", "f"));
    s.add(norm_hidden, {"f", post_ffw, "f"});
    s.add(add, {"h", "f", "h"});
  }
  NPURT_ASSIGN_OR_RETURN(std::string out_norm, weight("output_norm.weight", hidden));
  s.add(norm_hidden, {"h", out_norm, "x"});
  const GgufTensor* head = gemma3_output_weight(file);
  if (head == nullptr) return Status(StatusCode::kNotFound, "gemma3: no output.weight or token_embd.weight");
  NPURT_RETURN_IF_ERROR(matvec(std::string(head->name), static_cast<uint64_t>(c.vocab), hidden, "x", "logits"));
  s.add(std::make_shared<ops::Argmax>(ops::ArgmaxParams{.n = static_cast<uint64_t>(c.vocab)}), {"logits", "next"});
  return s.finish(o);
}

StatusOr<std::unique_ptr<Gemma3Model>> Gemma3Model::load(const GgufFile& file, MemoryContext& memory,
                                                          exec::CodeRegistry& registry, const Gemma3Options& options,
                                                          const Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config config, Gemma3Config::from_gguf(file));
  NPURT_RETURN_IF_ERROR(validate_gemma3_tensors(file, config));
  NPURT_ASSIGN_OR_RETURN(graph::OperatorSequence step, gemma3_decode_step(file, config, options));
  auto model = std::unique_ptr<Gemma3Model>(new Gemma3Model());
  model->memory_ = &memory;
  model->config_ = config;
  model->max_context_ = context_of(config, options);
  NPURT_ASSIGN_OR_RETURN(model->seq_, step.compile(memory, registry));
  NPURT_ASSIGN_OR_RETURN(model->next_, model->seq_->get_buffer("next"));
  NPURT_ASSIGN_OR_RETURN(model->logits_, model->seq_->get_buffer("logits"));

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
        if (f.size() * sizeof(float) != dst.size()) return Status(StatusCode::kInternal, "gemma3: norm size mismatch");
        std::memcpy(dst.data(), f.data(), dst.size());
      } else {
        if (t->data.size() != dst.size()) {
          return Status(StatusCode::kInvalidArgument, "gemma3: tensor '" + std::string(t->name) + "' holds " +
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
    return Status(StatusCode::kInvalidArgument,
                  "gemma3: token " + std::to_string(token) + " is outside [0, " + std::to_string(config_.vocab) + ")");
  }
  if (position_ >= static_cast<int32_t>(max_context_)) {
    return Status(StatusCode::kOutOfRange,
                  "gemma3: the context is full (" + std::to_string(max_context_) + " positions); reset() first");
  }
  const graph::Scalars scalars{{"token", int64_t{token}},
                               {"pos", int64_t{position_}},
                               {"len", int64_t{position_} + 1},
                               {kRopeLocal, Gemma3Config::kRopeBaseLocal},
                               {kRopeGlobal, config_.rope_base_global}};
  NPURT_RETURN_IF_ERROR(seq_->call(scalars));
  ++position_;
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, memory_->read(next_));
  int32_t next = 0;
  std::memcpy(&next, g.bytes().data(), sizeof next);
  return next;
}

StatusOr<std::vector<float>> Gemma3Model::logits() const {
  NPURT_ASSIGN_OR_RETURN(ReadGuard g, memory_->read(logits_));
  std::vector<float> out(g.bytes().size() / sizeof(float));
  std::memcpy(out.data(), g.bytes().data(), out.size() * sizeof(float));
  return out;
}

StatusOr<std::unique_ptr<SimGemma3>> SimGemma3::load(const GgufFile& file, uint32_t cores,
                                                      const Gemma3Options& options,
                                                      const Gemma3Model::Progress& progress) {
  NPURT_ASSIGN_OR_RETURN(Gemma3Config c, Gemma3Config::from_gguf(file));
  // Weights take at most the file's bytes, the f32 KV cache 2 x 4 bytes per layer,
  // position and kv dim; the rest is intermediates and code. GM pages are reserved
  // lazily, so the margin costs nothing.
  const uint64_t kv = uint64_t{context_of(c, options)} * c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4;
  hal::SimOptions o;
  o.num_cores = cores;
  o.global_memory_bytes = (file.bytes().size() + kv + (256ull << 20) + 4095) / 4096 * 4096;
  auto sim = std::unique_ptr<SimGemma3>(new SimGemma3());
  NPURT_ASSIGN_OR_RETURN(sim->device_, hal::create_sim_device(o));
  NPURT_ASSIGN_OR_RETURN(sim->memory_, MemoryContext::create(*sim->device_));
  sim->registry_ = std::make_unique<exec::CodeRegistry>(*sim->device_);
  NPURT_ASSIGN_OR_RETURN(sim->model_, Gemma3Model::load(file, *sim->memory_, *sim->registry_, options, progress));
  return sim;
}

}  // namespace npurt::models
