// Devices in one process: the in-process communicator's collectives next to a host
// memcpy of the same bytes, and tensor-parallel Gemma-3 decode at N = 1, 2, 4 with
// its weight bytes per device, the collective time per token and a model of the
// speed-up on devices with their own memory bandwidth. Medians.
//
//   npurt_parallel_bench [--model PATH] [--tokens N] [--reps R] [--cores C]
//
// On a machine whose devices share its cores and memory bus (this simulator on a small
// host), wall-clock speed-up is not expected: the figures say where the time goes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "must.h"
#include "npurt/comm/device_group.h"
#include "npurt/hal/handles.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/tokenizer.h"

namespace {

using namespace npurt;
using Clock = std::chrono::steady_clock;
using bench::must;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One buffer and stream per rank of a group.
struct GroupBuffers {
  std::vector<Buffer> buffers;
  std::vector<hal::Stream> streams;
};

GroupBuffers group_buffers(comm::DeviceGroup& g, uint64_t bytes) {
  GroupBuffers out;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> values(bytes / 4);
  for (float& v : values) v = d(rng);
  for (int r = 0; r < g.size(); ++r) {
    Runtime& rt = g.runtime(r);
    out.buffers.push_back(must(rt.memory().create_buffer(bytes)));
    {
      WriteGuard w = must(rt.memory().overwrite(out.buffers.back().view()));
      std::memcpy(w.bytes().data(), values.data(), bytes);
    }
    must(rt.memory().to_device(out.buffers.back().view()));
    out.streams.push_back(must(hal::Stream::create(rt.shared_device())));
  }
  return out;
}

// Median seconds of one all-reduce of `bytes` f32 on every rank: enqueued on each,
// then every stream synchronized.
double all_reduce_seconds(comm::DeviceGroup& g, uint64_t bytes, int reps) {
  GroupBuffers b = group_buffers(g, bytes);
  std::vector<double> s;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    for (int r = 0; r < g.size(); ++r) {
      must(g.communicator(r)->all_reduce(b.streams[r].id(), b.buffers[r].view(), isa::DType::kF32));
    }
    for (int r = 0; r < g.size(); ++r) must(g.runtime(r).device().stream_synchronize(b.streams[r].id()));
    if (i >= 2) s.push_back(seconds_since(t0));  // the first runs warm the pages and threads
  }
  return median(s);
}

// Median seconds of a host memcpy of `bytes` (the in-process peer: the bytes one
// device's share moves, copied once by the host).
double memcpy_seconds(uint64_t bytes, int reps) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  std::vector<double> s;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    volatile uint8_t sink = b[bytes / 2];
    (void)sink;
    if (i >= 2) s.push_back(seconds_since(t0));
  }
  return median(s);
}

void bench_collectives(uint32_t cores, int reps) {
  std::printf("In-process all-reduce (f32, sum) vs a host memcpy of the same bytes, medians of %d\n", reps);
  std::printf("  %-8s %-7s %12s %12s %12s %12s %8s\n", "devices", "bytes", "latency us", "GB/s", "memcpy us",
              "memcpy GB/s", "ratio");
  for (int n : {2, 4}) {
    auto g = must(comm::DeviceGroup::create_sim(
        n, {.num_cores = cores, .global_memory_bytes = 256ull << 20, .host_threads = 1}));
    for (uint64_t bytes : {uint64_t{640 * 4}, uint64_t{4} << 20}) {
      const double t = all_reduce_seconds(*g, bytes, reps), m = memcpy_seconds(bytes, reps);
      std::printf("  %-8d %-7s %12.1f %12.2f %12.2f %12.2f %8.3f\n", n, bytes < 4096 ? "2.5KiB" : "4MiB", t * 1e6,
                  bytes / t / 1e9, m * 1e6, bytes / m / 1e9, (bytes / t) / (bytes / m));
    }
  }
}

struct DecodeFigures {
  double tokens_per_s = 0;
  uint64_t device_weight_bytes = 0;
  double collective_s_per_token = 0;
};

DecodeFigures bench_decode(const models::GgufFile& file, const std::vector<int32_t>& prompt, int n, uint32_t cores,
                           int tokens, int reps) {
  models::Gemma3Options mo{.max_context = static_cast<uint32_t>(prompt.size() + tokens + 1), .prefill_chunk = 64};
  hal::SimOptions sim = must(models::gemma3_sim_options(file, cores, mo, n));
  std::unique_ptr<models::Gemma3Model> model;
  std::shared_ptr<comm::DeviceGroup> group;
  if (n == 1) {
    model = must(models::Gemma3Model::load_sim(file, cores, mo));
  } else {
    sim.host_threads = 1;
    group = must(comm::DeviceGroup::create_sim(n, sim));
    std::vector<std::shared_ptr<comm::Communicator>> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(group->communicator(r));
    model = must(models::Gemma3Model::load_parallel(file, ranks, mo));
  }
  DecodeFigures f;
  std::vector<double> tps;
  for (int r = 0; r < reps; ++r) {
    models::GenerateStats st;
    must(models::generate(*model, prompt, tokens, nullptr, {}, &st));
    tps.push_back(st.decode_steps / st.decode_seconds);
  }
  f.tokens_per_s = median(tps);
  f.device_weight_bytes = model->weight_bytes_per_step();
  if (group) {
    // A decode step's collectives: the embedding's and two per layer's all-reduce of one
    // hidden vector, and the 8-byte gather of the argmax pairs (timed as an all-reduce).
    const models::Gemma3Config& c = model->config();
    const double hidden = all_reduce_seconds(*group, static_cast<uint64_t>(c.hidden) * 4, 50);
    const double pair = all_reduce_seconds(*group, 8, 50);
    f.collective_s_per_token = (1 + 2 * c.n_layers) * hidden + pair;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/gemma-3-270m-q4_k_m.gguf";
  if (const char* env = std::getenv("NPURT_MODEL")) model_path = env;
  int tokens = 32, reps = 3;
  uint32_t cores = 2;
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (has && !std::strcmp(argv[i], "--model")) model_path = argv[++i];
    else if (has && !std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[++i]);
    else if (has && !std::strcmp(argv[i], "--cores")) cores = static_cast<uint32_t>(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "parallel_bench: unknown or incomplete option %s\n", argv[i]);
      return 2;
    }
  }
  if (tokens < 2 || reps < 1 || cores < 1) {
    std::fprintf(stderr, "parallel_bench: --tokens must be >= 2, --reps and --cores >= 1\n");
    return 2;
  }
  bench_collectives(cores, 200);
  if (!std::filesystem::is_regular_file(model_path)) {
    std::fprintf(stderr, "parallel_bench: no model at %s (run `make model` or pass --model): decode skipped\n",
                 model_path.c_str());
    return 0;
  }
  models::GgufFile file = must(models::GgufFile::open(model_path));
  models::Tokenizer tok = must(models::Tokenizer::from_gguf(file));
  const std::vector<int32_t> prompt = must(tok.encode("The capital of France is"));
  std::printf("\nTensor-parallel Gemma-3 decode, one process (%s, %u cores per device, %d tokens, %d reps)\n",
              model_path.c_str(), cores, tokens, reps);
  std::printf("  %-8s %12s %14s %16s %14s %14s\n", "devices", "tokens/s", "MB/device/tok", "collective ms/tok",
              "model tokens/s", "model speed-up");
  DecodeFigures one;
  for (int n : {1, 2, 4}) {
    const DecodeFigures f = bench_decode(file, prompt, n, cores, tokens, reps);
    if (n == 1) one = f;
    // Devices with their own memory bandwidth: the step's time scales with the bytes a
    // device reads (decode is bandwidth-bound), plus the collectives measured here.
    const double t1 = 1 / one.tokens_per_s;
    const double tn = t1 * f.device_weight_bytes / one.device_weight_bytes + f.collective_s_per_token;
    std::printf("  %-8d %12.1f %14.1f %16.3f %14.1f %14.2f\n", n, f.tokens_per_s, f.device_weight_bytes / 1e6,
                f.collective_s_per_token * 1e3, 1 / tn, t1 / tn);
  }
  return 0;
}
