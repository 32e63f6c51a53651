#include "server/http_server.h"

#include <httplib.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"
#include "server/api_error.h"
#include "server/request_parse.h"
#include "server/response_builder.h"
#include "server/sse.h"

namespace dsv4 {

namespace {

using namespace std::chrono_literals;

void send_json(httplib::Response& res, int status, const ojson& body) {
  res.status = status;
  res.set_content(compact_json(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, error_body(e)); }

// Label for /metrics: known routes by name, everything else as one bucket (garbage paths
// must not create unbounded label sets).
std::string endpoint_label(const std::string& path) {
  for (const char* p : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == p) return p;
  return "other";
}

ojson parse_body(const httplib::Request& req) {
  try {
    return parse_json_ordered(req.body);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what(), "", "invalid_json");
  }
}

struct StreamState {
  std::shared_ptr<Generation> gen;
  ResponseBuilder builder;
  bool include_usage = false;
  bool opened = false;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// One provider call: waits up to 100 ms for deltas and writes them as SSE. False = abort.
bool write_stream(StreamState& st, httplib::DataSink& sink) {
  std::string out;
  if (!st.opened) {
    out = st.builder.stream_open();
    st.opened = true;
  }
  std::vector<OutputDelta> d;
  const bool fin = st.gen->poll(100ms, d);
  out += st.builder.stream_deltas(d, st.gen->take_logprobs());
  if (fin) out += st.builder.stream_close(st.gen->summary(), st.include_usage);
  const auto now = std::chrono::steady_clock::now();
  // While nothing is produced (queued, long prefill) a comment line every second tells
  // us whether the client is still there.
  if (out.empty() && now - st.last_write > 1s) out = sse_keepalive();
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) return false;  // client gone: releaser cancels
    st.last_write = now;
  }
  if (fin) sink.done();
  return true;
}

}  // namespace

ApiServer::ApiServer(Engine& engine, const Tokenizer& tok, ApiConfig api, TokenMap map, HttpOptions opt)
    : engine_(&engine),
      tok_(&tok),
      api_(std::move(api)),
      map_(map),
      opt_(std::move(opt)),
      metrics_(api_.served_model_name),
      svr_(std::make_unique<httplib::Server>()) {
  const size_t threads = static_cast<size_t>(std::max(opt_.threads, 4));
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_payload_max_length(opt_.max_body_bytes);
  svr_->set_read_timeout(10, 0);  // a client that sends half a request does not hold a thread forever
  routes();
}

ApiServer::~ApiServer() = default;

int ApiServer::bind() {
  int port = opt_.port;
  if (port == 0) {
    port = svr_->bind_to_any_port(opt_.host);
    DSV4_CHECK(port > 0, "serve: cannot bind ", opt_.host);
  } else {
    DSV4_CHECK(svr_->bind_to_port(opt_.host, port), "serve: cannot bind ", opt_.host, ":", port,
               " (in use, or not a local address)");
  }
  return port;
}

void ApiServer::serve() { svr_->listen_after_bind(); }

void ApiServer::shutdown() {
  draining_ = true;
  std::unique_lock<std::mutex> lk(mu_);
  const auto grace = std::chrono::duration<double>(opt_.shutdown_grace_s);
  if (!idle_cv_.wait_for(lk, grace, [&] { return active_.empty(); })) {
    std::fprintf(stderr, "dsv4 serve: cancelling %zu in-flight request(s)\n", active_.size());
    for (const auto& g : active_) g->cancel();
    // Cancelled requests finish within one engine step; their handlers send the last chunk.
    idle_cv_.wait_for(lk, 30s, [&] { return active_.empty(); });
  }
  lk.unlock();
  svr_->stop();
}

void ApiServer::begin(const std::shared_ptr<Generation>& g) {
  std::lock_guard<std::mutex> lk(mu_);
  active_.insert(g);
}

void ApiServer::end(const std::shared_ptr<Generation>& g) {
  bool idle = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    active_.erase(g);
    idle = active_.empty();
  }
  if (idle) {
    idle_cv_.notify_all();
    // glibc keeps freed request memory in per-thread arenas; hand it back when idle so the
    // resident size returns to its idle level after a burst.
    malloc_trim(0);
  }
}

bool ApiServer::authorized(const httplib::Request& req, httplib::Response& res) const {
  if (opt_.api_key.empty()) return true;
  const std::string want = "Bearer " + opt_.api_key;
  if (req.get_header_value("Authorization") == want) return true;
  const bool given = req.has_header("Authorization");
  send_error(res, ApiError(401, given ? "Incorrect API key provided" : "Missing API key (Authorization: Bearer ...)", "",
                           "invalid_api_key"));
  return false;
}

void ApiServer::routes() {
  httplib::Server& s = *svr_;
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_http(endpoint_label(req.path), res.status);
  });
  // Errors httplib raises itself (unknown route, body too large, bad request line) get an
  // OpenAI-shaped body; errors our handlers set already have one.
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404   ? "no route " + req.method + " " + req.path
                            : res.status == 413 ? std::string("request body too large")
                                                : std::string("bad request");
    send_json(res, res.status, error_body(res.status, msg));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg += std::string(": ") + e.what();
    } catch (...) {
    }
    send_json(res, 500, error_body(500, msg));
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) return send_json(res, 503, error_body(503, "shutting down"));
    send_json(res, 200, {{"status", "ok"}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(engine_->stats()), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    ojson m = {{"id", api_.served_model_name}, {"object", "model"},          {"created", now},
               {"owned_by", "dsv4"},           {"root", opt_.model_root},    {"parent", nullptr},
               {"max_model_len", api_.max_model_len}};
    send_json(res, 200, {{"object", "list"}, {"data", ojson::array({m})}});
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
}

void ApiServer::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (!authorized(req, res)) return;
  if (draining_) return send_error(res, ApiError(503, "the server is shutting down"));
  GenerationPlan plan;
  std::shared_ptr<Generation> gen;
  try {
    const ojson body = parse_body(req);
    plan = chat ? parse_chat_request(body, api_, *tok_) : parse_completion_request(body, api_, *tok_);
    gen = std::make_shared<Generation>(*engine_, *tok_, plan, map_, &metrics_);
  } catch (const ApiError& e) {
    return send_error(res, e);
  } catch (const nlohmann::json::exception& e) {  // a field of an unexpected JSON type
    return send_error(res, ApiError(400, std::string("invalid request: ") + e.what()));
  } catch (const Error& e) {
    return send_error(res, ApiError(400, e.what()));
  }
  begin(gen);

  if (!plan.stream) {
    ResponseBuilder b(chat, api_.served_model_name, plan.sampling.logprobs);
    std::vector<OutputDelta> d;
    while (!gen->poll(1000ms, d)) {
      b.add(d, gen->take_logprobs());
      d.clear();
    }
    b.add(d, gen->take_logprobs());
    const GenerationSummary& sum = gen->summary();
    if (sum.finish_reason == "error")
      send_json(res, 500, error_body(500, sum.error, "", "", "server_error"));
    else
      send_json(res, 200, b.final_response(sum));
    end(gen);
    return;
  }

  auto st = std::make_shared<StreamState>(StreamState{gen, ResponseBuilder(chat, api_.served_model_name, plan.sampling.logprobs)});
  st->include_usage = plan.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        try {
          return write_stream(*st, sink);
        } catch (const std::exception& e) {  // never let an exception reach httplib's writer thread
          std::fprintf(stderr, "dsv4 serve: stream aborted: %s\n", e.what());
          return false;
        }
      },
      [this, st](bool) {
        st->gen->cancel();  // no-op when it finished; frees the engine's pages when the client left
        end(st->gen);
      });
}

}  // namespace dsv4
