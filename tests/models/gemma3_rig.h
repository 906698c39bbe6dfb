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
  using enum isa::DType;
  // An untied LM head: with the head tied to the embedding, the embedding dominates the
  // residual stream of a random model and every step repeats its input token.
  return {.hidden = 256, .ffn = 512, .heads = 2, .kv_heads = 1, .head_dim = 128, .vocab = 300,
          .sliding_window = 8, .context = 128, .global_period = 2,
          .dtype = matrix_dtypes(kQ8_0, kQ6_K, {{kQ5_0, kQ4_0, kF16, kQ4_K, kQ5_K, kBF16, kQ6_K},
                                                {kF32, kQ8_0, kQ5_0, kQ6_K, kQ4_0, kQ4_K, kQ5_K}})};
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
