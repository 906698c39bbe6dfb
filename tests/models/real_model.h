// The real Gemma-3 file, for the tests that check known answers on it: NPURT_MODEL
// names it, and those tests skip when it does not name a file.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <utility>

#include "npurt/base/status.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"

namespace npurt::models {

// Relative L2 within which two device runs of one model that sum in different orders
// (batched prefill against token by token, several devices against one) agree, logits
// and caches. With the f32 TMV kernels the real file gives at most 2e-6; on CPUs with
// AVX512_VNNI the integer TMV kernels (x rounded to fixed point per group, docs/isa.md)
// give up to 1.3e-5 logits and 2.0e-5 caches over 18 layers and 32 steps.
inline constexpr double kRunsAgree = 5e-5;

inline constexpr const char* kNoRealModel = "set NPURT_MODEL to a Gemma-3-270M GGUF file to run this test";

// The file NPURT_MODEL names, or null when it names none.
inline const char* real_model_path() {
  const char* path = std::getenv("NPURT_MODEL");
  return path != nullptr && std::filesystem::is_regular_file(path) ? path : nullptr;
}

// The opened file and the tokenizer read from it.
struct RealModel {
  GgufFile file;
  Tokenizer tokenizer;
};

inline StatusOr<RealModel> open_real_model(const char* path) {
  NPURT_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  NPURT_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_gguf(file));
  return RealModel{std::move(file), std::move(tokenizer)};
}

}  // namespace npurt::models
