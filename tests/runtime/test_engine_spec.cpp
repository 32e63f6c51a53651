// Speculative decoding inside the engine (EngineOptions::speculative_tokens): greedy outputs of
// concurrent requests with chunked prefill and prefix caching equal plain decoding for
// k = 1..3, and seeded sampled outputs follow the target's exact distribution.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "spec_engine_checks.h"

namespace dsv4 {
namespace {


Model& tiny() {
  static Model m(load_weights(std::string(DSV4_SOURCE_DIR) + "/models/tiny"));
  return m;
}

TEST(EngineSpec, GreedyEqualsPlainDecodingAcrossBatchingChunkingAndCache) {
  const std::vector<Request> reqs = test::greedy_spec_requests();
  CpuBackend plain_be(tiny());
  EngineOptions base;
  base.limits.max_batch = 4;
  base.limits.prefill_chunk = 5;
  base.prefix_block = 8;
  Engine plain(plain_be, base);
  const auto want = test::run_engine(plain, reqs);
  for (int64_t k = 1; k <= 3; ++k) {
    CpuBackend be(tiny(), true);
    EngineOptions o = base;
    o.speculative_tokens = k;
    Engine e(be, o);
    EXPECT_EQ(test::run_engine(e, reqs), want) << "k " << k;
    const EngineStats s = e.stats();
    EXPECT_GT(s.spec_accepted_tokens, 0);
    EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
    EXPECT_GT(s.prefix_hit_tokens, 0);
    std::printf("  engine greedy k=%lld: %lld/%lld drafts accepted\n", static_cast<long long>(k),
                static_cast<long long>(s.spec_accepted_tokens), static_cast<long long>(s.spec_draft_tokens));
  }
}

TEST(EngineSpec, NeedsAnMtpBackend) {
  CpuBackend be(tiny());  // MTP off
  EngineOptions o;
  o.speculative_tokens = 2;
  EXPECT_THROW({ Engine e(be, o); }, Error);
}

// Sampled speculation follows the target's exact law (tests/runtime/spec_sampling_check.h).
TEST(EngineSpec, SampledTokensFollowTheTargetDistribution) {
  Model& m = tiny();
  auto target = [&m](const std::vector<int32_t>& ctx) {
    SequenceState st = m.new_sequence();
    SequenceChunk c{&st, ctx};
    return m.forward(std::span<const SequenceChunk>(&c, 1), false);
  };
  CpuBackend be(m, true);
  test::check_spec_sampling(target, be, test::spec_prompt(9, 3), "engine cpu");
}

}  // namespace
}  // namespace dsv4
