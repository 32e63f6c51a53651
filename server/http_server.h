// The OpenAI-compatible HTTP front end over one Engine (cpp-httplib, thread per
// connection): /v1/chat/completions, /v1/completions (streaming via chunked SSE),
// /v1/models, /health, /metrics. Bad input becomes a 4xx JSON error and the server keeps
// serving; a client that disconnects mid-stream has its engine request cancelled.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "chat/tokenizer.h"
#include "runtime/engine.h"
#include "server/generation.h"
#include "server/generation_plan.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace dsv4 {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;               // 0 = any free port
  std::string api_key;           // empty: no auth
  int threads = 256;             // connection threads (each open connection holds one)
  double shutdown_grace_s = 5;   // in-flight requests get this long to finish on shutdown
  size_t max_body_bytes = size_t{32} << 20;
  std::string model_root;        // reported by /v1/models
};

class ApiServer {
 public:
  ApiServer(Engine& engine, const Tokenizer& tok, ApiConfig api, TokenMap map, HttpOptions opt);
  ~ApiServer();

  int bind();    // returns the bound port; throws Error when it cannot bind
  void serve();  // blocks until shutdown() has stopped the listener
  // Graceful stop (any thread, e.g. on SIGTERM): new requests get 503; in-flight ones get
  // shutdown_grace_s to finish, then are cancelled — their streams still end with a final
  // chunk (finish_reason "abort") and [DONE] — and the listener stops.
  void shutdown();

  Metrics& metrics() { return metrics_; }

 private:
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res) const;
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void begin(const std::shared_ptr<Generation>& g);
  void end(const std::shared_ptr<Generation>& g);

  Engine* engine_;
  const Tokenizer* tok_;
  ApiConfig api_;
  TokenMap map_;
  HttpOptions opt_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> svr_;
  std::atomic<bool> draining_{false};
  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::set<std::shared_ptr<Generation>> active_;
};

}  // namespace dsv4
