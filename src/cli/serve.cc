// `npurt serve`: listens first (GET /health says "loading"), loads the model onto each
// device (one replica a device, of the driver --device names), serves until SIGTERM or
// SIGINT, then stops taking connections, cancels what still runs and exits 0.
#include "cli/serve.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

#include "cli/generate.h"
#include "npurt/models/gemma3_model.h"
#include "npurt/models/gguf.h"
#include "npurt/models/tokenizer.h"
#include "serve/engine_loop.h"
#include "serve/server.h"

namespace npurt::cli {
namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "npurt serve: %s\n", what.c_str());
  return 1;
}

// The model's name in the API: the file's name without .gguf.
std::string model_id(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

// The model on one device, with its engine loop: a replica the server dispatches to.
StatusOr<serve::Replica> load_replica(const ServeArgs& args, const models::GgufFile& file,
                                      std::shared_ptr<const models::Tokenizer> tokenizer) {
  const models::Gemma3Options mo{.max_context = args.context,
                                 .prefill_chunk = args.prefill_chunk,
                                 .verify_tokens = 0,
                                 .batch_sequences = static_cast<uint32_t>(args.parallel)};
  NPURT_ASSIGN_OR_RETURN(hal::DeviceSpec spec, models::gemma3_device_spec(file, args.cores, mo));
  // Simulated devices share this machine's cores: each runs its kernels on its share.
  if (args.device == "sim" && args.devices > 1) {
    const unsigned share = std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(args.devices));
    spec.settings["host_threads"] = std::to_string(share);
  }
  serve::Replica replica;
  NPURT_ASSIGN_OR_RETURN(replica.runtime, Runtime::create(args.device, spec));
  NPURT_ASSIGN_OR_RETURN(std::unique_ptr<models::Gemma3Model> model,
                         models::Gemma3Model::load(file, *replica.runtime, mo));
  NPURT_ASSIGN_OR_RETURN(replica.loop,
                         serve::EngineLoop::start(std::shared_ptr<models::Gemma3Model>(std::move(model)),
                                                  std::move(tokenizer), {.max_queue = static_cast<size_t>(args.max_queue)}));
  return replica;
}

// How chats become prompts: --chat-template, else the file's template, else Gemma's
// turns (also when the file's template uses what ChatTemplate does not support: the
// server still serves, and says so).
StatusOr<serve::ChatFormat> chat_format(const ServeArgs& args, const models::GgufFile& file,
                                        const models::Tokenizer& tok) {
  serve::ChatFormat format{.chat_template = nullptr,
                           .bos_token = std::string(tok.piece(tok.bos())),
                           .eos_token = std::string(tok.piece(tok.eos()))};
  if (!args.chat_template.empty()) {
    std::ifstream in(args.chat_template, std::ios::binary);
    if (!in) return not_found("--chat-template: cannot read " + args.chat_template);
    const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    NPURT_ASSIGN_OR_RETURN_CTX(serve::ChatTemplate t, serve::ChatTemplate::parse(source),
                               "--chat-template " + args.chat_template);
    format.chat_template = std::make_shared<const serve::ChatTemplate>(std::move(t));
    std::fprintf(stderr, "npurt serve: chats use the template in %s\n", args.chat_template.c_str());
    return format;
  }
  StatusOr<std::string_view> source = file.get_string("tokenizer.chat_template");
  if (!source.ok()) {
    std::fprintf(stderr, "npurt serve: the model file has no chat template: chats use Gemma's turn format\n");
    return format;
  }
  StatusOr<serve::ChatTemplate> t = serve::ChatTemplate::parse(*source);
  if (!t.ok()) {
    std::fprintf(stderr, "npurt serve: the model file's chat template is not supported (%s): chats use Gemma's turn "
                         "format\n", t.status().message().c_str());
    return format;
  }
  format.chat_template = std::make_shared<const serve::ChatTemplate>(std::move(t).value());
  std::fprintf(stderr, "npurt serve: chats use the model file's chat template\n");
  return format;
}

}  // namespace

int run_serve(const ServeArgs& args) {
  // SIGTERM and SIGINT go to a thread that waits for them (sigwait), not to a handler:
  // stopping the server is not async-signal-safe. Blocked before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const std::string path = args.model.empty() ? default_model_path() : args.model;
  if (!std::filesystem::is_regular_file(path)) {
    return fail("no model file at " + path + " (run `make model`, pass --model PATH or set NPURT_MODEL)");
  }
  StatusOr<std::unique_ptr<serve::Server>> server =
      serve::Server::bind({.host = args.host,
                           .port = args.port,
                           .max_body_bytes = static_cast<size_t>(args.max_body_bytes),
                           .deadline = std::chrono::seconds(args.deadline_s),
                           // every request waiting or running holds a connection's thread
                           .threads = (args.max_queue + args.parallel) * args.devices + 8});
  if (!server.ok()) return fail(server.status().to_string());
  std::thread http([&] { (*server)->serve(); });
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "npurt serve: signal %d, stopping\n", sig);
    (*server)->stop();
  });
  std::fprintf(stderr, "npurt serve: listening on http://%s:%d (loading %s)\n", args.host.c_str(),
               (*server)->port(), path.c_str());

  std::shared_ptr<models::GgufFile> gguf;  // outlives the model
  const auto loaded = [&]() -> Status {
    NPURT_ASSIGN_OR_RETURN(models::GgufFile file, models::GgufFile::open(path));
    gguf = std::make_shared<models::GgufFile>(std::move(file));
    NPURT_ASSIGN_OR_RETURN(models::Tokenizer tok, models::Tokenizer::from_gguf(*gguf));
    auto tokenizer = std::make_shared<const models::Tokenizer>(std::move(tok));
    NPURT_ASSIGN_OR_RETURN(serve::ChatFormat chat, chat_format(args, *gguf, *tokenizer));
    std::vector<serve::Replica> replicas;
    for (int d = 0; d < args.devices; ++d) {
      NPURT_ASSIGN_OR_RETURN_CTX(serve::Replica r, load_replica(args, *gguf, tokenizer),
                                 "device " + std::to_string(d) + " of " + std::to_string(args.devices));
      replicas.push_back(std::move(r));
    }
    NPURT_RETURN_IF_ERROR((*server)->attach(std::move(replicas), tokenizer, model_id(path), std::move(chat)));
    std::fprintf(stderr, "npurt serve: ready (%d %s device(s), %d sequences together on each, %u positions each)\n",
                 args.devices, args.device.c_str(), args.parallel, args.context);
    return ok_status();
  }();
  if (!loaded.ok()) {
    std::fprintf(stderr, "npurt serve: %s: %s\n", path.c_str(), loaded.to_string().c_str());
    (*server)->stop();
  }
  http.join();
  // The HTTP side has stopped: detach the model (its loop cancels what still runs).
  (*server)->detach();
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes the signal thread if no signal came
  stopper.join();
  std::fprintf(stderr, "npurt serve: stopped\n");
  return loaded.ok() ? 0 : 1;
}

}  // namespace npurt::cli
