// `dsv4 bench serve`: a load generator for a running OpenAI-compatible server, reporting
// what `vllm bench serve` reports: request and token throughput, TTFT / TPOT / ITL / E2E
// mean and p50/p90/p99. Requests arrive at a fixed rate, as a Poisson process, or all at
// once, under an optional concurrency limit; prompts are random token ids of a fixed length
// (/v1/completions) or random words (/v1/chat/completions); outputs are forced to a fixed
// length with ignore_eos.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace dsv4 {

struct BenchServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "completions";  // completions | chat
  std::string model;                     // default: the first of /v1/models
  std::string api_key;
  int64_t num_prompts = 100;
  double request_rate = 0;      // requests/s; 0 = all at once
  std::string arrival = "poisson";  // poisson | fixed
  int64_t max_concurrency = 0;  // 0 = unlimited
  int64_t input_len = 32, output_len = 32;
  int64_t token_id_max = 500;   // random prompt ids are drawn from [10, token_id_max)
  uint64_t seed = 0;
  std::string json_out;         // also write the results as JSON here
};

CLI::App* add_bench_serve_command(CLI::App& parent, BenchServeOptions& opt);
int run_bench_serve(const BenchServeOptions& opt);

}  // namespace dsv4
