// `npurt batch`: reads prompts, runs them through a BatchEngine over a model loaded
// with a batched decode step, and writes each prompt's result as a JSON line to stdout,
// in the prompts' order, as soon as it and those before it are done; load and speed
// figures on stderr.
#include "cli/batch.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/generate.h"
#include "npurt/models/batch_engine.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"

namespace npurt::cli {
namespace {

using Json = nlohmann::json;

int fail(const std::string& what) {
  std::fprintf(stderr, "npurt batch: %s\n", what.c_str());
  return 1;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One line, without its line break (and a carriage return before it).
StatusOr<std::vector<std::string>> read_prompts(const std::string& path) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path);
    if (!file) return not_found("cannot open the prompts file " + path);
    in = &file;
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(*in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (lines.empty()) return invalid_argument("the prompts file " + path + " holds no line");
  return lines;
}

// A prompt's result as it is printed.
struct Result {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  models::RequestId id = 0;
  Status error;  // the prompt could not be submitted
  bool printed = false;
};

Json choice_json(const models::Tokenizer& tok, const models::TokenChoice& c) {
  Json top = Json::array();
  for (const models::TokenLogprob& t : c.top) top.push_back({{"token", tok.token_text(t.token)}, {"logprob", t.logprob}});
  return {{"token", tok.token_text(c.token)}, {"logprob", c.logprob}, {"top_logprobs", top}};
}

Json result_json(size_t index, const Result& r, const models::BatchEngine& engine, const models::Tokenizer& tok) {
  Json j{{"index", index}, {"prompt", r.prompt}};
  if (!r.error.ok()) {
    j["error"] = r.error.to_string();
    return j;
  }
  const models::RequestState state = *engine.state(r.id);
  if (state == models::RequestState::kFailed) {
    j["error"] = engine.failure(r.id).to_string();
    return j;
  }
  const std::vector<int32_t> out = *engine.output(r.id);
  j["text"] = tok.decode(out);
  j["tokens"] = out;
  j["prompt_tokens"] = r.prompt_ids.size();
  j["finish_reason"] = models::finish_reason_name(*engine.finish_reason(r.id));
  const std::vector<models::TokenChoice> choices = *engine.choices(r.id);
  if (!choices.empty()) {
    Json lp = Json::array();
    for (const models::TokenChoice& c : choices) lp.push_back(choice_json(tok, c));
    j["logprobs"] = lp;
  }
  return j;
}

}  // namespace

int run_batch(const BatchArgs& args) {
  if (const Status s = models::check_sampling(args.sampling); !s.ok()) return fail(s.to_string());
  if (args.parallel < 1 || args.parallel > static_cast<int>(isa::kMaxTmvBatch)) {
    return fail("--parallel " + std::to_string(args.parallel) + " is outside 1 .. " +
                std::to_string(isa::kMaxTmvBatch));
  }
  if (args.max_tokens < 1) return fail("--max-tokens must be at least 1");
  for (const std::string& s : args.stop) {
    if (s.empty()) return fail("a --stop string is empty");
  }
  const auto t_open = std::chrono::steady_clock::now();
  StatusOr<std::vector<std::string>> lines = read_prompts(args.prompts);
  if (!lines.ok()) return fail(lines.status().to_string());
  const std::string path = args.model.empty() ? default_model_path() : args.model;
  if (!std::filesystem::is_regular_file(path)) {
    return fail("no model file at " + path + " (run `make model`, pass --model PATH or set NPURT_MODEL)");
  }
  StatusOr<models::GgufFile> file = models::GgufFile::open(path);
  if (!file.ok()) return fail(file.status().to_string());
  StatusOr<models::Tokenizer> tok = models::Tokenizer::from_gguf(*file);
  if (!tok.ok()) return fail(path + ": " + tok.status().to_string());
  const auto tokenizer = std::make_shared<const models::Tokenizer>(std::move(tok).value());

  std::vector<Result> results(lines->size());
  size_t longest = 1;
  for (size_t i = 0; i < results.size(); ++i) {
    Result& r = results[i];
    r.prompt = (*lines)[i];
    StatusOr<std::vector<int32_t>> ids = tokenizer->encode(r.prompt);
    if (r.prompt.empty()) {
      r.error = invalid_argument("prompt line " + std::to_string(i + 1) + " is empty");
    } else if (!ids.ok()) {
      r.error = ids.status();
    } else {
      r.prompt_ids = std::move(ids).value();
      longest = std::max(longest, r.prompt_ids.size());
    }
  }
  // Room for the longest prompt and its tokens; the pool holds `parallel` such sequences.
  models::Gemma3Options mo{.max_context = static_cast<uint32_t>(longest + args.max_tokens),
                           .prefill_chunk = args.prefill_chunk,
                           .verify_tokens = 0,
                           .batch_sequences = static_cast<uint32_t>(args.parallel)};
  StatusOr<std::unique_ptr<models::Gemma3Model>> loaded = models::Gemma3Model::load_on(*file, args.device, args.cores, mo);
  if (!loaded.ok()) return fail(path + ": " + loaded.status().to_string());
  auto engine = models::BatchEngine::create(std::shared_ptr<models::Gemma3Model>(std::move(loaded).value()), tokenizer);
  if (!engine.ok()) return fail(engine.status().to_string());
  const double load_seconds = seconds_since(t_open);

  const auto t_run = std::chrono::steady_clock::now();
  for (Result& r : results) {
    if (!r.error.ok()) continue;
    StatusOr<models::RequestId> id = (*engine)->submit(
        {.prompt = r.prompt_ids, .max_tokens = args.max_tokens, .sampling = args.sampling, .stop_strings = args.stop});
    if (id.ok()) r.id = *id;
    else r.error = id.status();
  }
  size_t next = 0, generated = 0, prompt_tokens = 0, failed = 0;
  const auto print_ready = [&] {
    for (; next < results.size(); ++next) {
      Result& r = results[next];
      if (r.error.ok()) {
        const models::RequestState s = *(*engine)->state(r.id);
        if (s == models::RequestState::kQueued || s == models::RequestState::kRunning) return;
        if (s == models::RequestState::kFinished) generated += (*engine)->output(r.id)->size();
        else ++failed;
        prompt_tokens += r.prompt_ids.size();
      } else {
        ++failed;
      }
      std::fputs(result_json(next, r, **engine, *tokenizer).dump(-1, ' ', false, Json::error_handler_t::replace).c_str(),
                 stdout);
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
  };
  print_ready();
  while ((*engine)->queued() + (*engine)->running() > 0) {
    const StatusOr<size_t> ran = (*engine)->step();
    if (!ran.ok()) return fail(ran.status().to_string());
    print_ready();
  }
  print_ready();
  const double run_seconds = seconds_since(t_run);
  std::fprintf(stderr,
               "batch: %zu prompts (%zu failed), %d in parallel; load %.2f s; %zu prompt tokens (%llu computed, the "
               "rest cached), %zu generated in %.2f s: %.1f tokens/s over all prompts; %llu preemptions\n",
               results.size(), failed, args.parallel, load_seconds, prompt_tokens,
               static_cast<unsigned long long>((*engine)->prompt_tokens_computed()), generated, run_seconds,
               run_seconds > 0 ? generated / run_seconds : 0.0,
               static_cast<unsigned long long>((*engine)->preemptions()));
  return failed == 0 ? 0 : 1;
}

}  // namespace npurt::cli
