#include "tools/bench_spec.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cuda/check.h"
#include "runtime/cuda_backend.h"
#include "runtime/engine.h"
#include "runtime/kv_budget.h"

namespace dsv4 {

namespace {

struct DecodeRun {
  double seconds = 0;  // decode phase: from every request's first token to the last one
  int64_t tokens = 0, steps = 0, drafted = 0, accepted = 0;
};

// B greedy requests of `context` random prompt tokens, `gen` new tokens each, through the engine.
DecodeRun engine_decode(CudaModel& model, int64_t B, int64_t k, const BenchOptions& opt, std::mt19937& rng) {
  CudaBackend backend(model, k > 0);
  size_t free_b = 0, total_b = 0;
  DSV4_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  EngineOptions eo;
  eo.kv_memory_bytes = gpu_kv_budget(total_b, total_b - free_b, 0.9);
  eo.limits.max_batch = B;
  eo.prefix_cache = false;  // random prompts: nothing to share
  eo.speculative_tokens = k;
  Engine engine(backend, eo);
  std::uniform_int_distribution<int32_t> tok(2, static_cast<int32_t>(model.config().vocab_size) - 1);
  const int64_t gen = 4 * opt.steps;
  std::vector<int64_t> got(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    Request r;
    for (int64_t i = 0; i < opt.context; ++i) r.prompt.push_back(tok(rng));
    r.sampling.temperature = 0;
    r.stop.max_tokens = gen;
    r.stop.ignore_eos = true;
    r.on_event = [&got, b](const TokenEvent& e) { got[static_cast<size_t>(b)] += e.token >= 0; };
    engine.submit(std::move(r));
  }
  auto all_started = [&] {
    for (int64_t n : got)
      if (n == 0) return false;
    return true;
  };
  while (!all_started() && engine.step()) {
  }
  const EngineStats s0 = engine.stats();
  const auto t0 = std::chrono::steady_clock::now();
  engine.run_until_idle();
  DecodeRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats s1 = engine.stats();
  r.tokens = s1.generated_tokens - s0.generated_tokens;
  r.steps = s1.steps - s0.steps;
  r.drafted = s1.spec_draft_tokens - s0.spec_draft_tokens;
  r.accepted = s1.spec_accepted_tokens - s0.spec_accepted_tokens;
  return r;
}

}  // namespace

void bench_speculative(CudaModel& model, const BenchOptions& opt) {
  const int64_t k = opt.speculative_tokens;
  std::mt19937 rng(static_cast<uint32_t>(opt.seed) + 7);
  std::printf("engine decode, greedy, context %lld, %lld new tokens per request (MTP k=%lld vs none)\n",
              (long long)opt.context, (long long)(4 * opt.steps), (long long)k);
  std::printf("%-6s %-4s %-10s %-12s %-11s %-16s %-16s\n", "batch", "k", "step ms", "tokens/s", "accepted",
              "proj. a=0.6 tok/s", "proj. a=0.8 tok/s");
  for (int64_t B : opt.batches) {
    for (int64_t kk : {int64_t{0}, k}) {
      const DecodeRun r = engine_decode(model, B, kk, opt, rng);
      const double step_s = r.seconds / double(std::max<int64_t>(1, r.steps));
      auto projected = [&](double a) {  // tokens per round: 1 + a + … + a^k
        const double per_round = kk == 0 ? 1.0 : (1.0 - std::pow(a, double(kk + 1))) / (1.0 - a);
        return double(B) * per_round / step_s;
      };
      char acc[32] = "-";
      if (kk > 0)
        std::snprintf(acc, sizeof acc, "%.1f%%", 100.0 * double(r.accepted) / double(std::max<int64_t>(1, r.drafted)));
      std::printf("%-6lld %-4lld %-10.3f %-12.1f %-11s %-16.1f %-16.1f\n", (long long)B, (long long)kk, step_s * 1e3,
                  double(r.tokens) / r.seconds, acc, projected(0.6), projected(0.8));
    }
  }
}

}  // namespace dsv4
