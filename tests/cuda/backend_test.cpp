// The serving engine over the CUDA backend (exact path) gives the same greedy tokens as over the
// CPU backend, with batching, chunked prefill and prefix-cache hits (device state snapshots).
#include <gtest/gtest.h>

#include "gpu_test.h"
#include "model/cuda/cuda_model.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/engine.h"

namespace dsv4 {
namespace {

std::string tiny_dir() {
  const char* env = std::getenv("DSV4_SOURCE_DIR");
  return std::string(env && *env ? env : DSV4_SOURCE_DIR) + "/models/tiny";
}

std::vector<std::vector<int32_t>> run_requests(ModelBackend& backend, const std::vector<std::vector<int32_t>>& prompts,
                                               int64_t max_tokens, int64_t chunk, EngineStats* stats = nullptr) {
  EngineOptions opt;
  opt.kv_memory_bytes = size_t{256} << 20;
  opt.limits.max_batch = 4;
  opt.limits.prefill_chunk = chunk;
  opt.prefix_block = 16;
  Engine engine(backend, opt);
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.sampling.temperature = 0;
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    r.on_event = [&out, i](const TokenEvent& e) {
      if (e.token >= 0) out[i].push_back(e.token);
    };
    engine.submit(std::move(r));
  }
  engine.run_until_idle();
  if (stats) *stats = engine.stats();
  return out;
}

TEST(CudaBackend, EngineMatchesCpuBackendWithBatchingAndPrefixHits) {
  DSV4_REQUIRE_GPU();
  ModelWeights w = load_weights(tiny_dir());
  Model cpu_model(load_weights(tiny_dir()));
  CpuBackend cpu(cpu_model);
  CudaModel gpu_model(w, cuda::Precision::Exact);
  CudaBackend gpu(gpu_model);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> shared;
  for (int i = 0; i < 40; ++i) shared.push_back(3 + (i * 37) % 500);
  for (int k = 0; k < 5; ++k) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + 20 + 4 * k);  // common prefix → cache hits
    p.push_back(100 + k);
    prompts.push_back(p);
  }
  prompts.push_back({7});
  const auto want = run_requests(cpu, prompts, 12, 0);
  EngineStats st;
  const auto got = run_requests(gpu, prompts, 12, 5, &st);
  EXPECT_EQ(got, want);
  EXPECT_GT(st.prefix_hit_tokens, 0) << "the test meant to exercise prefix-cache hits on the GPU";
}

}  // namespace
}  // namespace dsv4
