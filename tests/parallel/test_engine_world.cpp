// The serving engine over a simulated TP × EP world (ParallelCpuBackend): continuous batching,
// chunked prefill and prefix-cache restores give the same greedy tokens as over the
// single-rank CpuBackend.
#include <gtest/gtest.h>

#include "model/model.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/parallel_cpu_backend.h"
#include "tests/parallel/test_models.h"

namespace dsv4 {
namespace {

std::vector<std::vector<int32_t>> run(ModelBackend& be) {
  EngineOptions o;
  o.kv_memory_bytes = size_t{64} << 20;
  o.limits = {3, 24, 8};  // 3 sequences, 24 tokens per step, prefill chunks of 8
  o.prefix_block = 8;
  Engine eng(be, o);
  const int n = 5;
  std::vector<std::vector<int32_t>> out(n);
  for (int i = 0; i < n; ++i) {
    Request r;
    for (int k = 0; k < 9 + 4 * i; ++k) r.prompt.push_back(static_cast<int32_t>((k * 29 + (k < 8 ? 0 : i * 53)) % 256));
    r.sampling.temperature = 0;
    r.stop.max_tokens = 6;
    r.stop.ignore_eos = true;
    r.on_event = [&out, i](const TokenEvent& e) {
      if (e.token >= 0) out[i].push_back(e.token);
    };
    eng.submit(std::move(r));
  }
  eng.run_until_idle();
  return out;
}

TEST(ParallelEngine, GreedyTokensEqualSingleRank) {
  const ModelWeights& w = test::test_weights("tiny-tp");
  Model single(w);
  CpuBackend one(single);
  const auto ref = run(one);
  for (ParallelLayout l : {ParallelLayout{1, 4}, ParallelLayout{2, 4}}) {
    LocalWorld world(w, l);
    ParallelCpuBackend be(world);
    EXPECT_EQ(run(be), ref) << "tp " << l.tp << " ep " << l.ep;
  }
  EXPECT_EQ(ref[0].size(), 6u);
}

}  // namespace
}  // namespace dsv4
