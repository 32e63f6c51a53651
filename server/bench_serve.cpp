#include "server/bench_serve.h"

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <semaphore>
#include <thread>
#include <vector>

#include "chat/json_dumps.h"
#include "core/error.h"

namespace dsv4 {

namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

std::string first_model(httplib::Client& cli, const httplib::Headers& h) {
  auto r = cli.Get("/v1/models", h);
  DSV4_CHECK(r && r->status == 200, "bench serve: GET /v1/models failed",
             r ? " (HTTP " + std::to_string(r->status) + ")" : std::string(" (no connection)"));
  const ojson j = parse_json_ordered(r->body);
  DSV4_CHECK(j.contains("data") && !j["data"].empty(), "bench serve: the server lists no model");
  return j["data"][0]["id"].get<std::string>();
}

// One streamed request; token arrival times come from the SSE chunks that carry text.
Outcome run_one(const BenchServeOptions& o, const std::string& model, const ojson& prompt) {
  Outcome out;
  httplib::Client cli(o.host, o.port);
  cli.set_read_timeout(600, 0);
  ojson body = {{"model", model}, {"max_tokens", o.output_len}, {"ignore_eos", true}, {"temperature", 0},
                {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (o.endpoint == "chat") {
    body["messages"] = ojson::array({{{"role", "user"}, {"content", prompt}}});
    body["thinking"] = {{"type", "disabled"}};
  } else {
    body["prompt"] = prompt;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  if (!o.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + o.api_key);
  req.body = body.dump();
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  std::string buf;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos; buf.erase(0, end + 2)) {
      const std::string ev = buf.substr(0, end);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      ojson j;
      try {
        j = parse_json_ordered(ev.substr(6));
      } catch (const Error&) {
        continue;
      }
      if (j.contains("error")) out.error = j["error"].value("message", "stream error");
      if (j.contains("usage") && j["usage"].is_object()) {
        out.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
        out.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const ojson& c = j["choices"][0];
      bool text = c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty();
      if (c.contains("delta"))
        for (const char* k : {"content", "reasoning_content"})
          text = text || (c["delta"].contains(k) && c["delta"][k].is_string() && !c["delta"][k].get<std::string>().empty());
      if (!text) continue;
      const auto now = Clock::now();
      if (first) out.ttft = secs(t0, now);
      else out.itl.push_back(secs(last, now));
      first = false;
      last = now;
    }
    return true;
  };
  auto res = cli.send(req);
  out.e2e = secs(t0, Clock::now());
  if (!res) {
    out.error = "connection failed: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    out.error = "HTTP " + std::to_string(res->status);
  }
  out.ok = out.error.empty() && !first;
  return out;
}

void row(const char* name, double v, const char* fmt = "%.2f") {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  std::printf("%-40s %s\n", name, b);
}

}  // namespace

CLI::App* add_bench_serve_command(CLI::App& parent, BenchServeOptions& o) {
  auto* s = parent.add_subcommand("serve", "load-test a running dsv4 serve (like `vllm bench serve`)");
  s->add_option("--host", o.host)->capture_default_str();
  s->add_option("--port", o.port)->capture_default_str();
  s->add_option("--endpoint", o.endpoint, "completions or chat")->capture_default_str();
  s->add_option("--model", o.model, "model id (default: the first one /v1/models lists)");
  s->add_option("--api-key", o.api_key);
  s->add_option("--num-prompts", o.num_prompts)->capture_default_str();
  s->add_option("--request-rate", o.request_rate, "requests per second (0 = all at once)")->capture_default_str();
  s->add_option("--arrival", o.arrival, "poisson or fixed")->capture_default_str();
  s->add_option("--max-concurrency", o.max_concurrency, "requests in flight at most (0 = unlimited)")
      ->capture_default_str();
  s->add_option("--input-len", o.input_len, "prompt tokens (random ids; chat: random words)")->capture_default_str();
  s->add_option("--output-len", o.output_len, "generated tokens per request (ignore_eos)")->capture_default_str();
  s->add_option("--token-id-max", o.token_id_max, "random prompt ids are drawn below this")->capture_default_str();
  s->add_option("--seed", o.seed)->capture_default_str();
  s->add_option("--json-out", o.json_out, "write the results as JSON to this file");
  return s;
}

int run_bench_serve(const BenchServeOptions& o) {
  DSV4_CHECK(o.endpoint == "completions" || o.endpoint == "chat", "--endpoint must be completions or chat");
  DSV4_CHECK(o.arrival == "poisson" || o.arrival == "fixed", "--arrival must be poisson or fixed");
  DSV4_CHECK(o.num_prompts > 0 && o.input_len > 0 && o.output_len > 0, "--num-prompts, --input-len, --output-len must be > 0");
  DSV4_CHECK(o.token_id_max > 11, "--token-id-max must be > 11");
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  httplib::Client probe(o.host, o.port);
  const std::string model = o.model.empty() ? first_model(probe, h) : o.model;

  std::mt19937_64 rng(o.seed);
  std::vector<ojson> prompts;
  static const char* words[] = {"alpha", "river", "stone", "quiet", "orbit", "maple", "signal", "paper", "delta", "cloud"};
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    if (o.endpoint == "chat") {
      std::string t;
      for (int64_t k = 0; k < o.input_len; ++k) t += std::string(k ? " " : "") + words[rng() % 10];
      prompts.emplace_back(t);
    } else {
      ojson ids = ojson::array();
      for (int64_t k = 0; k < o.input_len; ++k) ids.push_back(10 + static_cast<int64_t>(rng() % uint64_t(o.token_id_max - 10)));
      prompts.push_back(ids);
    }
  }
  // Arrival offsets (seconds from the start).
  std::vector<double> at(static_cast<size_t>(o.num_prompts), 0.0);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  for (size_t i = 1; i < at.size() && o.request_rate > 0; ++i)
    at[i] = at[i - 1] + (o.arrival == "fixed" ? 1.0 / o.request_rate : gap(rng));

  std::counting_semaphore<1 << 20> slots(o.max_concurrency > 0 ? o.max_concurrency : (1 << 20));
  std::vector<Outcome> results(at.size());
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < at.size(); ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at[i])));
    slots.acquire();
    threads.emplace_back([&, i] {
      results[i] = run_one(o, model, prompts[i]);
      slots.release();
    });
  }
  for (auto& t : threads) t.join();
  const double dur = secs(t0, Clock::now());

  std::vector<double> ttft, tpot, itl, e2e;
  int64_t ok = 0, in_tok = 0, out_tok = 0;
  std::string first_error;
  for (const auto& r : results) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    in_tok += r.prompt_tokens;
    out_tok += r.output_tokens;
    ttft.push_back(r.ttft * 1e3);
    e2e.push_back(r.e2e * 1e3);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) * 1e3 / double(r.output_tokens - 1));
    for (double g : r.itl) itl.push_back(g * 1e3);
  }
  std::printf("============ Serving Benchmark Result ============\n");
  row("Endpoint:", 0, o.endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions");
  row("Successful requests:", double(ok), "%.0f");
  row("Failed requests:", double(o.num_prompts - ok), "%.0f");
  row("Request rate (req/s, 0 = burst):", o.request_rate);
  row("Max concurrency (0 = unlimited):", double(o.max_concurrency), "%.0f");
  row("Benchmark duration (s):", dur);
  row("Total input tokens:", double(in_tok), "%.0f");
  row("Total generated tokens:", double(out_tok), "%.0f");
  row("Request throughput (req/s):", double(ok) / dur);
  row("Output token throughput (tok/s):", double(out_tok) / dur);
  row("Total token throughput (tok/s):", double(in_tok + out_tok) / dur);
  auto block = [](const char* title, const char* name, const std::vector<double>& v) {
    std::printf("%s\n", title);
    char b[64];
    std::snprintf(b, sizeof b, "Mean %s (ms):", name);
    row(b, mean(v));
    for (double p : {50.0, 90.0, 99.0}) {
      std::snprintf(b, sizeof b, "P%.0f %s (ms):", p, name);
      row(b, percentile(v, p));
    }
  };
  block("---------------Time to First Token----------------", "TTFT", ttft);
  block("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot);
  block("---------------Inter-token Latency----------------", "ITL", itl);
  block("----------------End-to-end Latency----------------", "E2EL", e2e);
  std::printf("==================================================\n");
  if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  if (!o.json_out.empty()) {
    ojson j = {{"completed", ok},          {"failed", o.num_prompts - ok},     {"duration_s", dur},
               {"total_input_tokens", in_tok}, {"total_output_tokens", out_tok}, {"request_throughput", double(ok) / dur},
               {"output_throughput", double(out_tok) / dur}};
    for (auto [name, v] : {std::pair{"ttft_ms", &ttft}, {"tpot_ms", &tpot}, {"itl_ms", &itl}, {"e2el_ms", &e2e}})
      j[name] = {{"mean", mean(*v)}, {"p50", percentile(*v, 50)}, {"p90", percentile(*v, 90)}, {"p99", percentile(*v, 99)}};
    std::ofstream(o.json_out) << j.dump(2) << "\n";
  }
  return ok == o.num_prompts ? 0 : 1;
}

}  // namespace dsv4
