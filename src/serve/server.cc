#include "serve/server.h"

#include <algorithm>
#include <ctime>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

namespace npurt::serve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The HTTP status of a request that ended with `error`.
ApiError ended_with(const Status& error) {
  if (error.code() == StatusCode::kAborted) {
    return {.status = 503, .message = error.message(), .type = "server_error"};
  }
  return {.status = 500, .message = error.to_string(), .type = "server_error"};
}

}  // namespace

Server::Server(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {}

Server::~Server() {
  stop();
  detach();
}

StatusOr<std::unique_ptr<Server>> Server::bind(ServerOptions options) {
  std::unique_ptr<Server> s(new Server(std::move(options)));
  s->http_->set_payload_max_length(s->options_.max_body_bytes);
  const size_t threads = static_cast<size_t>(std::max(1, s->options_.threads));
  s->http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->routes();
  const ServerOptions& o = s->options_;
  s->port_ = o.port == 0 ? s->http_->bind_to_any_port(o.host) : (s->http_->bind_to_port(o.host, o.port) ? o.port : -1);
  if (s->port_ <= 0) {
    return failed_precondition("cannot listen on " + o.host + ":" + std::to_string(o.port) +
                               " (in use, or not an address of this host)");
  }
  return s;
}

void Server::serve() { http_->listen_after_bind(); }

void Server::stop() {
  if (http_->is_running()) http_->stop();
}

Status Server::attach(std::vector<Replica> replicas, std::shared_ptr<const models::Tokenizer> tokenizer,
                      std::string model_id, ChatFormat chat) {
  if (replicas.empty()) return invalid_argument("serve: attach needs at least one replica");
  for (const Replica& r : replicas) {
    if (!r.loop || !r.runtime) return invalid_argument("serve: a replica without its engine loop or runtime");
  }
  auto m = std::make_shared<Model>();
  const uint32_t context = replicas[0].loop->model().max_context();
  m->limits = {.model_id = std::move(model_id), .max_context = context, .max_n = options_.max_n, .chat = std::move(chat)};
  m->replicas = std::move(replicas);
  m->tokenizer = std::move(tokenizer);
  std::lock_guard<std::mutex> lock(mu_);
  model_ = std::move(m);
  return ok_status();
}

void Server::detach() {
  std::shared_ptr<Model> m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = std::move(model_);
  }
}

EngineLoop& Server::Model::least_busy() const {
  const auto load = [](const EngineLoop& loop) {
    const EngineFigures f = loop.figures();
    return f.queued + f.running + f.waiting;
  };
  EngineLoop* best = replicas[0].loop.get();
  size_t best_load = load(*best);
  for (size_t i = 1; i < replicas.size(); ++i) {
    if (const size_t l = load(*replicas[i].loop); l < best_load) best = replicas[i].loop.get(), best_load = l;
  }
  return *best;
}

std::shared_ptr<Server::Model> Server::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

void Server::answer_error(httplib::Response& res, const std::string& endpoint, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(error_json(e)), "application/json");
  metrics_.request(endpoint, e.status);
}

void Server::routes() {
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ready = model() != nullptr;
    res.status = ready ? 200 : 503;
    res.set_content(dump({{"status", ready ? "ready" : "loading"}}), "application/json");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const std::shared_ptr<Model> m = model();
    if (!m) return answer_error(res, "/v1/models", {.status = 503, .message = "the model is loading", .type = "server_error"});
    res.set_content(dump({{"object", "list"},
                          {"data", Json::array({{{"id", m->limits.model_id},
                                                 {"object", "model"},
                                                 {"created", 0},
                                                 {"owned_by", "npurt"}}})}}),
                    "application/json");
    metrics_.request("/v1/models", 200);
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const std::shared_ptr<Model> m = model();
    std::vector<DeviceFigures> devices;
    if (m) {
      for (const Replica& r : m->replicas) devices.push_back({r.loop->figures(), r.runtime->device().counters()});
    }
    res.set_content(metrics_.render(devices), "text/plain; version=0.0.4");
  });
  http_->Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html"); });
  http_->Post("/v1/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, false); });
  http_->Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { completion(req, res, true); });
  http_->set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const int status = res.status;
    const std::string what = status == 413 ? "the body is larger than the server accepts"
                             : status == 404 ? "no such route"
                                             : "the request could not be served";
    res.set_content(dump(error_json({.status = status, .message = what})), "application/json");
  });
}

// A request's completions as they run: its streams, the replica they run on (the n
// copies of a request share one, and there the prompt's KV blocks), what each has
// produced, and the model they run on (kept alive while the request is).
struct Server::Run {
  std::shared_ptr<Model> model;
  CompletionRequest request;
  std::string endpoint, id;
  int64_t created = 0;
  Clock::time_point arrived, last_token, deadline;
  std::vector<std::shared_ptr<RequestStream>> streams;
  EngineLoop* loop = nullptr;  // one of model's replicas
  std::vector<Choice> choices;
  std::vector<bool> ended, started;
  Status error;
  bool any_token = false;
  size_t prompt_tokens = 0;

  // The next event of any running choice, waiting up to `wait`: (choice, event).
  std::optional<std::pair<size_t, StreamEvent>> next_event(std::chrono::milliseconds wait) {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (ended[i]) continue;
      if (auto e = streams[i]->next(std::chrono::milliseconds(0))) return std::make_pair(i, std::move(*e));
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      if (ended[i]) continue;
      if (auto e = streams[i]->next(wait)) return std::make_pair(i, std::move(*e));
      break;
    }
    return std::nullopt;
  }

  // Takes an event into the run; false once every choice has ended.
  bool take(size_t i, StreamEvent& e, Metrics& metrics) {
    const auto now = Clock::now();
    if (e.end) {
      ended[i] = true;
      choices[i].reason = e.reason;
      choices[i].logprobs = std::move(e.choices);
      if (!e.error.ok() && error.ok()) error = e.error;
    } else {
      choices[i].tokens.push_back(e.token);
      if (!any_token) metrics.time_to_first_token(seconds(now - arrived));
      else metrics.inter_token(seconds(now - last_token));
      any_token = true;
      last_token = now;
    }
    return std::find(ended.begin(), ended.end(), false) != ended.end();
  }

  void cancel_all() {
    for (size_t i = 0; i < streams.size(); ++i) {
      if (!ended[i]) loop->cancel(streams[i]);
    }
  }

  size_t generated() const {
    size_t n = 0;
    for (const Choice& c : choices) n += c.tokens.size();
    return n;
  }
};

void Server::finish(const Run& run, int status) {
  metrics_.tokens(run.prompt_tokens * run.streams.size(), run.generated());
  metrics_.request(run.endpoint, status);
}

void Server::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  const std::string endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  const auto arrived = Clock::now();
  std::shared_ptr<Model> m = model();
  if (!m) return answer_error(res, endpoint, {.status = 503, .message = "the model is loading", .type = "server_error"});
  std::variant<CompletionRequest, ApiError> parsed = parse_completion(req.body, chat, *m->tokenizer, m->limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return answer_error(res, endpoint, *e);
  auto run = std::make_shared<Run>();
  run->model = std::move(m);
  run->request = std::move(std::get<CompletionRequest>(parsed));
  run->endpoint = endpoint;
  run->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  run->created = static_cast<int64_t>(std::time(nullptr));
  run->arrived = run->last_token = arrived;
  run->deadline = arrived + options_.deadline;
  run->prompt_tokens = run->request.engine.prompt.size();
  run->loop = &run->model->least_busy();
  for (int i = 0; i < run->request.n; ++i) {
    models::EngineRequest er = run->request.engine;
    er.sampling.seed += static_cast<uint64_t>(i);
    StatusOr<std::shared_ptr<RequestStream>> s = run->loop->submit(std::move(er));
    if (!s.ok()) {
      for (const auto& stream : run->streams) run->loop->cancel(stream);
      const bool full = s.status().code() == StatusCode::kResourceExhausted;
      return answer_error(res, endpoint,
                          {.status = full ? 503 : 400, .message = s.status().message(), .type = full ? "server_error" : "invalid_request_error"});
    }
    run->streams.push_back(std::move(s).value());
  }
  run->choices.resize(run->streams.size());
  run->ended.assign(run->streams.size(), false);
  run->started.assign(run->streams.size(), false);
  if (run->request.stream) return answer_stream(run, res);
  answer_whole(*run, ClientSocket::find(req.remote_addr, req.remote_port, req.local_addr, req.local_port), res);
}

// One JSON answer once every choice has ended. The client is watched meanwhile: one
// that goes away cancels the request (its status in the metrics is 499, as nginx
// names a closed request).
void Server::answer_whole(Run& run, const ClientSocket& client, httplib::Response& res) {
  bool more = true;
  while (more) {
    if (Clock::now() > run.deadline) {
      run.cancel_all();
      finish(run, 504);
      return answer_error(res, run.endpoint,
                          {.status = 504, .message = "the request ran past the server's deadline", .type = "server_error"});
    }
    if (client.gone()) {
      run.cancel_all();
      res.status = 499;
      return finish(run, 499);
    }
    auto e = run.next_event(std::chrono::milliseconds(100));
    if (e) more = run.take(e->first, e->second, metrics_);
  }
  if (!run.error.ok()) {
    finish(run, ended_with(run.error).status);
    return answer_error(res, run.endpoint, ended_with(run.error));
  }
  res.set_content(dump(completion_json(run.request, run.id, run.created, run.model->limits.model_id, run.choices,
                                       run.prompt_tokens, *run.model->tokenizer)),
                  "application/json");
  finish(run, 200);
}

// Server-sent events: a chunk per token, the finish reasons, usage if asked, [DONE].
// A client that goes away fails a write (or the socket check between tokens), which
// cancels the request.
void Server::answer_stream(const std::shared_ptr<Run>& run, httplib::Response& res) {
  auto done = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, run, done](size_t, httplib::DataSink& sink) {
        auto send = [&](const Json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        const std::string& model_id = run->model->limits.model_id;
        bool more = true;
        while (more) {
          if (Clock::now() > run->deadline) {
            run->cancel_all();
            break;
          }
          auto e = run->next_event(std::chrono::milliseconds(100));
          if (!e) {
            if (sink.is_writable && !sink.is_writable()) {  // the client went away
              run->cancel_all();
              return false;
            }
            continue;
          }
          const size_t i = e->first;
          const bool end = e->second.end;
          const int32_t token = e->second.token;
          more = run->take(i, e->second, metrics_);
          const models::FinishReason reason = run->choices[i].reason;
          const std::string text = end ? "" : run->model->tokenizer->token_text(token);
          const Json chunk = chunk_json(run->request, run->id, run->created, model_id, static_cast<int>(i), text,
                                        end ? &reason : nullptr, !run->started[i]);
          run->started[i] = true;
          if (!send(chunk)) {
            run->cancel_all();
            return false;
          }
        }
        if (!run->error.ok()) send(error_json(ended_with(run->error)));
        if (run->request.include_usage) {
          send(Json{{"id", run->id},
                    {"object", run->request.chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", run->created},
                    {"model", model_id},
                    {"choices", Json::array()},
                    {"usage", usage_json(run->prompt_tokens * run->streams.size(), run->generated())}});
        }
        const std::string last = "data: [DONE]\n\n";
        sink.write(last.data(), last.size());
        *done = true;
        sink.done();
        return true;
      },
      [this, run, done](bool success) {
        if (!success || !*done) run->cancel_all();
        finish(*run, 200);
      });
}

}  // namespace npurt::serve
