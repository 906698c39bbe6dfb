// Server: `npurt serve`'s HTTP side (cpp-httplib), on 127.0.0.1 by default.
//
//   auto server = serve::Server::bind({.port = 8080});       // listening; the API says "loading"
//   std::thread t([&] { (*server)->serve(); });
//   std::vector<serve::Replica> replicas(1);  // an engine loop and its runtime
//   replicas[0] = {std::move(loop), runtime};
//   (*server)->attach(std::move(replicas), tokenizer, "gemma-3-270m");  // ready
//   ...
//   (*server)->stop();  t.join();
//
// Routes: POST /v1/completions and /v1/chat/completions (JSON, or server-sent events
// with "stream": true, ending in "data: [DONE]"), GET /v1/models, GET /health (503
// "loading" until attach(), then 200 "ready"), GET /metrics (Prometheus text) and GET /
// (a chat page). Bad requests get 400 with an OpenAI-style error object naming the
// field; a full queue 503 with Retry-After; a client that goes away, streaming or not,
// cancels its request. Bodies over max_body_bytes are refused (413) before they are read.
// With several replicas (one model on each of several devices), each completion goes to
// the replica with the fewest requests waiting or running: a request's text is the same
// on any of them, so where it runs changes nothing but when it finishes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "npurt/models/tokenizer.h"
#include "npurt/runtime/runtime.h"
#include "serve/client_socket.h"
#include "serve/engine_loop.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace npurt::serve {

// One copy of the model on one device: its engine thread and the runtime whose device
// counters /metrics reports.
struct Replica {
  std::unique_ptr<EngineLoop> loop;
  std::shared_ptr<Runtime> runtime;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port (port() says which)
  size_t max_body_bytes = 1 << 20;
  std::chrono::seconds deadline{600};  // a request still running after this is cancelled
  int max_n = 8;                       // completions per request ("n"), at most
  // Connections served at once: a handler waits for its request's tokens, so every
  // client in flight holds one (cpp-httplib's default is 8 on a small host).
  int threads = 64;
};

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> bind(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // Serves requests until stop(); call on a thread of its own.
  void serve();
  void stop();
  // The model the API serves from now on, on one or more replicas of the same file
  // (at least one; their contexts alike).
  Status attach(std::vector<Replica> replicas, std::shared_ptr<const models::Tokenizer> tokenizer,
                std::string model_id, ChatFormat chat = {});
  // Detaches the model (its loops cancel what still runs); the API says "loading" again.
  void detach();

 private:
  explicit Server(ServerOptions options);
  void routes();
  // What attach() gave, while it lives; null before.
  struct Model {
    std::vector<Replica> replicas;
    std::shared_ptr<const models::Tokenizer> tokenizer;
    ApiLimits limits;
    // The replica with the fewest requests waiting or running.
    EngineLoop& least_busy() const;
  };
  std::shared_ptr<Model> model() const;
  struct Run;
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void answer_whole(Run& run, const ClientSocket& client, httplib::Response& res);
  void answer_stream(const std::shared_ptr<Run>& run, httplib::Response& res);
  void finish(const Run& run, int status);  // counts the request and its tokens
  void answer_error(httplib::Response& res, const std::string& endpoint, const ApiError& e);

  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::shared_ptr<Model> model_;
  Metrics metrics_;
  std::atomic<uint64_t> next_id_{1};
};

// The chat page served at GET /.
extern const char* const kChatPage;

}  // namespace npurt::serve
