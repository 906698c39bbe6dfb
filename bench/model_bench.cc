// Gemma-3 on the simulated NPU against its physical limits, measured in the same run:
//   decode reads every weight once per token, so its floor is (DRAM read bandwidth) /
//   (weight bytes per token);
//   batched prefill is matrix work, so its floor is (f32 FMA peak of the host threads) /
//   (FLOPs per prompt token).
// Prints model load time, prefill of a 64- and a 512-token prompt (batched and, for 64,
// token by token), the time to first token, decode tokens/s, both floors and the
// ratios, and where a 512-token chunk's time goes per operator (medians); then
// speculative decoding: plain against speculative decode of a continuation that
// repeats (--repeat-prompt-file) and of prose, the verify step's cost for 1 .. 16
// tokens against a decode step with the f32 floor of 8 tokens' products, and per
// GEMV the cost at T = 8 against T = 1.
//
//   npurt_model_bench [--model PATH] [--tokens N] [--reps R] [--cores C]
//                     [--prefill-chunk T] [--prompt-file F] [--repeat-prompt-file F]
//                     [--speculate N] [--peer-json]
// --peer-json prints one repetition of the prefill-64, prefill-512 and decode-128
// figures, and the speculative and repeating decode figures, as one JSON line (what
// `make bench-peer` alternates with llama.cpp).
#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fma_peak.h"
#include "hal/sim/matvec_kernels.h"
#include "hal/sim/tile_kernels.h"
#include "memory_peers.h"
#include "npurt/models/batch_engine.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/kv_blocks.h"
#include "npurt/models/sampler.h"
#include "npurt/models/tokenizer.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/prefill_attention.h"
#include "npurt/ops/weight_gemm.h"
#include "op_runner.h"

namespace {

using namespace npurt;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median wall time of `n` launches of an operator loaded by OpRunner.
double median_launch_seconds(bench::OpRunner& run, int n) {
  std::vector<double> s;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    run.run();
    s.push_back(seconds_since(t0));
  }
  return median(s);
}

template <typename T>
T or_die(StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "model_bench: %s: %s\n", what, v.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(v).value();
}

struct Args {
  std::string model = std::getenv("NPURT_MODEL") ? std::getenv("NPURT_MODEL") : "models/gemma-3-270m-q4_k_m.gguf";
  std::string prompt_file = "bench/peer_prompt.txt";
  std::string repeat_file = "bench/repeat_prompt.txt";  // a continuation that repeats itself
  int speculate = 7;
  int tokens = 128, reps = 5, cores = 8;
  int chunk = static_cast<int>(models::Gemma3Options::kDefaultPrefillChunk);
  bool peer_json = false;
  bool batched_json = false;
};

// The first n tokens of the prompt text (BOS first), repeated as needed.
std::vector<int32_t> prompt_of(const models::Tokenizer& tok, const std::string& text, size_t n) {
  std::vector<int32_t> ids = or_die(tok.encode(text), "encode");
  const std::vector<int32_t> body(ids.begin() + 1, ids.end());
  while (ids.size() < n) ids.insert(ids.end(), body.begin(), body.end());
  ids.resize(n);
  return ids;
}

// --peer-json's decode at depth: kDepthDecode plain steps after kDepth prompt tokens
// (llama-bench -d 4096 -n 64 measures the same).
constexpr size_t kDepth = 4096;
constexpr int kDepthDecode = 64;

struct Figures {
  double prefill64 = 0, prefill512 = 0, decode = 0, ttft512 = 0;
};

// Decode tokens/s of `tokens` greedy tokens after `prompt`, with `speculate` drafts
// per verify step (0: plain), and the run's figures.
struct Decode {
  double tokens_per_s = 0;
  models::GenerateStats stats;
};
Decode decode_run(models::Gemma3Model& model, const std::vector<int32_t>& prompt, int tokens, int speculate,
                  const models::SamplingParams& sampling = {}) {
  Decode d;
  or_die(models::generate(model, prompt, tokens + 1, nullptr, {}, &d.stats,
                          {.speculate = speculate, .drafter = {}, .sampling = sampling}),
         "decode");
  d.tokens_per_s = d.stats.decoded_tokens() / d.stats.decode_seconds;
  return d;
}

// Batched decode over the paged KV cache: B sequences, each fed `prompt` tokens of
// `text` from its own offset (untimed), then `steps` timed decode_batch() calls of one
// greedy token per sequence. Tokens per second over all sequences.
double batched_decode_tps(models::Gemma3Model& model, const std::vector<int32_t>& text, uint32_t B, int prompt,
                          int steps) {
  models::KvBlocks kv = or_die(models::KvBlocks::create({.blocks = model.kv_blocks(),
                                                         .block_positions = model.kv_block_positions()}),
                               "kv blocks");
  std::vector<int32_t> next(B);
  std::vector<std::vector<uint32_t>> tables(B);
  std::vector<models::BatchToken> batch(B);
  for (uint32_t s = 0; s < B; ++s) {
    or_die(StatusOr<uint32_t>(kv.add(s, std::span(text).subspan(s, 1))), "add");
    next[s] = text[s];
  }
  auto call = [&](int i) {
    for (uint32_t s = 0; s < B; ++s) {
      const int32_t token = i < prompt ? text[(s + i) % text.size()] : next[s];
      const int32_t position = static_cast<int32_t>(or_die(kv.length(s), "length"));
      const models::AppendPlan plan = or_die(kv.append(s, std::span(&token, 1)), "append");
      const auto t = or_die(kv.table(s), "table");
      tables[s].assign(t.begin(), t.end());
      batch[s] = {token, position, tables[s], plan.rows[0]};
    }
    next = or_die(model.decode_batch(batch), "decode_batch");
  };
  for (int i = 0; i < prompt; ++i) call(i);
  const auto t = Clock::now();
  for (int i = 0; i < steps; ++i) call(prompt + i);
  return double(B) * steps / seconds_since(t);
}

// The aggregate decode of B requests on a BatchEngine, as llama-batched-bench measures
// it: each with its own `prompt`-token prompt (the text from its own offset, so no
// prefix is shared), then `steps` tokens each; tokens/s over the steps after every
// request has its first token (the prefill, in paged chunks, untimed).
double engine_decode_tps(const std::shared_ptr<models::Gemma3Model>& model, const std::vector<int32_t>& text,
                         uint32_t B, int prompt, int steps) {
  auto engine = or_die(models::BatchEngine::create(model), "engine");
  std::vector<int> got(B, 0);
  for (uint32_t s = 0; s < B; ++s) {
    std::vector<int32_t> p{text[0]};
    for (int i = 1; i < prompt; ++i) p.push_back(text[1 + (s * 7 + i) % (text.size() - 1)]);
    or_die(engine->submit({.prompt = p, .max_tokens = steps + 1}, [&got, s](models::RequestId, int32_t) { ++got[s]; }),
           "submit");
  }
  while (std::any_of(got.begin(), got.end(), [](int n) { return n == 0; })) or_die(engine->step(), "step");
  const auto t = Clock::now();
  or_die(StatusOr<int>(engine->run_until_idle().ok() ? 0 : -1), "run");
  return double(B) * steps / seconds_since(t);
}

// A model for the engine figures: up to 16 sequences of up to 128 positions, prompts
// in paged chunks of 64.
std::shared_ptr<models::Gemma3Model> load_batched(const models::GgufFile& file, uint32_t cores,
                                                  const models::Gemma3Options& mo) {
  models::Gemma3Options bo = mo;
  bo.prefill_chunk = 64;
  bo.verify_tokens = 0;
  bo.batch_sequences = 16;
  bo.kv_blocks = 16 * 128 / bo.kv_block_positions;
  return or_die(models::Gemma3Model::load_on(file, "sim", cores, bo), "load batched");
}

// Time to first token of a request with a `prompt`-token prompt on a BatchEngine
// where `busy` other requests (16-token prompts) are already decoding.
double engine_ttft(const std::shared_ptr<models::Gemma3Model>& model, const std::vector<int32_t>& text, int prompt,
                   int busy) {
  auto engine = or_die(models::BatchEngine::create(model), "engine");
  for (int i = 0; i < busy; ++i) {
    const auto from = text.begin() + 3 * i;
    or_die(engine->submit({.prompt = std::vector<int32_t>(from, from + 16), .max_tokens = 400}), "submit");
  }
  while (engine->running() < static_cast<size_t>(busy) || engine->queued() > 0) or_die(engine->step(), "step");
  for (int i = 0; i < 16; ++i) or_die(engine->step(), "step");  // every one past its prompt
  bool first = false;
  const auto t = Clock::now();
  or_die(engine->submit({.prompt = std::vector<int32_t>(text.begin(), text.begin() + prompt), .max_tokens = 1},
                        [&](models::RequestId, int32_t) { first = true; }),
         "submit");
  while (!first) or_die(engine->step(), "step");
  return seconds_since(t);
}

// One repetition: prefill of 64 and 512 tokens, then `tokens` decode steps after the 64.
Figures measure(models::Gemma3Model& model, const std::vector<int32_t>& p64, const std::vector<int32_t>& p512,
                int tokens) {
  Figures f;
  models::GenerateStats st;
  or_die(models::generate(model, p512, 1, nullptr, {}, &st), "prefill 512");
  f.prefill512 = st.prompt_tokens / st.prefill_seconds;
  f.ttft512 = st.prefill_seconds;
  or_die(models::generate(model, p64, tokens + 1, nullptr, {}, &st), "decode");
  f.prefill64 = st.prompt_tokens / st.prefill_seconds;
  f.decode = st.decoded_tokens() / st.decode_seconds;
  return f;
}

// Verify steps of each size in `sizes` at the position after `prompt`, each rewound so
// every repetition sees the same cache, alternating with a plain decode step there:
// per size the median seconds and the median of (verify / the step next to it); the
// plain step's median seconds under size 0.
std::map<int, std::pair<double, double>> verify_costs(models::Gemma3Model& model, const std::vector<int32_t>& prompt,
                                                      const std::vector<int>& sizes, int reps) {
  const auto check = [](Status s, const char* what) { or_die(s.ok() ? StatusOr<int>(0) : StatusOr<int>(s), what); };
  check(model.reset(), "reset");
  or_die(model.prefill(prompt), "prefill");
  const int32_t at = model.position();
  std::map<int, std::vector<double>> seconds, ratios;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    or_die(model.step(prompt[0]), "step");
    const double step = seconds_since(t0);
    check(model.rewind(at), "rewind");
    seconds[0].push_back(step);
    for (int n : sizes) {
      const std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + n);
      t0 = Clock::now();
      or_die(model.verify(tokens), "verify");
      seconds[n].push_back(seconds_since(t0));
      ratios[n].push_back(seconds[n].back() / step);
      check(model.rewind(at), "rewind");
    }
  }
  std::map<int, std::pair<double, double>> out;
  for (auto& [n, s] : seconds) out[n] = {median(s), n == 0 ? 1.0 : median(ratios[n])};
  return out;
}

// Matrix FLOPs of one prompt token (projections and MLP) and of its attention at
// position `pos` (QK^T and PV over the attended positions).
double matmul_flops_per_token(const models::Gemma3Config& c) {
  const double hidden = c.hidden, q = double(c.n_heads) * c.head_dim, kv = double(c.n_kv_heads) * c.head_dim;
  return 2.0 * c.n_layers * (hidden * (q + 2 * kv) + q * hidden + 3 * hidden * c.ffn);
}
double attention_flops(const models::Gemma3Config& c, int pos) {
  double f = 0;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const double len = c.is_global(l) ? pos + 1 : std::min<double>(pos + 1, c.sliding_window);
    f += 4.0 * c.n_heads * c.head_dim * len;
  }
  return f;
}

// Where a chunk of T tokens goes: each distinct matrix product and attention of the
// chunk timed alone on the same simulated NPU (random data of the real shapes), times
// its count per chunk; the rest of the measured chunk time is the small operators.
void print_breakdown(const models::GgufFile& file, const models::Gemma3Config& c, uint32_t cores, uint32_t T,
                     double chunk_seconds) {
  hal::SimOptions so;
  so.num_cores = cores;
  struct Part {
    std::string what;
    double seconds = 0;
  };
  std::map<std::string, Part> parts;  // by tensor role
  const uint64_t hidden = c.hidden, q = uint64_t(c.n_heads) * c.head_dim, kv = uint64_t(c.n_kv_heads) * c.head_dim;
  const std::map<std::string, std::pair<uint64_t, uint64_t>> shapes = {
      {"attn_q", {q, hidden}},          {"attn_k", {kv, hidden}},     {"attn_v", {kv, hidden}},
      {"attn_output", {hidden, q}},     {"ffn_gate", {c.ffn, hidden}}, {"ffn_up", {c.ffn, hidden}},
      {"ffn_down", {hidden, c.ffn}}};
  std::map<std::string, double> timed;  // one run per (role, dtype)
  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (const auto& [role, mk] : shapes) {
      const models::GgufTensor* t = file.tensor(models::gemma3_block_tensor(l, role.c_str()));
      const std::string key = role + " " + std::string(isa::dtype_name(t->dtype));
      if (!timed.count(key)) {
        ops::WeightGemm op({.m = mk.first, .k = mk.second, .rows = T, .weight = t->dtype});
        bench::OpRunner run(op, {}, so);
        timed[key] = median_launch_seconds(run, 3);
      }
      parts[role].what = "weight_gemm " + role;
      parts[role].seconds += timed[key];
    }
  }
  for (bool global : {false, true}) {
    ops::PrefillAttention op({.n_heads = uint32_t(c.n_heads), .n_kv_heads = uint32_t(c.n_kv_heads),
                              .head_dim = uint32_t(c.head_dim), .max_len = T, .tokens = T,
                              .window = global ? 0u : uint32_t(c.sliding_window)});
    bench::OpRunner run(op, {{"pos", 0}, {"rows", T}}, so);
    const double seconds = median_launch_seconds(run, 3);
    int layers = 0;
    for (int32_t l = 0; l < c.n_layers; ++l) layers += c.is_global(l) == global;
    parts[global ? "~global" : "~local"] = {global ? "prefill_attention global" : "prefill_attention local",
                                            seconds * layers};
  }
  double sum = 0;
  std::printf("  where a %u-token chunk's %.3f s go (operators timed alone, times their count):\n", T, chunk_seconds);
  for (const auto& [k, p] : parts) {
    sum += p.seconds;
    std::printf("    %-28s %8.3f s  %5.1f%%\n", p.what.c_str(), p.seconds, 100 * p.seconds / chunk_seconds);
  }
  if (sum > chunk_seconds) {
    // Alone, an operator runs slower than inside the chunk on some hosts (the shares
    // above then add up to more than 100%); a negative rest would mean nothing.
    std::printf("    the operators timed alone sum to %.3f s, %.2fx the chunk: no rest to attribute\n", sum,
                sum / chunk_seconds);
    return;
  }
  std::printf("    %-28s %8.3f s  %5.1f%%\n", "rest (norms, RoPE, KV append, adds, LM head, launches)",
              chunk_seconds - sum, 100 * (chunk_seconds - sum) / chunk_seconds);
}

// Where a verify step of T tokens goes: each distinct projection and the LM head as a
// GEMV over T vectors, timed alone on the same simulated NPU (random data of the real
// shapes), times its count per step, next to the same at T = 1; and each one's weight
// bytes over its T = 1 time, next to the DRAM read.
void print_verify_breakdown(const models::GgufFile& file, const models::Gemma3Config& c, uint32_t cores, uint32_t T,
                            double dram_gbs) {
  hal::SimOptions so;
  so.num_cores = cores;
  const uint64_t hidden = c.hidden, q = uint64_t(c.n_heads) * c.head_dim, kv = uint64_t(c.n_kv_heads) * c.head_dim;
  const std::map<std::string, std::pair<uint64_t, uint64_t>> shapes = {
      {"attn_q", {q, hidden}},          {"attn_k", {kv, hidden}},     {"attn_v", {kv, hidden}},
      {"attn_output", {hidden, q}},     {"ffn_gate", {c.ffn, hidden}}, {"ffn_up", {c.ffn, hidden}},
      {"ffn_down", {hidden, c.ffn}}};
  // (what, dtype) -> [count, m, k]
  std::map<std::pair<std::string, isa::DType>, std::array<uint64_t, 3>> gemvs;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (const auto& [role, mk] : shapes) {
      const models::GgufTensor* t = file.tensor(models::gemma3_block_tensor(l, role.c_str()));
      auto& g = gemvs[{role, t->dtype}];
      g = {g[0] + 1, mk.first, mk.second};
    }
  }
  const models::GgufTensor* head = models::gemma3_output_weight(file);
  gemvs[{"lm_head", head->dtype}] = {1, uint64_t(c.vocab), hidden};
  std::printf("  where a verify step's GEMVs go (each timed alone, times its count per step; GB/s: weight bytes\n"
              "  over the T = 1 time, next to the DRAM read of %.1f GB/s):\n", dram_gbs);
  std::printf("    %-22s %10s %9s%-2u %7s %8s %7s\n", "gemv", "T = 1", "T = ", T, "ratio", "GB/s", "/ DRAM");
  double sum1 = 0, sumT = 0, bytes_all = 0;
  for (const auto& [key, g] : gemvs) {
    double s[2];
    for (int i = 0; i < 2; ++i) {
      const uint32_t batch = i == 0 ? 1 : T;
      ops::Gemv op({.m = g[1], .k = g[2], .weight = key.second, .batch = batch});
      bench::OpRunner run(op, {}, so);
      s[i] = median_launch_seconds(run, 5) * double(g[0]);
    }
    sum1 += s[0];
    sumT += s[1];
    const double bytes = double(g[0]) * double(g[1]) * double(g[2] / isa::dtype_block_elems(key.second)) *
                         double(isa::dtype_block_bytes(key.second));
    bytes_all += bytes;
    const double gbs = bytes / s[0] / 1e9;
    const std::string what = key.first + " " + std::string(isa::dtype_name(key.second)) + " x" + std::to_string(g[0]);
    std::printf("    %-22s %8.2f ms %8.2f ms %6.2fx %8.1f %7.2f\n", what.c_str(), s[0] * 1e3, s[1] * 1e3, s[1] / s[0],
                gbs, gbs / dram_gbs);
  }
  const double gbs_all = bytes_all / sum1 / 1e9;
  std::printf("    %-22s %8.2f ms %8.2f ms %6.2fx %8.1f %7.2f\n", "all GEMVs", sum1 * 1e3, sumT * 1e3, sumT / sum1,
              gbs_all, gbs_all / dram_gbs);
}

// The tile matrix multiply's peak on this simulated NPU: every core multiplying local
// tiles of WeightGemm's shape (64 x 256 by 256 x 64, B in place) in a loop, with no
// memory traffic. GFLOP/s, median of 5 launches.
class TileMatmulLoop final : public ops::Operator {
 public:
  static constexpr int kRounds = 200, kM = 64, kK = 256, kN = 64;
  explicit TileMatmulLoop(uint32_t cores) : cores_(cores) {}
  std::string name() const override { return "tile_matmul_loop"; }
  Status validate() const override { return ok_status(); }
  std::vector<isa::ArgSpec> signature() const override { return {}; }
  double flops() const { return 2.0 * kM * kK * kN * kRounds * cores_; }

 protected:
  StatusOr<uint32_t> emit(ops::EmitContext& ctx) const override {
    isa::KernelBuilder& b = ctx.builder;
    const isa::Reg one{0}, rounds{1};
    const isa::Tile a{0}, bt{1}, c{2};
    b.tdef(a, isa::DType::kF32, kM, kK, 0);
    b.tdef(bt, isa::DType::kF32, kK, kN, kM * kK * 4);
    b.tdef(c, isa::DType::kF32, kM, kN, (kM * kK + kK * kN) * 4);
    b.li(one, std::bit_cast<uint32_t>(1e-3f));
    b.tfill(a, one);
    b.tfill(bt, one);
    b.tfill(c, one);
    b.li(rounds, kRounds);
    b.loop_begin(rounds);
    b.tmma(c, a, bt, isa::kAccumulate);
    b.loop_end();
    b.reserve_local((kM * kK + kK * kN + kM * kN) * 4);
    return cores_;
  }
  void compute_reference(std::span<const ops::HostArg>) const override {}

 private:
  uint32_t cores_;
};

double tile_matmul_peak_gflops(uint32_t cores) {
  hal::SimOptions so;
  so.num_cores = cores;
  TileMatmulLoop op(cores);
  bench::OpRunner run(op, {}, so);
  return op.flops() / median_launch_seconds(run, 5) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--peer-json")) a.peer_json = true;
    else if (!std::strcmp(argv[i], "--batched-json")) a.batched_json = true;
    else if (has && !std::strcmp(argv[i], "--model")) a.model = argv[++i];
    else if (has && !std::strcmp(argv[i], "--tokens")) a.tokens = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--reps")) a.reps = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--cores")) a.cores = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--prefill-chunk")) a.chunk = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--prompt-file")) a.prompt_file = argv[++i];
    else if (has && !std::strcmp(argv[i], "--repeat-prompt-file")) a.repeat_file = argv[++i];
    else if (has && !std::strcmp(argv[i], "--speculate")) a.speculate = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "model_bench: unknown or incomplete option %s\n", argv[i]);
      return 1;
    }
  }
  if (!std::filesystem::is_regular_file(a.model)) {
    std::fprintf(stderr, "model_bench: no model at %s (run `make model` or pass --model)\n", a.model.c_str());
    return 1;
  }
  if (a.tokens < 2 || a.reps < 1 || a.cores < 1 || a.chunk < 0) {
    std::fprintf(stderr, "model_bench: --tokens must be >= 2, --reps and --cores >= 1, --prefill-chunk >= 0\n");
    return 1;
  }
  std::ifstream in(a.prompt_file);
  if (!in) {
    std::fprintf(stderr, "model_bench: cannot read the prompt file %s\n", a.prompt_file.c_str());
    return 1;
  }
  std::stringstream text, repeat_text;
  text << in.rdbuf();
  std::ifstream repeat_in(a.repeat_file);
  if (!repeat_in) {
    std::fprintf(stderr, "model_bench: cannot read the prompt file %s\n", a.repeat_file.c_str());
    return 1;
  }
  repeat_text << repeat_in.rdbuf();
  if (a.speculate < 1 || a.speculate > 15) {
    std::fprintf(stderr, "model_bench: --speculate must be 1 .. 15\n");
    return 1;
  }
  models::GgufFile file = or_die(models::GgufFile::open(a.model), "open");
  models::Tokenizer tok = or_die(models::Tokenizer::from_gguf(file), "tokenizer");
  const std::vector<int32_t> p64 = prompt_of(tok, text.str(), 64), p512 = prompt_of(tok, text.str(), 512);
  std::string repeat = repeat_text.str();
  while (!repeat.empty() && std::isspace(static_cast<unsigned char>(repeat.back()))) repeat.pop_back();
  const std::vector<int32_t> p_repeat = or_die(tok.encode(repeat), "encode");
  const uint32_t cores = static_cast<uint32_t>(a.cores);
  const uint32_t context = 512 + static_cast<uint32_t>(a.tokens) + 1;  // the repeating prompt is shorter than 512
  models::Gemma3Options mo{.max_context = context, .prefill_chunk = static_cast<uint32_t>(a.chunk)};

  if (a.batched_json) {
    // llama-batched-bench's figure: 64-token prompts, 32 tokens each, B = 1 .. 16.
    std::shared_ptr<models::Gemma3Model> batched = load_batched(file, cores, mo);
    engine_decode_tps(batched, p512, 16, 64, 4);  // every pool page touched once
    std::printf("{");
    for (uint32_t B : {1u, 2u, 4u, 8u, 16u}) {
      std::printf("%s\"decode_32_b%u_tokens_per_s\": %.3f", B == 1 ? "" : ", ", B, engine_decode_tps(batched, p512, B, 64, 32));
    }
    std::printf(", \"host_threads\": %u, \"cores\": %d}\n", std::thread::hardware_concurrency(), a.cores);
    return 0;
  }

  if (a.peer_json) {
    // Decode after kDepth positions, on a model whose context holds them (the prompt
    // text repeated, as prompt_of does, so both sides see the same ids): with the f32
    // cache, and with an f16 one as llama.cpp keeps by default.
    auto decode_deep = [&](isa::DType kv) {
      models::Gemma3Options deep_mo = mo;
      deep_mo.max_context = kDepth + kDepthDecode + 1;
      deep_mo.kv_cache = kv;
      auto model = or_die(models::Gemma3Model::load_on(file, "sim", cores, deep_mo), "load");
      return decode_run(*model, prompt_of(tok, text.str(), kDepth), kDepthDecode, 0);
    };
    const Decode deep = decode_deep(isa::DType::kF32), deep_f16 = decode_deep(isa::DType::kF16);
    auto sim = or_die(models::Gemma3Model::load_on(file, "sim", cores, mo), "load");
    const Figures f = measure(*sim, p64, p512, a.tokens);
    const Decode prose = decode_run(*sim, p64, a.tokens, a.speculate);
    const Decode rep_plain = decode_run(*sim, p_repeat, a.tokens, 0);
    const Decode rep = decode_run(*sim, p_repeat, a.tokens, a.speculate);
    std::printf(
        "{\"prefill_64_tokens_per_s\": %.3f, \"prefill_512_tokens_per_s\": %.3f, \"decode_128_tokens_per_s\": %.3f, "
        "\"decode_128_speculative_tokens_per_s\": %.3f, \"repeat_128_tokens_per_s\": %.3f, "
        "\"repeat_128_speculative_tokens_per_s\": %.3f, \"repeat_tokens_per_pass\": %.3f, "
        "\"prose_tokens_per_pass\": %.3f, \"speculate\": %d, \"decode_64_at_4096_tokens_per_s\": %.3f, "
        "\"decode_64_at_4096_f16_kv_tokens_per_s\": %.3f, "
        "\"ttft_512_s\": %.4f, \"host_threads\": %u, \"prefill_chunk\": %d, \"cores\": %d}\n",
        f.prefill64, f.prefill512, f.decode, prose.tokens_per_s, rep_plain.tokens_per_s, rep.tokens_per_s,
        rep.stats.tokens_per_pass(), prose.stats.tokens_per_pass(), a.speculate, deep.tokens_per_s,
        deep_f16.tokens_per_s, f.ttft512,
        std::thread::hardware_concurrency(), a.chunk, a.cores);
    return 0;
  }

  // Before any model is loaded: no other device's threads compete.
  const double peak = tile_matmul_peak_gflops(cores);
  std::vector<double> load_s;
  for (int r = 0; r < 3; ++r) {
    const auto t = Clock::now();
    auto sim = or_die(models::Gemma3Model::load_on(file, "sim", cores, mo), "load");
    load_s.push_back(seconds_since(t));
  }
  auto sim = or_die(models::Gemma3Model::load_on(file, "sim", cores, mo), "load");
  models::Gemma3Model& model = *sim;

  // Model runs and DRAM reads alternate, so both see the same machine state.
  bench::StreamRead read;
  std::vector<double> p64_tps, p512_tps, ttft, decode_tps, single64_tps, read_gbs;
  for (int r = 0; r < a.reps; ++r) {
    const auto t = Clock::now();
    volatile uint64_t sink = read.run();
    (void)sink;
    read_gbs.push_back(read.bytes() / seconds_since(t) / 1e9);
    const Figures f = measure(model, p64, p512, a.tokens);
    p64_tps.push_back(f.prefill64);
    p512_tps.push_back(f.prefill512);
    ttft.push_back(f.ttft512);
    decode_tps.push_back(f.decode);
    // The same 64 tokens one decode step at a time, for the speed-up of batching.
    const uint32_t chunk = model.prefill_chunk();
    or_die(StatusOr<int>(model.set_prefill_chunk(0).ok() ? 0 : -1), "chunk");
    models::GenerateStats st;
    or_die(models::generate(model, p64, 1, nullptr, {}, &st), "token by token");
    single64_tps.push_back(st.prompt_tokens / st.prefill_seconds);
    (void)model.set_prefill_chunk(chunk);
  }
  const models::Gemma3Config& c = model.config();
  const double bytes = static_cast<double>(model.weight_bytes_per_step());
  const double floor_tps = median(read_gbs) * 1e9 / bytes;
  const double decode = median(decode_tps);
  const unsigned threads = std::thread::hardware_concurrency();
  const double fma_peak = bench::fma_peak_gflops() * threads;  // GFLOP/s of every host thread
  // Average FLOPs per token of a 512-token prompt from position 0.
  double attn = 0;
  for (int pos = 0; pos < 512; ++pos) attn += attention_flops(c, pos);
  const double flops512 = matmul_flops_per_token(c) + attn / 512;
  const double compute_floor = peak * 1e9 / flops512;
  std::printf("Gemma-3 on the simulated NPU (%s, %d cores, %u host threads), %d repetitions, medians\n",
              a.model.c_str(), a.cores, threads, a.reps);
  std::printf("  host instructions              TMV %s, tile kernels %s (the same bits on every target with FMA)\n",
              sim::matvec_isa(), sim::tile_kernels_target());
  std::printf("  model load (file->device)      %10.2f s\n", median(load_s));
  std::printf("  prefill chunk (compiled max)   %10u tokens\n", model.max_prefill_chunk());
  std::printf("  prefill 64 tokens, batched     %10.1f tokens/s\n", median(p64_tps));
  std::printf("  prefill 64 tokens, one by one  %10.1f tokens/s\n", median(single64_tps));
  std::printf("  prefill 512 tokens, batched    %10.1f tokens/s  (time to first token %.3f s)\n", median(p512_tps),
              median(ttft));
  std::printf("  FLOPs per prompt token (512)   %10.1f MFLOP (%.1f of them attention)\n", flops512 / 1e6,
              attn / 512 / 1e6);
  std::printf("  tile matmul peak (local tiles) %10.1f GFLOP/s (FMA probe, %u threads: %.1f)\n", peak, threads,
              fma_peak);
  std::printf("  compute floor                  %10.1f tokens/s\n", compute_floor);
  std::printf("  prefill 512 / compute floor    %10.2f\n", median(p512_tps) / compute_floor);
  std::printf("  weights read per decode token  %10.1f MB, %zu launches, %zu barriers\n", bytes / 1e6,
              model.launches_per_step(), model.barriers_per_step());
  std::printf("  decode (%d tokens)             %10.1f tokens/s\n", a.tokens, decode);
  std::printf("  DRAM read (4 streams/thread)   %10.1f GB/s\n", median(read_gbs));
  std::printf("  bandwidth floor                %10.1f tokens/s\n", floor_tps);
  std::printf("  decode / floor                 %10.2f   (target >= 0.85)\n", decode / floor_tps);
  // Speculative decoding: plain and speculative decode of a continuation that repeats
  // and of prose (the peer prompt), alternating, and the verify step's cost.
  struct Pair {
    std::vector<double> plain, spec, per_pass, accept;
  } rep, prose;
  for (int r = 0; r < a.reps; ++r) {
    for (auto [prompt, pair] : {std::pair{&p_repeat, &rep}, std::pair{&p64, &prose}}) {
      pair->plain.push_back(decode_run(model, *prompt, a.tokens, 0).tokens_per_s);
      const Decode d = decode_run(model, *prompt, a.tokens, a.speculate);
      pair->spec.push_back(d.tokens_per_s);
      pair->per_pass.push_back(d.stats.tokens_per_pass());
      pair->accept.push_back(d.stats.acceptance_rate());
    }
  }
  std::printf("  speculative decode, up to %d drafts (prompt lookup), %d tokens:\n", a.speculate, a.tokens);
  for (auto [what, pair] : {std::pair{"repeating list", &rep}, std::pair{"prose (peer prompt)", &prose}}) {
    std::printf("    %-20s plain %6.1f tokens/s, speculative %6.1f tokens/s (%.2fx); %.2f tokens per pass, "
                "%.0f%% of drafts accepted\n",
                what, median(pair->plain), median(pair->spec), median(pair->spec) / median(pair->plain),
                median(pair->per_pass), 100 * median(pair->accept));
  }
  // Sampling runs on the host: each step reads the logits back and chooses there.
  // Greedy and sampled decode alternate; then the read-back and the choice alone, on
  // the last step's logits.
  const models::SamplingParams sampled{.temperature = 0.8f, .top_p = 0.95f, .seed = 1};
  std::vector<double> greedy_tps, sampled_tps, read_ms, choose_ms;
  for (int r = 0; r < a.reps; ++r) {
    greedy_tps.push_back(decode_run(model, p64, a.tokens, 0).tokens_per_s);
    sampled_tps.push_back(decode_run(model, p64, a.tokens, 0, sampled).tokens_per_s);
    const auto t_read = Clock::now();
    const std::vector<float> logits = or_die(model.logits(), "logits");
    read_ms.push_back(seconds_since(t_read) * 1e3);
    const auto t_choose = Clock::now();
    or_die(models::choose_token(logits, sampled, p64, p64.size()), "choose");
    choose_ms.push_back(seconds_since(t_choose) * 1e3);
  }
  std::printf("  sampled decode (T 0.8, top-p 0.95) %6.1f tokens/s, greedy %6.1f (%.2fx); per token on the host: "
              "logits read back %.2f ms, choice %.2f ms\n",
              median(sampled_tps), median(greedy_tps), median(sampled_tps) / median(greedy_tps), median(read_ms),
              median(choose_ms));
  // Speculative decoding: the verify step's cost against a plain step.
  std::vector<int> sizes;
  for (int n : {1, 2, 4, 8, 16}) {
    if (n <= static_cast<int>(model.max_verify_tokens())) sizes.push_back(n);
  }
  const auto costs = verify_costs(model, p64, sizes, 4 * a.reps + 1);
  const double step_s = costs.at(0).first;
  std::printf("  decode step at position 64     %10.2f ms (%zu launches; verify step %zu)\n", step_s * 1e3,
              model.launches_per_step(), model.verify_sequence() ? model.verify_sequence()->launches_per_call() : 0);
  // The floor of a verify step of 8 tokens on these host threads: its products alone
  // (every weight times 8 vectors) at the FMA probe's peak, with no decoding at all.
  const double macs_per_token = matmul_flops_per_token(c) / 2 + double(c.vocab) * c.hidden;
  const double fma_floor_s = 2 * 8 * macs_per_token / (fma_peak * 1e9);
  std::printf("  8 tokens' products at the FMA peak %6.2f ms  %5.2fx a decode step (the f32 floor of verify 8)\n",
              fma_floor_s * 1e3, fma_floor_s / step_s);
  for (int n : sizes) {
    std::printf("  verify step of %2d tokens       %10.2f ms  %5.2fx the decode step next to it%s\n", n,
                costs.at(n).first * 1e3, costs.at(n).second, n == 8 ? "  (target <= 1.5)" : "");
  }
  // Timed with the model's device gone, so its host threads do not compete.
  const uint32_t T = model.max_prefill_chunk();
  const models::Gemma3Config config = c;
  sim.reset();
  {
    // Many sequences per pass: a model with the batched step over a pool of 16
    // sequences x 128 positions (16 each fed, then 32 timed), medians of the reps.
    constexpr int kFed = 16, kSteps = 32;
    std::shared_ptr<models::Gemma3Model> batched = load_batched(file, cores, mo);
    batched_decode_tps(*batched, p64, 16, kFed, 4);  // every pool page touched once
    std::printf("  batched decode, paged KV (%u-position blocks): tokens/s over all B sequences, and that over B x\n"
                "  the one-sequence decode above (%.1f) and over B x its bandwidth floor (%.1f)\n",
                batched->kv_block_positions(), decode, floor_tps);
    for (uint32_t B : {1u, 2u, 4u, 8u, 16u}) {
      std::vector<double> tps;
      for (int r = 0; r < a.reps; ++r) tps.push_back(batched_decode_tps(*batched, p64, B, kFed, kSteps));
      std::printf("    %2u sequences                %10.1f tokens/s  %5.2fx %u x decode, %5.2fx %u x floor\n", B,
                  median(tps), median(tps) / (B * decode), B, median(tps) / (B * floor_tps), B);
    }
    std::printf("  engine, 64-token prompts then 32 tokens each (llama-batched-bench's figure): tokens/s over all\n");
    for (uint32_t B : {1u, 2u, 4u, 8u, 16u}) {
      std::vector<double> tps;
      for (int r = 0; r < a.reps; ++r) tps.push_back(engine_decode_tps(batched, p512, B, 64, 32));
      std::printf("    %2u requests                 %10.1f tokens/s\n", B, median(tps));
    }
    // Continuous batching: a new request's 64-token prompt goes through the paged
    // prefill chunk between the decode steps of the running ones.
    std::vector<double> idle, busy;
    for (int r = 0; r < a.reps; ++r) {
      idle.push_back(engine_ttft(batched, p64, 64, 0));
      busy.push_back(engine_ttft(batched, p64, 64, 8));
    }
    std::printf("  engine time to first token, 64-token prompt: idle %.1f ms, with 8 decoding %.1f ms (%.2fx; "
                "target <= 2)\n",
                median(idle) * 1e3, median(busy) * 1e3, median(busy) / median(idle));
  }
  if (T > 0) print_breakdown(file, config, cores, T, T / median(p512_tps));
  print_verify_breakdown(file, config, cores, 8, median(read_gbs));
  return 0;
}
