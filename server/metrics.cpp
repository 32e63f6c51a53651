#include "server/metrics.h"

#include <cstdio>

namespace dsv4 {

namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

const std::vector<double> kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                             0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};

}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds_(std::move(b)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string& out) const {
  out += "# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + model_name + "\""),
      ttft_(kLatencyBuckets),
      tpot_(kLatencyBuckets),
      itl_(kLatencyBuckets),
      e2e_(kLatencyBuckets) {}

void Metrics::count_http(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++http_[{endpoint, status}];
}

void Metrics::on_request_finished(const RequestTimings& t) {
  std::lock_guard<std::mutex> lk(mu_);
  ++finished_[t.finish_reason];
  prompt_tokens_ += static_cast<uint64_t>(t.prompt_tokens);
  generation_tokens_ += static_cast<uint64_t>(t.generation_tokens);
  e2e_.observe(t.e2e);
  if (t.ttft >= 0) ttft_.observe(t.ttft);
  // TPOT as vLLM defines it: decode time spread over the tokens after the first.
  if (t.ttft >= 0 && t.generation_tokens > 1) tpot_.observe((t.e2e - t.ttft) / double(t.generation_tokens - 1));
  for (double g : t.itl) itl_.observe(g);
}

std::string Metrics::render(const EngineStats& s) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    o += std::string("# HELP dsv4:") + name + " " + help + "\n# TYPE dsv4:" + name + " gauge\n";
    o += std::string("dsv4:") + name + "{" + labels_ + "} " + num(v) + "\n";
  };
  auto counter = [&](const char* name, const char* help, double v) {
    o += std::string("# HELP dsv4:") + name + " " + help + "\n# TYPE dsv4:" + name + " counter\n";
    o += std::string("dsv4:") + name + "{" + labels_ + "} " + num(v) + "\n";
  };
  gauge("num_requests_running", "Sequences in the running batch.", double(s.running));
  gauge("num_requests_waiting", "Requests queued for admission.", double(s.waiting));
  gauge("kv_cache_usage_perc", "Fraction of the KV/state budget in use (0-1).",
        s.kv_budget ? double(s.kv_used) / double(s.kv_budget) : 0.0);
  gauge("kv_cache_used_bytes", "Bytes of the KV/state budget in use.", double(s.kv_used));
  gauge("kv_cache_budget_bytes", "Bytes of the KV/state budget.", double(s.kv_budget));
  gauge("prefix_cache_entries", "Prefix-cache snapshots held.", double(s.prefix_cache_entries));
  gauge("prefix_cache_bytes", "Bytes of the KV/state budget held by prefix-cache snapshots.",
        double(s.prefix_cache_bytes));
  counter("prefix_cache_hit_tokens_total", "Prompt tokens restored from the prefix cache.", double(s.prefix_hit_tokens));
  counter("num_preemptions_total", "Sequences preempted (recomputed later) for lack of KV memory.",
          double(s.preemptions));
  // vLLM's spec-decode names; acceptance rate = accepted / draft.
  counter("spec_decode_num_draft_tokens_total", "MTP draft tokens proposed (speculative decoding).",
          double(s.spec_draft_tokens));
  counter("spec_decode_num_accepted_tokens_total", "MTP draft tokens accepted by verification.",
          double(s.spec_accepted_tokens));
  counter("prompt_tokens_total", "Prompt tokens of finished requests.", double(prompt_tokens_));
  counter("generation_tokens_total", "Generated tokens of finished requests.", double(generation_tokens_));

  o += "# HELP dsv4:http_requests_total HTTP responses by endpoint and status code.\n";
  o += "# TYPE dsv4:http_requests_total counter\n";
  for (const auto& [k, n] : http_)
    o += "dsv4:http_requests_total{" + labels_ + ",endpoint=\"" + k.first + "\",status=\"" +
         std::to_string(k.second) + "\"} " + std::to_string(n) + "\n";
  o += "# HELP dsv4:request_success_total Finished generations by finish reason.\n";
  o += "# TYPE dsv4:request_success_total counter\n";
  for (const auto& [k, n] : finished_)
    o += "dsv4:request_success_total{" + labels_ + ",finished_reason=\"" + k + "\"} " + std::to_string(n) + "\n";
  ttft_.render("dsv4:time_to_first_token_seconds", labels_, o);
  tpot_.render("dsv4:time_per_output_token_seconds", labels_, o);
  itl_.render("dsv4:inter_token_latency_seconds", labels_, o);
  e2e_.render("dsv4:e2e_request_latency_seconds", labels_, o);
  return o;
}

}  // namespace dsv4
