// Devices in one process: the in-process communicator's collectives next to a host
// memcpy of the same bytes, and tensor-parallel Gemma-3 decode at N = 1, 2, 4 with
// its weight bytes per device, the collective time per token and a model of the
// speed-up on devices with their own memory bandwidth. Medians.
//
//   npurt_parallel_bench [--model PATH] [--tokens N] [--reps R] [--cores C]
//   mpirun -np N npurt_parallel_bench --mpi [...]   (decode over MPI, one device per rank)
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
#include "npurt/comm/mpi.h"
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

// Median seconds of one all-reduce of `bytes` f32 on every rank this process drives:
// enqueued on each, then every stream synchronized.
double all_reduce_seconds(const std::vector<std::shared_ptr<comm::Communicator>>& ranks, uint64_t bytes, int reps) {
  std::vector<Buffer> buffers;
  std::vector<hal::Stream> streams;
  for (const auto& c : ranks) {
    Runtime& rt = c->runtime();
    buffers.push_back(must(rt.memory().create_buffer(bytes)));
    std::vector<float> ones(bytes / 4, 1.0f);
    {
      WriteGuard w = must(rt.memory().overwrite(buffers.back().view()));
      std::memcpy(w.bytes().data(), ones.data(), bytes);
    }
    streams.push_back(must(hal::Stream::create(rt.shared_device())));
  }
  std::vector<double> s;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    for (size_t r = 0; r < ranks.size(); ++r) {
      must(ranks[r]->all_reduce(streams[r].id(), buffers[r].view(), isa::DType::kF32));
    }
    for (size_t r = 0; r < ranks.size(); ++r) must(streams[r].device().stream_synchronize(streams[r].id()));
    if (i >= 2) s.push_back(seconds_since(t0));  // the first runs warm the pages and threads
  }
  return median(s);
}

// Median seconds of the streams' own round trip, the floor under any collective on
// them: an empty host function enqueued on every rank's stream, then each synchronized.
double stream_round_trip_seconds(const comm::DeviceGroup& g, int reps) {
  std::vector<hal::Stream> streams;
  for (int r = 0; r < g.size(); ++r) streams.push_back(must(hal::Stream::create(g.runtime(r).shared_device())));
  std::vector<double> s;
  for (int i = 0; i < reps + 2; ++i) {
    const auto t0 = Clock::now();
    for (hal::Stream& st : streams) must(st.device().enqueue_host_function(st.id(), [](const Status&) { return ok_status(); }));
    for (hal::Stream& st : streams) must(st.device().stream_synchronize(st.id()));
    if (i >= 2) s.push_back(seconds_since(t0));
  }
  return median(s);
}

std::vector<std::shared_ptr<comm::Communicator>> ranks_of(const comm::DeviceGroup& g) {
  std::vector<std::shared_ptr<comm::Communicator>> ranks;
  for (int r = 0; r < g.size(); ++r) ranks.push_back(g.communicator(r));
  return ranks;
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
  std::printf("(latency: sums on the streams' threads, the default; kernel sums: CommOptions::host_sums off)\n");
  std::printf("  %-8s %-7s %12s %12s %12s %12s %8s %16s %16s\n", "devices", "bytes", "latency us", "GB/s",
              "memcpy us", "memcpy GB/s", "ratio", "kernel sums us", "stream floor us");
  for (int n : {2, 4}) {
    const hal::DeviceSpec spec{.cores = cores, .memory_bytes = 256ull << 20, .settings = {{"host_threads", "1"}}};
    auto g = must(comm::DeviceGroup::create("sim", n, spec));
    auto kernels = must(comm::DeviceGroup::create("sim", n, spec, {}, {.host_sums = false}));
    for (uint64_t bytes : {uint64_t{640 * 4}, uint64_t{4} << 20}) {
      const double t = all_reduce_seconds(ranks_of(*g), bytes, reps), m = memcpy_seconds(bytes, reps);
      const double k = all_reduce_seconds(ranks_of(*kernels), bytes, reps);
      const double floor = stream_round_trip_seconds(*g, reps);
      std::printf("  %-8d %-7s %12.1f %12.2f %12.2f %12.2f %8.3f %16.1f %16.1f\n", n, bytes < 4096 ? "2.5KiB" : "4MiB",
                  t * 1e6, bytes / t / 1e9, m * 1e6, bytes / m / 1e9, (bytes / t) / (bytes / m), k * 1e6,
                  floor * 1e6);
    }
  }
}

struct DecodeFigures {
  double tokens_per_s = 0;
  uint64_t device_weight_bytes = 0;
  double collective_s_per_token = 0;
};

// Decode over `ranks` (empty: one device of its own); every rank of the group runs it.
DecodeFigures bench_decode(const models::GgufFile& file, const models::Gemma3Options& mo,
                           const std::vector<int32_t>& prompt, std::vector<std::shared_ptr<comm::Communicator>> ranks,
                           uint32_t cores, int tokens, int reps) {
  std::unique_ptr<models::Gemma3Model> model =
      ranks.empty() ? must(models::Gemma3Model::load_on(file, "sim", cores, mo))
                    : must(models::Gemma3Model::load_parallel(file, ranks, mo));
  DecodeFigures f;
  std::vector<double> tps;
  for (int r = 0; r < reps; ++r) {
    models::GenerateStats st;
    must(models::generate(*model, prompt, tokens, nullptr, {}, &st));
    tps.push_back(st.decode_steps / st.decode_seconds);
  }
  f.tokens_per_s = median(tps);
  f.device_weight_bytes = model->weight_bytes_per_step();
  if (!ranks.empty()) {
    // A decode step's collectives: the embedding's and two per layer's all-reduce of one
    // hidden vector, and the 8-byte gather of the argmax pairs (timed as an all-reduce).
    const models::Gemma3Config& c = model->config();
    const double hidden = all_reduce_seconds(ranks, static_cast<uint64_t>(c.hidden) * 4, 50);
    const double pair = all_reduce_seconds(ranks, 8, 50);
    f.collective_s_per_token = (1 + 2 * c.n_layers) * hidden + pair;
  }
  return f;
}

void print_decode_header(const char* how, const std::string& path, uint32_t cores, int tokens, int reps) {
  std::printf("\nTensor-parallel Gemma-3 decode, %s (%s, %u cores per device, %d tokens, %d reps)\n", how,
              path.c_str(), cores, tokens, reps);
  std::printf("  %-8s %12s %14s %18s %14s %14s\n", "devices", "tokens/s", "MB/device/tok", "collective ms/tok",
              "model tokens/s", "model speed-up");
}

// Devices with their own memory bandwidth: the step's time scales with the bytes a
// device reads (decode is bandwidth-bound), plus the collectives measured here.
void print_decode_row(int n, const DecodeFigures& f, const DecodeFigures& one) {
  const double t1 = 1 / one.tokens_per_s;
  const double tn = t1 * f.device_weight_bytes / one.device_weight_bytes + f.collective_s_per_token;
  std::printf("  %-8d %12.1f %14.1f %18.3f %14.1f %14.2f\n", n, f.tokens_per_s, f.device_weight_bytes / 1e6,
              f.collective_s_per_token * 1e3, 1 / tn, t1 / tn);
}

models::Gemma3Options decode_options(const std::vector<int32_t>& prompt, int tokens) {
  return {.max_context = static_cast<uint32_t>(prompt.size() + tokens + 1), .prefill_chunk = 64};
}

// One process: N = 1, 2, 4 devices of a group.
void bench_decode_in_process(const models::GgufFile& file, const std::string& path, const std::vector<int32_t>& prompt,
                             uint32_t cores, int tokens, int reps) {
  print_decode_header("one process", path, cores, tokens, reps);
  const models::Gemma3Options mo = decode_options(prompt, tokens);
  DecodeFigures one;
  for (int n : {1, 2, 4}) {
    std::shared_ptr<comm::DeviceGroup> group;
    if (n > 1) {
      hal::DeviceSpec sim = must(models::gemma3_device_spec(file, cores, mo, n));
      sim.settings["host_threads"] = "1";  // the devices share the machine's cores
      group = must(comm::DeviceGroup::create("sim", n, sim));
    }
    const DecodeFigures f = bench_decode(file, mo, prompt, group ? ranks_of(*group) : decltype(ranks_of(*group)){},
                                         cores, tokens, reps);
    if (n == 1) one = f;
    print_decode_row(n, f, one);
  }
}

// Over MPI: one device per rank, all ranks of the job. Then rank 0 alone runs the
// single-device baseline while the others wait in agree(), which naps between polls
// (a rank busy in MPI would take a core from the baseline).
int bench_decode_mpi(int argc, char** argv, const models::GgufFile& file, const std::string& path,
                     const std::vector<int32_t>& prompt, uint32_t cores, int tokens, int reps) {
  auto session = must(comm::mpi_init(argc, argv));
  const int n = session->world_size(), me = session->world_rank();
  const models::Gemma3Options mo = decode_options(prompt, tokens);
  auto runtime = must(Runtime::create("sim", must(models::gemma3_device_spec(file, cores, mo, n))));
  std::shared_ptr<comm::Communicator> c = must(comm::MpiCommunicator::create(runtime));
  const DecodeFigures f = bench_decode(file, mo, prompt, {c}, cores, tokens, reps);
  DecodeFigures one;
  if (me == 0) one = bench_decode(file, mo, prompt, {}, cores, tokens, reps);
  must(c->agree(ok_status()));
  if (me == 0) {
    print_decode_header("over MPI, one device per rank", path, cores, tokens, reps);
    print_decode_row(1, one, one);
    print_decode_row(n, f, one);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = "models/gemma-3-270m-q4_k_m.gguf";
  if (const char* env = std::getenv("NPURT_MODEL")) model_path = env;
  int tokens = 32, reps = 3;
  uint32_t cores = 2;
  bool mpi = false;
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--mpi")) mpi = true;
    else if (has && !std::strcmp(argv[i], "--model")) model_path = argv[++i];
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
  if (!std::filesystem::is_regular_file(model_path)) {
    std::fprintf(stderr, "parallel_bench: no model at %s (run `make model` or pass --model)\n", model_path.c_str());
    if (mpi) return 1;
  }
  if (!mpi) bench_collectives(cores, 200);
  if (!std::filesystem::is_regular_file(model_path)) return 0;
  models::GgufFile file = must(models::GgufFile::open(model_path));
  models::Tokenizer tok = must(models::Tokenizer::from_gguf(file));
  const std::vector<int32_t> prompt = must(tok.encode("The capital of France is"));
  if (mpi) return bench_decode_mpi(argc, argv, file, model_path, prompt, cores, tokens, reps);
  bench_decode_in_process(file, model_path, prompt, cores, tokens, reps);
  return 0;
}
