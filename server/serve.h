// `dsv4 serve MODEL_DIR ...`: loads the checkpoint and its tokenizer, starts the engine and
// the HTTP server, and runs until SIGTERM/SIGINT (graceful: exit 0 once in-flight
// requests are finished or cancelled).
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace dsv4 {

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;  // default: the model folder's name
  std::string kv_memory = "1GiB";
  int64_t max_num_seqs = 8;
  int64_t max_num_batched_tokens = 512;
  int64_t max_model_len = 0;  // 0: what the config and the kv budget allow
  bool default_thinking = true;
  std::string reasoning_effort_profile = "auto";  // auto | preview | 0731
  double shutdown_grace_s = 5;
  int http_threads = 256;
  std::string device = "cpu";        // cpu | cuda
  std::string precision = "exact";   // cuda: exact | fast
  double gpu_memory_utilization = 0.9;
  int64_t speculative_tokens = 0;    // MTP drafts per decode step (CPU)
  std::string fake_output_file;  // TEST ONLY: replay scripted output (server/scripted_backend.h)
  int tp = 1, ep = 1;            // tensor / expert parallel degrees (CPU: ranks simulated in-process)
};

// Adds the `serve` subcommand and its options to `app`, writing into `opt`.
CLI::App* add_serve_command(CLI::App& app, ServeOptions& opt);
int run_serve(const ServeOptions& opt);

}  // namespace dsv4
