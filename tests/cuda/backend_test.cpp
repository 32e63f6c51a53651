// The serving engine over the CUDA backend (exact path) gives the same greedy tokens as over the
// CPU backend, with batching, chunked prefill and prefix-cache hits (device state snapshots);
// MTP speculation on the device leaves greedy outputs unchanged for k = 1..3 and sampled outputs
// follow the target's law (tests/runtime/spec_engine_checks.h, shared with the CPU tests).
#include <gtest/gtest.h>

#include <cmath>

#include "gpu_test.h"
#include "model/cuda/cuda_model.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/cuda_backend.h"
#include "runtime/engine.h"
#include "../runtime/spec_engine_checks.h"

namespace dsv4 {
namespace {

std::string tiny_dir() {
  const char* env = std::getenv("DSV4_SOURCE_DIR");
  return std::string(env && *env ? env : DSV4_SOURCE_DIR) + "/models/tiny";
}

std::vector<std::vector<int32_t>> run_requests(ModelBackend& backend, const std::vector<std::vector<int32_t>>& prompts,
                                               int64_t max_tokens, int64_t chunk, EngineStats* stats = nullptr,
                                               bool prefix_cache = true) {
  EngineOptions opt;
  opt.prefix_cache = prefix_cache;
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
  // Isolates the state snapshot/restore path: the same run without the prefix cache.
  EXPECT_EQ(run_requests(gpu, prompts, 12, 5, nullptr, false), want) << "chunked, no prefix cache";
  EXPECT_EQ(run_requests(gpu, prompts, 12, 0, nullptr, true), want) << "unchunked, prefix cache";
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, size_t begin, size_t n) {
  float m = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = d;  // NaN fails
  }
  return m;
}

// A verify chunk batched with a plain one returns every one of its rows, and accept() rolls the
// rejected tokens back: the sequence then continues exactly like one that never saw them.
TEST(CudaBackend, VerifyChunkAndAcceptRollBack) {
  DSV4_REQUIRE_GPU();
  CudaModel model(load_weights(tiny_dir()), cuda::Precision::Exact);
  CudaBackend gpu(model);
  const size_t V = static_cast<size_t>(gpu.config().vocab_size);
  std::vector<int32_t> ids;
  for (int i = 0; i < 48; ++i) ids.push_back(3 + (i * 53) % 400);
  auto run = [&](BackendSequence& s, size_t from, size_t n) {
    BackendChunk c{&s, std::span<const int32_t>(ids.data() + from, n), true};
    return gpu.forward(std::span<const BackendChunk>(&c, 1));
  };
  for (size_t prompt : {size_t{7}, size_t{15}, size_t{16}, size_t{30}}) {
    auto seq = gpu.new_sequence(64), other = gpu.new_sequence(64), ref = gpu.new_sequence(64);
    run(*seq, 0, prompt);
    run(*other, 0, 5);
    run(*ref, 0, prompt);
    // The reference feeds the two kept tokens one at a time: one logits row each.
    std::vector<float> ref_kept = run(*ref, prompt, 1);
    const std::vector<float> ref_second = run(*ref, prompt + 1, 1);
    ref_kept.insert(ref_kept.end(), ref_second.begin(), ref_second.end());
    ASSERT_EQ(ref_kept.size(), 2 * V);
    // Verify 4 tokens: 2 right, 2 wrong; the plain chunk of `other` shares the call.
    std::vector<int32_t> draft(ids.begin() + prompt, ids.begin() + prompt + 4);
    draft[2] = (draft[2] + 1) % static_cast<int32_t>(V);
    draft[3] = (draft[3] + 2) % static_cast<int32_t>(V);
    BackendChunk both[2] = {{other.get(), std::span<const int32_t>(ids.data() + 5, 3), true},
                            {seq.get(), std::span<const int32_t>(draft), false, true}};
    const std::vector<float> got = gpu.forward(std::span<const BackendChunk>(both, 2));
    ASSERT_EQ(got.size(), 5 * V);  // 1 row for `other`, 4 for the verify chunk
    std::vector<float> verify_kept(got.begin() + V, got.begin() + 3 * V);
    EXPECT_LE(max_abs_diff(verify_kept, ref_kept, 0, 2 * V), 1e-5f) << "prompt " << prompt;
    gpu.accept(*seq, static_cast<int64_t>(prompt + 2));
    ASSERT_EQ(seq->pos(), static_cast<int64_t>(prompt + 2));
    for (size_t t = prompt + 2; t < prompt + 8; ++t) {
      const std::vector<float> a = run(*seq, t, 1), b = run(*ref, t, 1);
      ASSERT_LE(max_abs_diff(a, b, 0, V), 1e-5f) << "prompt " << prompt << " step " << t;
    }
  }
}

Model& cpu_tiny() {
  static Model m(load_weights(tiny_dir()));
  return m;
}

TEST(CudaBackend, SpeculativeGreedyEqualsPlainAndCpuSpeculation) {
  DSV4_REQUIRE_GPU();
  CudaModel model(load_weights(tiny_dir()), cuda::Precision::Exact);
  model.set_poison(true);
  const std::vector<Request> reqs = test::greedy_spec_requests();
  EngineOptions base;
  base.kv_memory_bytes = size_t{256} << 20;
  base.limits.max_batch = 4;
  base.limits.prefill_chunk = 5;
  base.prefix_block = 8;
  CudaBackend plain_be(model);
  Engine plain(plain_be, base);
  const auto want = test::run_engine(plain, reqs);
  for (int64_t k = 1; k <= 3; ++k) {
    EngineOptions o = base;
    o.speculative_tokens = k;
    CudaBackend be(model, true);
    Engine e(be, o);
    EXPECT_EQ(test::run_engine(e, reqs), want) << "k " << k;
    const EngineStats s = e.stats();
    EXPECT_GT(s.spec_accepted_tokens, 0);
    EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
    EXPECT_GT(s.prefix_hit_tokens, 0);
    // The CPU engine drafts the same tokens: equal acceptance counts.
    CpuBackend cpu_be(cpu_tiny(), true);
    Engine cpu(cpu_be, o);
    EXPECT_EQ(test::run_engine(cpu, reqs), want) << "cpu k " << k;
    EXPECT_EQ(cpu.stats().spec_accepted_tokens, s.spec_accepted_tokens) << "k " << k;
    EXPECT_EQ(cpu.stats().spec_draft_tokens, s.spec_draft_tokens) << "k " << k;
    std::printf("  cuda engine greedy k=%lld: %lld/%lld drafts accepted\n", static_cast<long long>(k),
                static_cast<long long>(s.spec_accepted_tokens), static_cast<long long>(s.spec_draft_tokens));
  }
}

TEST(CudaBackend, SpeculativeSamplingFollowsTheTargetDistribution) {
  DSV4_REQUIRE_GPU();
  CudaModel model(load_weights(tiny_dir()), cuda::Precision::Exact);
  auto target = [&model](const std::vector<int32_t>& ctx) {
    DeviceSequence seq = model.new_sequence(static_cast<int64_t>(ctx.size()));
    DeviceChunk c{&seq, ctx};
    return model.forward(std::span<const DeviceChunk>(&c, 1), false);
  };
  CudaBackend be(model, true);
  test::check_spec_sampling(target, be, test::spec_prompt(9, 3), "cuda engine");
}

}  // namespace
}  // namespace dsv4
