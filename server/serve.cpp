#include "server/serve.h"

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "chat/tokenizer.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/kv_budget.h"
#include "server/http_server.h"
#include "server/serve_backend.h"

namespace dsv4 {

namespace {

// §0: the 0731 encoder defines REASONING_EFFORT_PROMPTS; the preview one does not.
EffortProfile detect_profile(const std::string& model_dir, const std::string& choice) {
  if (choice == "preview") return EffortProfile::kPreview;
  if (choice == "0731") return EffortProfile::k0731;
  DSV4_CHECK(choice == "auto", "--reasoning-effort-profile must be auto, preview or 0731, got ", choice);
  std::ifstream f(model_dir + "/encoding/encoding_dsv4.py");
  if (!f) return EffortProfile::kPreview;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str().find("REASONING_EFFORT_PROMPTS") != std::string::npos ? EffortProfile::k0731
                                                                         : EffortProfile::kPreview;
}

}  // namespace

CLI::App* add_serve_command(CLI::App& app, ServeOptions& o) {
  auto* s = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat/completions, completions, models, metrics)");
  s->add_option("model_dir", o.model_dir, "checkpoint folder (config.json, *.safetensors, tokenizer.json)")->required();
  s->add_option("--host", o.host, "address to listen on")->capture_default_str();
  s->add_option("--port", o.port, "port (0 = any free port)")->capture_default_str();
  s->add_option("--api-key", o.api_key, "require Authorization: Bearer KEY on /v1/*");
  s->add_option("--served-model-name", o.served_model_name, "model id clients send (default: folder name)");
  s->add_option("--kv-memory", o.kv_memory, "KV/state budget, e.g. 1GiB, 512MiB")->capture_default_str();
  s->add_option("--max-num-seqs", o.max_num_seqs, "sequences per engine step")->capture_default_str();
  s->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "tokens per engine step")->capture_default_str();
  s->add_option("--max-model-len", o.max_model_len, "context limit (0 = config, capped by the kv budget)")
      ->capture_default_str();
  s->add_option("--default-thinking", o.default_thinking, "thinking mode when a request does not say (true/false)")
      ->capture_default_str();
  s->add_option("--reasoning-effort-profile", o.reasoning_effort_profile, "auto, preview or 0731 (serving.md §2.10)")
      ->capture_default_str();
  s->add_option("--shutdown-grace", o.shutdown_grace_s, "seconds in-flight requests may run after SIGTERM")
      ->capture_default_str();
  s->add_option("--http-threads", o.http_threads, "connection threads")->capture_default_str();
  s->add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  s->add_option("--precision", o.precision, "cuda: exact (fp32) or fast (FP8/FP4 tensor cores)")->capture_default_str();
  s->add_option("--gpu-memory-utilization", o.gpu_memory_utilization,
                "cuda: fraction of device memory for weights + KV (the KV budget is what is left of it)")
      ->capture_default_str();
  s->add_option("--speculative-tokens", o.speculative_tokens,
                "MTP draft tokens per decode step (0 = off; CPU, needs mtp.* weights)")
      ->capture_default_str();
  s->add_option("--fake-output-file", o.fake_output_file,
                "TEST ONLY: replay scripted model output from this JSON file instead of running the model");
  s->add_option("--tp", o.tp, "tensor-parallel degree (attention heads, shared expert)")->capture_default_str();
  s->add_option("--ep", o.ep, "expert-parallel degree (routed experts)")->capture_default_str();
  return s;
}

int run_serve(const ServeOptions& o) {
  // Signals go to one waiting thread; every other thread (engine, connections) inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a vanished client must be a failed write, not a dead server

  const std::string dir = o.model_dir;
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  BackendChoice bc{o.device, o.precision, o.gpu_memory_utilization, o.speculative_tokens, o.fake_output_file};
  bc.tp = o.tp;
  bc.ep = o.ep;
  check_backend_choice(bc);  // before the (slow) weight load
  ServeBackend sb = make_serve_backend(dir, tok, bc);
  ModelBackend* backend = sb.backend.get();
  const int64_t model_vocab = backend->config().vocab_size;
  // A tokenizer that can emit ids the model has no embedding for is a mismatched folder.
  DSV4_CHECK(static_cast<int64_t>(tok.vocab_size()) <= model_vocab, "tokenizer.json has ", tok.vocab_size(),
             " ids but the model's vocab_size is ", model_vocab, ": tokenizer and checkpoint do not match");

  EngineOptions eo;
  eo.kv_memory_bytes = sb.kv_budget > 0 ? sb.kv_budget : parse_memory_size(o.kv_memory);
  eo.speculative_tokens = o.speculative_tokens;
  eo.limits.max_batch = o.max_num_seqs;
  eo.limits.max_tokens_per_step = o.max_num_batched_tokens;
  eo.max_model_len = o.max_model_len;
  DSV4_CHECK(o.max_num_seqs > 0 && o.max_num_batched_tokens > 0, "--max-num-seqs and --max-num-batched-tokens must be > 0");
  Engine engine(*backend, eo);

  ApiConfig api;
  api.served_model_name = o.served_model_name.empty()
                              ? std::filesystem::path(dir).lexically_normal().filename().string()
                              : o.served_model_name;
  if (api.served_model_name.empty()) api.served_model_name = std::filesystem::path(dir).parent_path().filename().string();
  api.max_model_len = engine.max_model_len();
  api.default_thinking = o.default_thinking;
  api.effort_profile = detect_profile(dir, o.reasoning_effort_profile);

  HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.api_key = o.api_key;
  ho.threads = o.http_threads;
  ho.shutdown_grace_s = o.shutdown_grace_s;
  ho.model_root = dir;
  ApiServer server(engine, tok, api, TokenMap{model_vocab}, ho);
  const int port = server.bind();
  engine.start();
  std::fprintf(stderr, "dsv4 serve: model %s (%s); %s\ndsv4 serve: listening on http://%s:%d\n",
               api.served_model_name.c_str(), dir.c_str(), engine.summary().c_str(), o.host.c_str(), port);
  std::fflush(stderr);

  std::atomic<bool> done{false};
  std::thread waiter([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!done) {
      const int sig = sigtimedwait(&sigs, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "dsv4 serve: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        server.shutdown();
        return;
      }
    }
  });
  server.serve();
  done = true;
  waiter.join();
  engine.stop();
  std::fprintf(stderr, "dsv4 serve: stopped\n");
  return 0;
}

}  // namespace dsv4
