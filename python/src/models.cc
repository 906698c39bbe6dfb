// npurt.Gemma3: Gemma-3 greedy decoding from a GGUF file, on a simulated NPU of its
// own, tensor parallel over a group of them, or on the f32 host oracle, with
// generate() streaming text to a callback.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <variant>
#include <mutex>
#include <optional>
#include <system_error>

#include "common.h"
#include "npurt/comm/device_group.h"
#include "npurt/models/batch_engine.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/gguf.h"
#include "npurt/models/host_oracle.h"
#include "npurt/models/sampler.h"
#include "npurt/models/token_model.h"
#include "npurt/models/tokenizer.h"

// The checkout and build tree this extension was built from (python/CMakeLists.txt),
// and the file `make model` installs in that checkout.
#ifndef NPURT_SOURCE_DIR
#define NPURT_SOURCE_DIR ""
#endif
#ifndef NPURT_BUILD_DIR
#define NPURT_BUILD_DIR ""
#endif
#ifndef NPURT_DEFAULT_MODEL
#define NPURT_DEFAULT_MODEL ""
#endif

namespace npurt::python {
namespace {

namespace fs = std::filesystem;

// Whether `path` is `root` or lies below it (both resolved; false if either is empty).
bool is_within(const fs::path& path, const std::string& root) {
  if (root.empty() || path.empty()) return false;
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(root, ec);
  if (ec) return false;
  const fs::path rel = path.lexically_relative(r);
  return !rel.empty() && *rel.begin() != "..";
}

// This extension's file (the shared object that holds this function).
fs::path extension_file() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&is_within), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  fs::path p = fs::weakly_canonical(info.dli_fname, ec);
  return ec ? fs::path() : p;
}

// The model npurt.Gemma3() loads without a path: $NPURT_MODEL if set; else, only when
// this package runs from the checkout (or build tree) it was built in, that checkout's
// models/ file. A package installed anywhere else has no default but NPURT_MODEL.
// When no file is there, NotFoundError names every place looked.
std::string default_model_path() {
  const std::string hint = "; pass a path or set NPURT_MODEL (`make model` installs the file)";
  if (const char* env = std::getenv("NPURT_MODEL"); env != nullptr && *env != '\0') {
    if (fs::is_regular_file(env)) return env;
    raise_status(not_found(std::string("gemma3: no model file at ") + env + " (from NPURT_MODEL)" + hint));
  }
  const fs::path self = extension_file();
  const std::string checkout_model = NPURT_DEFAULT_MODEL;
  if (!checkout_model.empty() && (is_within(self, NPURT_SOURCE_DIR) || is_within(self, NPURT_BUILD_DIR))) {
    if (fs::is_regular_file(checkout_model)) return checkout_model;
    raise_status(not_found("gemma3: no model file: NPURT_MODEL is not set and " + checkout_model +
                           " (the models/ file of the checkout this package was built in) does not exist" + hint));
  }
  raise_status(not_found("gemma3: no model file: NPURT_MODEL is not set (this package, at " +
                         (self.empty() ? std::string("an unknown place") : self.parent_path().string()) +
                         ", runs outside the checkout it was built in, so it has no default file)" + hint));
}

// How generate() chooses tokens: models::SamplingParams and stop strings, from keywords.
struct Sampling {
  models::SamplingParams params;
  std::vector<std::string> stop;
};

Sampling sampling_of(float temperature, int top_k, float top_p, float min_p, float repetition_penalty,
                     float presence_penalty, float frequency_penalty, uint64_t seed,
                     const std::optional<std::vector<std::string>>& stop, int logprobs) {
  Sampling s;
  s.params = {.temperature = temperature,
              .top_k = top_k,
              .top_p = top_p,
              .min_p = min_p,
              .repetition_penalty = repetition_penalty,
              .presence_penalty = presence_penalty,
              .frequency_penalty = frequency_penalty,
              .seed = seed,
              .logprobs = logprobs > 0,
              .top_logprobs = logprobs};
  if (stop) s.stop = *stop;
  return s;
}

// Per choice a dict of token, logprob and top ((id, logprob) pairs), up to the first
// choice without log-probabilities (not asked for).
nb::list logprobs_list(const std::vector<models::TokenChoice>& choices) {
  nb::list out;
  for (const models::TokenChoice& c : choices) {
    if (std::isnan(c.logprob)) break;
    nb::list top;
    for (const models::TokenLogprob& t : c.top) top.append(nb::make_tuple(t.token, t.logprob));
    nb::dict e;
    e["token"] = c.token;
    e["logprob"] = c.logprob;
    e["top"] = top;
    out.append(e);
  }
  return out;
}

// Owns everything a loaded model uses (the file outlives the model). One generate() at a time (mu_), with the GIL released.
class Gemma3 {
 public:
  Gemma3(std::optional<std::string> path, const std::string& device, uint32_t cores, uint32_t max_context,
         uint32_t prefill_chunk, int devices, const std::string& kv_cache, uint32_t batch, uint32_t kv_blocks)
      : batch_(batch), kv_blocks_(kv_blocks) {
    if (device != "sim" && device != "host") {
      raise_status(invalid_argument("unknown device '" + device + "' (expected 'sim' or 'host')"));
    }
    if (kv_cache != "f32" && kv_cache != "f16" && kv_cache != "bf16") {
      raise_status(invalid_argument("kv_cache '" + kv_cache + "': expected 'f32', 'f16' or 'bf16'"));
    }
    kv_cache_ = kv_cache == "f16" ? isa::DType::kF16 : kv_cache == "bf16" ? isa::DType::kBF16 : isa::DType::kF32;
    if (batch > 0 && (device != "sim" || devices != 1)) {
      raise_status(invalid_argument("batch=" + std::to_string(batch) + " runs on one simulated NPU (device 'sim', devices=1)"));
    }
    if (device == "host" && devices != 1) {
      raise_status(invalid_argument("the host oracle runs on no NPU: devices must be 1, got " +
                                    std::to_string(devices)));
    }
    path_ = path ? *path : default_model_path();
    Status s;
    {
      nb::gil_scoped_release release;
      s = load(device, cores, max_context, prefill_chunk, devices);
    }
    check(s);
  }

  const std::string& path() const { return path_; }
  const models::Gemma3Config& config() const { return config_; }
  // NPUs the model is cut over (1 on the host oracle).
  int devices() const { return sim_ ? sim_->devices() : 1; }

  std::vector<int32_t> encode(const std::string& text) const { return take(tokenizer_->encode(text)); }
  std::string decode(const std::vector<int32_t>& ids) const { return tokenizer_->decode(ids); }

  // Tokens after `prompt` (ids), stopping at a stop token.
  std::vector<int32_t> generate_ids(const std::vector<int32_t>& prompt, int max_tokens, std::optional<int> speculate,
                                    const Sampling& sampling) {
    const models::GenerateOptions o = options(speculate, sampling);
    StatusOr<std::vector<int32_t>> out = ok_status();
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      out = models::generate(*model_, prompt, max_tokens, &*tokenizer_, first_token_clock([](int32_t) {}), &stats_, o);
    }
    return take(std::move(out));
  }

  // The text generated after `prompt`; `on_text` (if given) sees each token's text as
  // it is produced. An exception in it ends the call once generation returns.
  std::string generate(const std::string& prompt, int max_tokens,
                       const std::optional<std::function<void(std::string)>>& on_text,
                       std::optional<int> speculate, const Sampling& sampling) {
    const models::GenerateOptions o = options(speculate, sampling);
    const std::vector<int32_t> ids = encode(prompt);
    std::optional<nb::python_error> callback_error;
    StatusOr<std::vector<int32_t>> out = ok_status();
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      auto stream = [&](int32_t t) {
        if (!on_text || callback_error) return;
        nb::gil_scoped_acquire acquire;
        try {
          (*on_text)(tokenizer_->token_text(t));
        } catch (nb::python_error& e) {
          callback_error.emplace(std::move(e));
        }
      };
      out = models::generate(*model_, ids, max_tokens, &*tokenizer_, first_token_clock(stream), &stats_, o);
    }
    if (callback_error) {
      callback_error->restore();
      throw nb::python_error();
    }
    return tokenizer_->decode(take(std::move(out)));
  }

  // Speculation with `speculate` prompt-lookup drafts per verify step (0: none); only
  // a model on one simulated NPU verifies drafts.
  // None: GenerateOptions::kDefaultSpeculate where the model can verify drafts, else 0.
  models::GenerateOptions speculation(std::optional<int> asked) const {
    const bool can = sim_ && sim_->max_verify_tokens() > 0;
    const int speculate = asked.value_or(can ? models::GenerateOptions::kDefaultSpeculate : 0);
    if (speculate != 0 && !can) {
      raise_status(invalid_argument("speculate=" + std::to_string(speculate) +
                                    " verifies drafts on one simulated NPU; this model runs on " +
                                    (sim_ ? std::to_string(sim_->devices()) + " devices" : std::string("the host"))));
    }
    return {.speculate = speculate, .drafter = {}};
  }
  models::GenerateOptions options(std::optional<int> speculate, const Sampling& sampling) const {
    models::GenerateOptions o = speculation(speculate);
    o.sampling = sampling.params;
    o.stop_strings = sampling.stop;
    check(models::check_sampling(o.sampling));
    return o;
  }

  // Prompt tokens per batched prefill call on the device (0: token by token).
  uint32_t prefill_chunk() const { return sim_ ? sim_->prefill_chunk() : 0; }
  void set_prefill_chunk(uint32_t chunk) {
    if (!sim_) {
      if (chunk != 0) raise_status(invalid_argument("the host oracle prefills token by token"));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    check(sim_->set_prefill_chunk(chunk));
  }

  nb::dict stats() const {
    nb::dict d;
    d["prompt_tokens"] = stats_.prompt_tokens;
    d["prefill_seconds"] = stats_.prefill_seconds;
    d["time_to_first_token"] = time_to_first_token_;
    d["generated_tokens"] = stats_.generated_tokens;
    d["decode_steps"] = stats_.decode_steps;
    d["decode_seconds"] = stats_.decode_seconds;
    d["decoded_tokens"] = stats_.decoded_tokens();
    d["finish_reason"] = models::finish_reason_name(stats_.finish_reason);
    d["logprobs"] = logprobs_list(stats_.choices);
    d["verify_steps"] = stats_.verify_steps;
    d["drafted_tokens"] = stats_.drafted_tokens;
    d["accepted_tokens"] = stats_.accepted_tokens;
    d["acceptance_rate"] = stats_.acceptance_rate();
    d["tokens_per_pass"] = stats_.tokens_per_pass();
    return d;
  }

 private:
  Status load(const std::string& device, uint32_t cores, uint32_t max_context, uint32_t prefill_chunk,
              int devices) {
    NPURT_ASSIGN_OR_RETURN(models::GgufFile file, models::GgufFile::open(path_));
    file_ = std::make_unique<models::GgufFile>(std::move(file));
    NPURT_ASSIGN_OR_RETURN(models::Tokenizer tok, models::Tokenizer::from_gguf(*file_));
    tokenizer_ = std::make_shared<models::Tokenizer>(std::move(tok));
    NPURT_ASSIGN_OR_RETURN(config_, models::Gemma3Config::from_gguf(*file_));
    if (device == "host") {
      NPURT_ASSIGN_OR_RETURN(models::HostOracle oracle, models::HostOracle::load(*file_));
      oracle_ = std::make_unique<models::HostOracle>(std::move(oracle));
      host_model_ = std::make_unique<models::HostTokenModel>(*oracle_);
      model_ = host_model_.get();
      return ok_status();
    }
    models::Gemma3Options mo;
    mo.max_context = max_context;
    mo.prefill_chunk = prefill_chunk;
    mo.kv_cache = kv_cache_;
    mo.batch_sequences = batch_;
    mo.kv_blocks = kv_blocks_;
    if (devices == 1) {
      NPURT_ASSIGN_OR_RETURN(sim_, models::Gemma3Model::load_on(*file_, "sim", cores, mo));
    } else {
      NPURT_ASSIGN_OR_RETURN(sim_, load_parallel(cores, mo, devices));
    }
    model_ = sim_.get();
    return ok_status();
  }

  // The model cut over a group of `devices` simulated NPUs (as `npurt generate
  // --devices N` does), each sized for its shard. The model's ranks keep the group
  // alive. Counts the model cannot split (or below 1) fail here, by name.
  StatusOr<std::unique_ptr<models::Gemma3Model>> load_parallel(uint32_t cores, const models::Gemma3Options& mo,
                                                               int devices) {
    NPURT_ASSIGN_OR_RETURN(hal::DeviceSpec spec, models::gemma3_device_spec(*file_, cores, mo, devices));
    spec.settings["host_threads"] = "1";  // the devices share this machine's cores
    NPURT_ASSIGN_OR_RETURN(std::shared_ptr<comm::DeviceGroup> group, comm::DeviceGroup::create("sim", devices, spec));
    std::vector<std::shared_ptr<comm::Communicator>> ranks;
    for (int r = 0; r < group->size(); ++r) ranks.push_back(group->communicator(r));
    return models::Gemma3Model::load_parallel(*file_, std::move(ranks), mo);
  }

  std::string path_;
  isa::DType kv_cache_ = isa::DType::kF32;
  std::unique_ptr<models::GgufFile> file_;
  std::shared_ptr<models::Tokenizer> tokenizer_;  // shared with its engines
  models::Gemma3Config config_;
  uint32_t batch_ = 0, kv_blocks_ = 0;
  std::shared_ptr<models::Gemma3Model> sim_;
  std::unique_ptr<models::HostOracle> oracle_;
  std::unique_ptr<models::HostTokenModel> host_model_;
  models::TokenModel* model_ = nullptr;
  models::GenerateStats stats_;
  double time_to_first_token_ = 0;  // measured here, from the call to its first token

  // `on_token`, timing the first token from now (the caller holds mu_).
  std::function<void(int32_t)> first_token_clock(std::function<void(int32_t)> on_token) {
    time_to_first_token_ = 0;
    return [this, on_token = std::move(on_token), start = std::chrono::steady_clock::now()](int32_t t) {
      if (time_to_first_token_ == 0) {
        time_to_first_token_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      on_token(t);
    };
  }
  std::mutex mu_;
  friend class Engine;
};

// npurt.Engine: requests continuously batched over a Gemma3(batch=N) model
// (models::BatchEngine). Keeps its model alive; its calls and the model's generate()
// take turns (the model's mutex), with the GIL released while the device runs.
class Engine {
 public:
  explicit Engine(Gemma3& g) : g_(g) {
    if (!g.sim_ || g.sim_->max_batch() == 0) {
      raise_status(failed_precondition("npurt.Engine needs a model loaded with batch=N (N sequences per pass)"));
    }
    engine_ = take(models::BatchEngine::create(g.sim_, g.tokenizer_));
  }

  // A request: `prompt` as text (encoded with BOS) or token ids; it ends after
  // max_tokens tokens, at the tokenizer's stop token or one of stop_tokens, or before
  // the first of its stop strings.
  models::RequestId submit(const std::variant<std::string, std::vector<int32_t>>& prompt, int max_tokens,
                           const Sampling& sampling, const std::optional<std::vector<int32_t>>& stop_tokens) {
    models::EngineRequest r;
    r.prompt = std::holds_alternative<std::string>(prompt) ? g_.encode(std::get<std::string>(prompt))
                                                            : std::get<std::vector<int32_t>>(prompt);
    r.max_tokens = max_tokens;
    r.sampling = sampling.params;
    r.stop_strings = sampling.stop;
    if (stop_tokens) r.stop_tokens = *stop_tokens;
    std::lock_guard<std::mutex> lock(g_.mu_);
    return take(engine_->submit(std::move(r)));
  }

  // One pass over the weights: the (request, token) pairs chosen in it.
  std::vector<std::pair<models::RequestId, int32_t>> step() {
    std::vector<std::pair<models::RequestId, int32_t>> events;
    Status s;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(g_.mu_);
      const std::map<models::RequestId, size_t> before = lengths();
      s = engine_->step().status();
      for (const auto& [id, n] : before) {
        const std::vector<int32_t> out = engine_->output(id).value();
        for (size_t i = n; i < out.size(); ++i) events.push_back({id, out[i]});
      }
    }
    check(s);
    return events;
  }

  void run() {
    Status s;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(g_.mu_);
      s = engine_->run_until_idle();
    }
    check(s);
  }

  void cancel(models::RequestId id) {
    std::lock_guard<std::mutex> lock(g_.mu_);
    check(engine_->cancel(id));
  }
  std::vector<int32_t> output(models::RequestId id) const { return take(engine_->output(id)); }
  std::string text(models::RequestId id) const { return g_.decode(output(id)); }
  std::string state(models::RequestId id) const {
    switch (take(engine_->state(id))) {
      case models::RequestState::kQueued: return "queued";
      case models::RequestState::kRunning: return "running";
      case models::RequestState::kFinished: return "finished";
      case models::RequestState::kCancelled: return "cancelled";
      case models::RequestState::kFailed: return "failed";
    }
    return "unknown";
  }
  std::string finish_reason(models::RequestId id) const {
    return models::finish_reason_name(take(engine_->finish_reason(id)));
  }
  // Per output token (with logprobs=N): its id, log-probability and the N most likely.
  nb::list logprobs(models::RequestId id) const { return logprobs_list(take(engine_->choices(id))); }
  size_t queued() const { return engine_->queued(); }
  size_t running() const { return engine_->running(); }
  uint32_t free_blocks() const { return engine_->blocks().free_blocks(); }
  uint64_t preemptions() const { return engine_->preemptions(); }

 private:
  // Output lengths of the queued and running requests (those a step can add to).
  std::map<models::RequestId, size_t> lengths() const {
    std::map<models::RequestId, size_t> n;
    for (models::RequestId id = 1; engine_->state(id).ok(); ++id) {
      const models::RequestState st = engine_->state(id).value();
      if (st == models::RequestState::kQueued || st == models::RequestState::kRunning) n[id] = engine_->output(id)->size();
    }
    return n;
  }

  Gemma3& g_;
  std::unique_ptr<models::BatchEngine> engine_;
};

}  // namespace

void bind_models(nb::module_& m) {
  nb::class_<Gemma3>(m, "Gemma3",
                     "Gemma-3 greedy decoding from a GGUF file (default: $NPURT_MODEL, else, when the "
                     "package runs from the checkout it was built in, the file `make model` installs "
                     "there), on a simulated NPU of its own ('sim') or the f32 host "
                     "oracle ('host'). With devices=N > 1 the model is cut tensor parallel over N "
                     "simulated NPUs of `cores` cores each, in this process.")
      .def(nb::init<std::optional<std::string>, const std::string&, uint32_t, uint32_t, uint32_t, int,
                    const std::string&, uint32_t, uint32_t>(),
           nb::arg("path") = nb::none(), nb::kw_only(), nb::arg("device") = "sim", nb::arg("cores") = 8,
           nb::arg("max_context") = 4096, nb::arg("prefill_chunk") = models::Gemma3Options::kDefaultPrefillChunk,
           nb::arg("devices") = 1, nb::arg("kv_cache") = "f32", nb::arg("batch") = 0, nb::arg("kv_blocks") = 0)
      .def_prop_rw("prefill_chunk", &Gemma3::prefill_chunk, &Gemma3::set_prefill_chunk,
                   "prompt tokens per batched prefill call (0: token by token); at most the chunk the "
                   "model was loaded with")
      .def_prop_ro("path", &Gemma3::path)
      .def_prop_ro("devices", &Gemma3::devices, "simulated NPUs the model is cut over (1 on the host oracle)")
      .def_prop_ro(
          "config",
          [](const Gemma3& g) {
            const models::Gemma3Config& c = g.config();
            nb::dict d;
            d["n_layers"] = c.n_layers;
            d["hidden"] = c.hidden;
            d["ffn"] = c.ffn;
            d["n_heads"] = c.n_heads;
            d["n_kv_heads"] = c.n_kv_heads;
            d["head_dim"] = c.head_dim;
            d["vocab"] = c.vocab;
            d["sliding_window"] = c.sliding_window;
            d["context_length"] = c.context_length;
            return d;
          },
          "the hyperparameters read from the file")
      .def("encode", &Gemma3::encode, nb::arg("text"), "token ids of `text`, with the BOS token first")
      .def("decode", &Gemma3::decode, nb::arg("ids"), "the text of token ids")
      .def(
          "generate",
          [](Gemma3& g, const std::string& prompt, int max_tokens,
             const std::optional<std::function<void(std::string)>>& on_text, std::optional<int> speculate,
             float temperature, int top_k, float top_p, float min_p, float repetition_penalty, float presence_penalty,
             float frequency_penalty, uint64_t seed, const std::optional<std::vector<std::string>>& stop,
             int logprobs) {
            return g.generate(prompt, max_tokens, on_text, speculate,
                              sampling_of(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                                          frequency_penalty, seed, stop, logprobs));
          },
          nb::arg("prompt"), nb::arg("max_tokens") = 32, nb::arg("on_text") = nb::none(),
          nb::arg("speculate") = nb::none(), nb::kw_only(), nb::arg("temperature") = 0.0f, nb::arg("top_k") = 0,
          nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f, nb::arg("repetition_penalty") = 1.0f,
          nb::arg("presence_penalty") = 0.0f, nb::arg("frequency_penalty") = 0.0f, nb::arg("seed") = 0,
          nb::arg("stop") = nb::none(), nb::arg("logprobs") = 0,
          "continuation of `prompt` (at most max_tokens tokens, ending early at a stop token or a "
          "`stop` string, which is not returned); on_text(str) sees each token's text as it is produced. "
          "Greedy at temperature 0; otherwise sampled after top_k / top_p / min_p and the penalties, "
          "the same text for the same prompt, options and seed. logprobs=N: each token's "
          "log-probability and the N most likely (stats['logprobs']). speculate=N verifies up to "
          "N prompt-lookup drafts per pass over the weights (one simulated NPU; N <= 15; 0: off; "
          "None: 7 there, else off): the same text, often sooner")
      .def(
          "generate_ids",
          [](Gemma3& g, const std::vector<int32_t>& prompt, int max_tokens, std::optional<int> speculate,
             float temperature, int top_k, float top_p, float min_p, float repetition_penalty, float presence_penalty,
             float frequency_penalty, uint64_t seed, const std::optional<std::vector<std::string>>& stop,
             int logprobs) {
            return g.generate_ids(prompt, max_tokens, speculate,
                                  sampling_of(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                                              frequency_penalty, seed, stop, logprobs));
          },
          nb::arg("prompt_ids"), nb::arg("max_tokens") = 32, nb::arg("speculate") = nb::none(), nb::kw_only(),
          nb::arg("temperature") = 0.0f, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f,
          nb::arg("repetition_penalty") = 1.0f, nb::arg("presence_penalty") = 0.0f,
          nb::arg("frequency_penalty") = 0.0f, nb::arg("seed") = 0, nb::arg("stop") = nb::none(),
          nb::arg("logprobs") = 0, "token ids after `prompt_ids` (the other arguments: as generate)")
      .def(
          "engine", [](Gemma3& g) { return std::make_unique<Engine>(g); }, nb::keep_alive<0, 1>(),
          "an npurt.Engine over this model (loaded with batch=N): requests continuously batched, N per "
          "pass over the weights")
      .def_prop_ro("stats", &Gemma3::stats,
                   "figures of the last generate(): prompt_tokens, prefill_seconds, time_to_first_token, "
                   "generated_tokens, decode_steps, decode_seconds, decoded_tokens, finish_reason ('length', "
                   "'stop_token' or 'stop_string'), logprobs (with logprobs=N: per token a dict of token, "
                   "logprob and top, N (id, logprob) pairs), and for speculation verify_steps, "
                   "drafted_tokens, accepted_tokens, acceptance_rate, tokens_per_pass");

  nb::class_<Engine>(m, "Engine",
                     "Requests continuously batched over a Gemma3(batch=N) model: submit() queues one, "
                     "step() runs one pass over the weights for up to N running requests and returns the "
                     "(request, token) pairs chosen in it, run() steps until all are done. Each request's "
                     "tokens are what it gets alone (greedy, or sampled by its seed).")
      .def(
          "submit",
          [](Engine& e, const std::variant<std::string, std::vector<int32_t>>& prompt, int max_tokens,
             float temperature, int top_k, float top_p, float min_p, float repetition_penalty, float presence_penalty,
             float frequency_penalty, uint64_t seed, const std::optional<std::vector<std::string>>& stop,
             const std::optional<std::vector<int32_t>>& stop_tokens, int logprobs) {
            return e.submit(prompt, max_tokens,
                            sampling_of(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                                        frequency_penalty, seed, stop, logprobs),
                            stop_tokens);
          },
          nb::arg("prompt"), nb::arg("max_tokens") = 16, nb::kw_only(), nb::arg("temperature") = 0.0f,
          nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f,
          nb::arg("repetition_penalty") = 1.0f, nb::arg("presence_penalty") = 0.0f,
          nb::arg("frequency_penalty") = 0.0f, nb::arg("seed") = 0, nb::arg("stop") = nb::none(),
          nb::arg("stop_tokens") = nb::none(), nb::arg("logprobs") = 0,
          "queues a request (text, encoded with BOS, or token ids) and returns its id; it ends after "
          "max_tokens tokens, at a stop token, or before the first `stop` string")
      .def("step", &Engine::step, "one pass over the weights: the (request id, token id) pairs chosen in it")
      .def("run", &Engine::run, "steps until no request is queued or running")
      .def("cancel", &Engine::cancel, nb::arg("request"), "ends a queued or running request, releasing its blocks")
      .def("output", &Engine::output, nb::arg("request"), "the token ids a request has produced")
      .def("text", &Engine::text, nb::arg("request"), "the text a request has produced")
      .def("state", &Engine::state, nb::arg("request"), "'queued', 'running', 'finished', 'cancelled' or 'failed'")
      .def("finish_reason", &Engine::finish_reason, nb::arg("request"),
           "'length', 'stop_token' or 'stop_string' once finished")
      .def("logprobs", &Engine::logprobs, nb::arg("request"),
           "with logprobs=N: per output token a dict of token, logprob and top (N (id, logprob) pairs)")
      .def_prop_ro("queued", &Engine::queued)
      .def_prop_ro("running", &Engine::running)
      .def_prop_ro("free_blocks", &Engine::free_blocks, "KV blocks no running request holds")
      .def_prop_ro("preemptions", &Engine::preemptions, "requests preempted (and later recomputed) so far");
}

}  // namespace npurt::python
