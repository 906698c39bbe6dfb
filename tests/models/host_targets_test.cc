// The simulated NPU's results are a property of its tile ISA, not of the CPU that
// simulates it: a Gemma-3 model's prefill, decode and verify steps give bitwise the
// same logits under every vector implementation with FMA this CPU can run (AVX-512
// with and without VNNI, AVX2), forced in turn in one process. The portable fallback,
// whose Highway multiply-add rounds twice, is the control: the comparison sees it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hal/sim/matvec_kernels.h"
#include "hal/sim/tile_kernels.h"
#include "hwy/targets.h"
#include "models/gemma3_rig.h"
#include "models/real_model.h"

namespace npurt::models {
namespace {

struct Form {
  int64_t target;
  bool vnni;
  std::string name;
};

// Every (Highway target, VNNI on/off) this host runs, best first; the fallback last
// when `with_fallback`.
std::vector<Form> forms(bool with_fallback) {
  std::vector<Form> out;
  for (int64_t t : sim::tile_kernels_targets()) {
    if (t == HWY_SCALAR && !with_fallback) continue;
    for (bool vnni : {true, false}) {
      sim::tile_kernels_set_target_for_test(t);
      sim::matvec_set_vnni_for_test(vnni);
      const std::string name = sim::matvec_isa();
      if (out.empty() || out.back().name != name) out.push_back({t, vnni, name});
    }
  }
  sim::tile_kernels_set_target_for_test(0);
  sim::matvec_set_vnni_for_test(true);
  return out;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// The logits of a batched prefill of `prompt`, then of each decode step over
// `steps`, then of a verify step over `verify` after a reset and a token-by-token
// run of the prompt: every figure one run makes.
std::vector<std::vector<uint32_t>> run_all(Gemma3Model& m, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& steps, const std::vector<int32_t>& verify) {
  std::vector<std::vector<uint32_t>> out;
  EXPECT_TRUE(m.reset().ok());
  EXPECT_TRUE(m.prefill(prompt).ok());
  out.push_back(bits(m.logits().value()));
  for (int32_t t : steps) {
    EXPECT_TRUE(m.step(t).ok());
    out.push_back(bits(m.logits().value()));
  }
  EXPECT_TRUE(m.reset().ok());
  for (int32_t t : prompt) EXPECT_TRUE(m.step(t).ok());
  EXPECT_TRUE(m.verify(verify).ok());
  out.push_back(bits(m.verify_logits().value()));
  return out;
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return p;
}

// Runs everything under each form, the model loaded afresh each time, and counts the
// logits vectors that differ in any bit from the best form's.
void expect_same_bits_everywhere(const GgufFile& file, Gemma3Options o, int32_t vocab, size_t prompt_len,
                                 size_t steps_len, size_t verify_len, uint64_t gm_bytes, bool with_fallback) {
  const std::vector<int32_t> prompt = random_tokens(prompt_len, vocab, 1);
  const std::vector<int32_t> steps = random_tokens(steps_len, vocab, 2);
  const std::vector<int32_t> verify = random_tokens(verify_len, vocab, 3);
  const std::vector<Form> all = forms(with_fallback);
  // Forms with FMA: AVX-512 with and without VNNI, AVX2. An AVX2-only host has one, so
  // nothing to hold it against but the control.
  const size_t fma_forms = all.size() - (with_fallback ? 1 : 0);
  ASSERT_GE(fma_forms, 1u) << "an x86-64 host runs AVX2";
  if (fma_forms < 2 && !with_fallback) GTEST_SKIP() << "one form with FMA on this host (" << all[0].name << ")";
  std::vector<std::vector<uint32_t>> want;
  for (const Form& f : all) {
    sim::tile_kernels_set_target_for_test(f.target);
    sim::matvec_set_vnni_for_test(f.vnni);
    std::vector<std::vector<uint32_t>> got;
    {
      Rig rig(gm_bytes);
      ASSERT_TRUE(rig.load(file, o).ok());
      got = run_all(*rig.model, prompt, steps, verify);
    }
    if (want.empty()) {
      want = got;
      continue;
    }
    ASSERT_EQ(got.size(), want.size());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
    if (f.target == HWY_SCALAR) {
      EXPECT_GT(differ, 0) << "the fallback's twice-rounded multiply-adds went unseen";
      continue;
    }
    EXPECT_EQ(differ, 0) << f.name << " against " << all[0].name << ": " << differ << " of " << got.size()
                         << " logits vectors differ (prefill, " << steps_len << " decode steps, verify)";
  }
  sim::tile_kernels_set_target_for_test(0);
  sim::matvec_set_vnni_for_test(true);
  if (fma_forms < 2) GTEST_SKIP() << "one form with FMA on this host (" << all[0].name << "): only the control ran";
}

TEST(HostTargets, SyntheticStepsGiveTheSameBitsUnderEveryTarget) {
  Parsed p = parse(synthetic_gemma3(typed_model()));
  // Past the local layer's window of 8; a prompt chunk of 8 and a verify step of 8.
  expect_same_bits_everywhere(p.file, {.max_context = 0, .prefill_chunk = 8}, 300, 11, 12, 8, 256ull << 20,
                              /*with_fallback=*/true);
}

TEST(HostTargets, RealModelStepsGiveTheSameBitsUnderEveryTarget) {
  const char* path = real_model_path();
  if (path == nullptr) GTEST_SKIP() << kNoRealModel;
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  expect_same_bits_everywhere(*file, {.max_context = 64, .prefill_chunk = 16, .verify_tokens = 8}, 262144, 9, 3, 8,
                              1ull << 30, /*with_fallback=*/false);
}

}  // namespace
}  // namespace npurt::models
