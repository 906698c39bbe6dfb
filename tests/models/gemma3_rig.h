// What the Gemma-3 device tests share: a synthetic model with every weight type and
// a simulated NPU to load it on.
#pragma once

#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "models/synthetic_gemma3.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/runtime/runtime.h"

namespace npurt::models {

#ifndef ASSERT_OK
#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ::npurt::Status s_ = (expr);                       \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.to_string(); \
  } while (0)
#endif

// Dimensions whose GEMV inputs are whole 256-value blocks, so the K types fit; layer
// 1 of 2 is global (period 2) and the window (8) is shorter than the runs below.
inline SyntheticGemma3 typed_model() {
  SyntheticGemma3 m;
  m.hidden = 256;
  m.ffn = 512;
  m.heads = 2;
  m.kv_heads = 1;
  m.head_dim = 128;
  m.vocab = 300;
  m.sliding_window = 8;
  m.global_period = 2;
  m.context = 128;
  auto t = [](int l, const char* what) { return gemma3_block_tensor(l, what); };
  // An untied LM head: with the head tied to the embedding, the embedding dominates the
  // residual stream of a random model and every step repeats its input token.
  m.dtype = {{"token_embd.weight", isa::DType::kQ8_0}, {"output.weight", isa::DType::kQ6_K},
             {t(0, "attn_q"), isa::DType::kQ5_0},  {t(0, "attn_k"), isa::DType::kQ4_0},  {t(0, "attn_v"), isa::DType::kF16},
             {t(0, "attn_output"), isa::DType::kQ4_K}, {t(0, "ffn_gate"), isa::DType::kQ5_K}, {t(0, "ffn_up"), isa::DType::kBF16},
             {t(0, "ffn_down"), isa::DType::kQ6_K},
             {t(1, "attn_q"), isa::DType::kF32},   {t(1, "attn_k"), isa::DType::kQ8_0},  {t(1, "attn_v"), isa::DType::kQ5_0},
             {t(1, "attn_output"), isa::DType::kQ6_K}, {t(1, "ffn_gate"), isa::DType::kQ4_0}, {t(1, "ffn_up"), isa::DType::kQ4_K},
             {t(1, "ffn_down"), isa::DType::kQ5_K}};
  return m;
}

// The bits of each float: logits compared for exact equality.
inline std::vector<uint32_t> bits(std::span<const float> v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size_bytes());
  return b;
}

// n token ids of the synthetic model's 300, from `seed`.
inline std::vector<int32_t> random_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 300);
  return p;
}

struct Rig {
  explicit Rig(uint64_t gm_bytes = 256ull << 20)
      : runtime(Runtime::create("sim", {.memory_bytes = gm_bytes}).value()), memory(&runtime->memory()) {}
  Status load(const GgufFile& file, Gemma3Options o = {}) {
    StatusOr<std::unique_ptr<Gemma3Model>> m = Gemma3Model::load(file, *runtime, o);
    if (!m.ok()) return m.status();
    model = std::move(m).value();
    return ok_status();
  }
  // NaN into the logits and the next-token output, so a step must write both.
  void poison() {
    for (const char* name : {"logits", "next"}) {
      View v = model->sequence().get_buffer(name).value();
      WriteGuard g = memory->write(v).value();
      std::vector<float> nan(g.bytes().size() / 4, std::numeric_limits<float>::quiet_NaN());
      std::memcpy(g.bytes().data(), nan.data(), g.bytes().size());
    }
  }
  std::shared_ptr<Runtime> runtime;
  MemoryContext* memory;
  std::unique_ptr<Gemma3Model> model;
};

}  // namespace npurt::models
