// Prometheus text exposition for /metrics: request counts by HTTP status and finish reason,
// token counters, latency histograms (TTFT, TPOT, inter-token, end-to-end) and the engine's
// gauges (queue depth, running sequences, KV usage). Names follow vLLM's with a dsv4: prefix.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace dsv4 {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` (e.g. model_name="x").
  void render(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct RequestTimings {
  double e2e = 0;                 // seconds from arrival to the last event
  double ttft = -1;               // -1: no token was produced
  std::vector<double> itl;        // gaps between consecutive tokens
  int64_t prompt_tokens = 0, generation_tokens = 0;
  std::string finish_reason;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);
  void count_http(const std::string& endpoint, int status);
  void on_request_finished(const RequestTimings& t);
  std::string render(const EngineStats& s) const;

 private:
  std::string labels_;  // model_name="..."
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> http_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, tpot_, itl_, e2e_;
};

}  // namespace dsv4
