// `npurt generate`: greedy text generation with Gemma-3 from a GGUF file, streamed to
// stdout as tokens are chosen, with load and speed figures on stderr.
#include "cli/generate.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "npurt/comm/device_group.h"
#include "npurt/comm/mpi.h"
#include "npurt/hal/driver.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/gguf.h"
#include "npurt/models/host_oracle.h"
#include "npurt/models/sampler.h"
#include "npurt/models/token_model.h"
#include "npurt/models/tokenizer.h"

#ifndef NPURT_DEFAULT_MODEL
#define NPURT_DEFAULT_MODEL "models/gemma-3-270m-q4_k_m.gguf"
#endif

namespace npurt::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int fail(const std::string& what) {
  std::fprintf(stderr, "npurt generate: %s\n", what.c_str());
  return 1;
}

// A one-line bar on stderr, redrawn at each whole percent; when stderr is not a
// terminal (a log file, CI), only the final line, so logs hold no redraws.
class ProgressBar {
 public:
  void update(uint64_t done, uint64_t total) {
    const int pct = total == 0 ? 100 : static_cast<int>(100 * done / total);
    if (pct == last_ || (pct < 100 && !tty_)) return;
    last_ = pct;
    constexpr int kWidth = 30;
    const int filled = pct * kWidth / 100;
    std::fprintf(stderr, "\rloading weights [%s%s] %3d%% %6.1f / %.1f MB", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), pct, done / 1e6, total / 1e6);
    if (pct == 100) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  int last_ = -1;
  bool tty_ = isatty(STDERR_FILENO) != 0;
};

double per_second(int n, double seconds) { return seconds > 0 ? n / seconds : 0; }

// The device model: on one device of the driver --device names, or split over a group.
StatusOr<std::unique_ptr<models::Gemma3Model>> load_device_model(const GenerateArgs& args,
                                                                 const models::GgufFile& file,
                                                                 const models::Gemma3Options& mo, ProgressBar& bar) {
  const auto progress = [&](uint64_t done, uint64_t total) { bar.update(done, total); };
  NPURT_ASSIGN_OR_RETURN(hal::DeviceSpec spec, models::gemma3_device_spec(file, args.cores, mo, args.devices));
  if (args.device_memory != 0) spec.memory_bytes = args.device_memory << 20;
  if (args.devices == 1) {
    NPURT_ASSIGN_OR_RETURN(std::shared_ptr<Runtime> runtime, Runtime::create(args.device, spec));
    return models::Gemma3Model::load(file, *runtime, mo, progress);
  }
  // Simulated devices share this machine's cores: one host thread each runs its kernels.
  if (args.device == "sim") spec.settings["host_threads"] = "1";
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<comm::DeviceGroup> group,
                         comm::DeviceGroup::create(args.device, args.devices, spec, {},
                                                   {.timeout = std::chrono::milliseconds(args.collective_timeout_ms)}));
  std::vector<std::shared_ptr<comm::Communicator>> ranks;
  for (int r = 0; r < group->size(); ++r) ranks.push_back(group->communicator(r));
  return models::Gemma3Model::load_parallel(file, ranks, mo, progress);
}

}  // namespace

std::string default_model_path() {
  if (const char* env = std::getenv("NPURT_MODEL"); env != nullptr && *env != '\0') return env;
  return NPURT_DEFAULT_MODEL;
}

namespace {

// What every backend starts from: the file, its tokenizer and the prompt's ids.
struct Inputs {
  std::string path;
  std::unique_ptr<models::GgufFile> file;
  std::unique_ptr<models::Tokenizer> tokenizer;
  std::vector<int32_t> prompt;
};

Status open_inputs(const GenerateArgs& args, Inputs& in) {
  in.path = args.model.empty() ? default_model_path() : args.model;
  if (!std::filesystem::is_regular_file(in.path)) {
    return not_found("no model file at " + in.path + " (run `make model`, pass --model PATH or set NPURT_MODEL)");
  }
  StatusOr<models::GgufFile> file = models::GgufFile::open(in.path);
  if (!file.ok()) return file.status();  // it names the path
  in.file = std::make_unique<models::GgufFile>(std::move(file).value());
  StatusOr<models::Tokenizer> tok = models::Tokenizer::from_gguf(*in.file);
  if (!tok.ok()) return tok.status().with_context(in.path);
  in.tokenizer = std::make_unique<models::Tokenizer>(std::move(tok).value());
  NPURT_ASSIGN_OR_RETURN(in.prompt, in.tokenizer->encode(args.prompt));
  if (in.prompt.empty()) return invalid_argument("the prompt encodes to no tokens");
  return ok_status();
}

// Drafts per verify step: speculation runs on one device only.
int speculation(const GenerateArgs& args) {
  const bool one_device = args.device != "host" && args.devices == 1 && args.tp == 0;
  return one_device ? args.speculate : 0;
}

models::Gemma3Options model_options(const GenerateArgs& args, const Inputs& in) {
  models::Gemma3Options mo;
  mo.max_context = static_cast<uint32_t>(in.prompt.size()) + static_cast<uint32_t>(args.max_tokens);
  mo.prefill_chunk = args.prefill_chunk;
  mo.kv_cache = args.kv_cache == "f16" ? isa::DType::kF16 : args.kv_cache == "bf16" ? isa::DType::kBF16 : isa::DType::kF32;
  // A verify step only when drafting: it is one more sequence to compile at load.
  mo.verify_tokens = speculation(args) > 0 ? static_cast<uint32_t>(speculation(args) + 1) : 0;
  return mo;
}

// One device per MPI rank. Every rank opens the file and loads its shard; each tells
// the others whether it could (Communicator::agree), so a rank whose file is missing
// or corrupt makes every rank fail, naming it, instead of leaving them waiting.
struct MpiRank {
  std::unique_ptr<comm::MpiSession> session;  // finalizes MPI last
  std::shared_ptr<comm::Communicator> comm;
  std::string label;  // "rank 1 of 2"
};

Status start_mpi(const GenerateArgs& args, const Inputs& in, const Status& opened, MpiRank& mpi) {
  NPURT_ASSIGN_OR_RETURN(mpi.session, comm::MpiSession::init(nullptr, nullptr));
  mpi.label = "rank " + std::to_string(mpi.session->world_rank()) + " of " + std::to_string(mpi.session->world_size());
  if (mpi.session->world_size() != args.tp) {
    return invalid_argument("--tp " + std::to_string(args.tp) + " but mpirun started " +
                            std::to_string(mpi.session->world_size()) + " ranks");
  }
  hal::DeviceSpec spec{.cores = args.cores};
  if (opened.ok()) {
    NPURT_ASSIGN_OR_RETURN(spec, models::gemma3_device_spec(*in.file, args.cores, model_options(args, in), args.tp));
  }
  if (args.device_memory != 0) spec.memory_bytes = args.device_memory << 20;
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<Runtime> runtime, Runtime::create(args.device, spec));
  NPURT_ASSIGN_OR_RETURN(mpi.comm, comm::MpiCommunicator::create(
                                       runtime, {.timeout = std::chrono::milliseconds(args.collective_timeout_ms)}));
  return mpi.comm->agree(opened);
}

// One line per token to stderr: its text, its log-probability, then the most likely
// tokens with theirs.
void print_logprobs(const models::Tokenizer& tok, const std::vector<int32_t>& tokens,
                    const std::vector<models::TokenChoice>& choices) {
  for (size_t i = 0; i < tokens.size() && i < choices.size(); ++i) {
    std::fprintf(stderr, "logprobs %3zu %-16s %9.4f |", i, ("\"" + tok.token_text(tokens[i]) + "\"").c_str(),
                 choices[i].logprob);
    for (const models::TokenLogprob& t : choices[i].top) {
      std::fprintf(stderr, " \"%s\" %.4f", tok.token_text(t.token).c_str(), t.logprob);
    }
    std::fputc('\n', stderr);
  }
}

}  // namespace

int run_generate(const GenerateArgs& args) {
  if (args.device != "host") {
    if (const auto driver = hal::find_driver(args.device); !driver.ok()) {
      return fail("--device: " + driver.status().message() + "; or host, the f32 host oracle");
    }
  }
  if (args.max_tokens < 0) return fail("--max-tokens must not be negative");
  if (const Status s = models::check_sampling(args.sampling); !s.ok()) return fail(s.to_string());
  if (args.tp > 0 && (args.devices != 1 || args.device == "host")) {
    return fail("--tp runs one device per MPI rank: it takes neither --devices nor --device host");
  }
  if (args.devices != 1 && args.device == "host") {
    return fail("--devices splits the model over devices: not with --device host");
  }
  if (args.speculate_set && args.speculate > 0 && speculation(args) == 0) {
    return fail("--speculate verifies drafts on one device: not with --device host, --devices or --tp");
  }
  const auto t_open = std::chrono::steady_clock::now();
  Inputs in;
  Status opened = open_inputs(args, in);
  MpiRank mpi;
  // A failed rank leaves at once, without MPI_Finalize: that would wait for the peer
  // that failed (or died). Every rank prints its own error.
  const auto fail_rank = [&](const std::string& what) {
    const int rc = fail((mpi.label.empty() ? "" : mpi.label + ": ") + what);
    if (mpi.session) {
      std::fflush(nullptr);
      std::_Exit(rc);
    }
    return rc;
  };
  if (args.tp > 0) {
    Status s = start_mpi(args, in, opened, mpi);
    if (!s.ok()) return fail_rank(s.to_string());
  }
  if (!opened.ok()) return fail_rank(opened.to_string());
  const std::string& path = in.path;
  const models::Tokenizer* tok = in.tokenizer.get();
  const std::vector<int32_t>* prompt = &in.prompt;
  const bool speaks = mpi.comm == nullptr || mpi.comm->rank() == 0;  // rank 0 prints

  // Whichever backend runs, it is a TokenModel.
  std::unique_ptr<models::Gemma3Model> sim;
  std::unique_ptr<models::HostOracle> oracle;
  std::unique_ptr<models::HostTokenModel> host_model;
  models::TokenModel* model = nullptr;
  if (args.device != "host") {
    ProgressBar bar;
    const models::Gemma3Options mo = model_options(args, in);
    StatusOr<std::unique_ptr<models::Gemma3Model>> loaded =
        mpi.comm ? models::Gemma3Model::load_parallel(*in.file, {mpi.comm}, mo,
                                                      [&](uint64_t done, uint64_t total) {
                                                        if (speaks) bar.update(done, total);
                                                      })
                 : load_device_model(args, *in.file, mo, bar);
    if (!loaded.ok()) return fail_rank(path + ": " + loaded.status().to_string());
    sim = std::move(loaded).value();
    model = sim.get();
  } else {
    StatusOr<models::HostOracle> o = models::HostOracle::load(*in.file);
    if (!o.ok()) return fail(path + ": " + o.status().to_string());
    oracle = std::make_unique<models::HostOracle>(std::move(o).value());
    host_model = std::make_unique<models::HostTokenModel>(*oracle);
    model = host_model.get();
  }
  const double load_seconds = seconds_since(t_open);

  if (speaks) std::fputs(args.prompt.c_str(), stdout);
  std::fflush(stdout);
  models::GenerateStats stats;
  StatusOr<std::vector<int32_t>> out = models::generate(
      *model, *prompt, args.max_tokens, tok,
      [&](int32_t t) {
        if (!speaks) return;
        std::fputs(tok->token_text(t).c_str(), stdout);
        std::fflush(stdout);
      },
      &stats, {.speculate = speculation(args), .drafter = {}, .sampling = args.sampling, .stop_strings = args.stop});
  if (speaks) std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!out.ok()) return fail_rank(out.status().to_string());
  if (!speaks) return 0;
  const int devices = args.tp > 0 ? args.tp : args.devices;
  std::fprintf(stderr,
               "device %s%s%s: load %.2f s; prefill %d tokens, %.1f tokens/s (%s); time to first token %.3f s; "
               "decode %d tokens, %.1f tokens/s\n",
               args.device.c_str(), devices > 1 ? (" x" + std::to_string(devices)).c_str() : "",
               args.tp > 0 ? " over MPI" : "", load_seconds, stats.prompt_tokens,
               per_second(stats.prompt_tokens, stats.prefill_seconds),
               args.device != "host" && args.prefill_chunk > 0
                   ? ("chunks of " + std::to_string(sim->prefill_chunk())).c_str()
                   : "token by token",
               stats.prefill_seconds, stats.decoded_tokens(), per_second(stats.decoded_tokens(), stats.decode_seconds));
  if (args.sampling.top_logprobs > 0) print_logprobs(*tok, *out, stats.choices);
  std::fprintf(stderr, "finish: %s\n", models::finish_reason_name(stats.finish_reason));
  if (speculation(args) > 0) {
    std::fprintf(stderr,
                 "speculation: up to %d drafts; %d verify steps, %.2f tokens each; drafts accepted %d of %d (%.0f%%); "
                 "%d plain steps; %.2f tokens per pass over the weights\n",
                 speculation(args), stats.verify_steps, stats.tokens_per_verify_step(), stats.accepted_tokens,
                 stats.drafted_tokens, 100 * stats.acceptance_rate(), stats.decode_steps, stats.tokens_per_pass());
  }
  return 0;
}

}  // namespace npurt::cli
