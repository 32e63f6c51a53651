// The CPU engine against the transformers 5.17 fp32 oracle (scripts/make_goldens.py):
// full prefill, every prefill length, chunked prefill, token-by-token decode, and the quantised
// checkpoint against its dequantised twin.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include "golden_case.h"

namespace dsv4::test {
namespace {

constexpr float kOracleTol = 1e-3f;
constexpr float kQuantTwinTol = 1e-4f;

std::vector<float> run_chunks(Model& m, const std::vector<int32_t>& ids, size_t n, size_t chunk) {
  SequenceState st = m.new_sequence();
  std::vector<float> all;
  for (size_t i = 0; i < n; i += chunk) {
    const size_t k = std::min(chunk, n - i);
    SequenceChunk c{&st, std::span<const int32_t>(ids.data() + i, k)};
    std::vector<float> l = m.forward(std::span<const SequenceChunk>(&c, 1), true);
    all.insert(all.end(), l.begin(), l.end());
  }
  EXPECT_EQ(st.pos, static_cast<int64_t>(n));
  return all;
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  const GoldenCase& c() { return golden_case(GetParam()); }
};

class CleanupTemp : public ::testing::Environment {
 public:
  void TearDown() override { remove_golden_checkpoints(); }
};
const auto* kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupTemp);

TEST_P(Golden, FullPrefillMatchesOracle) {
  Model m(load_weights(c().dequant_dir));
  const size_t L = c().ids.size(), V = static_cast<size_t>(c().cfg.vocab_size);
  std::vector<float> got = run_chunks(m, c().ids, L, L);
  ASSERT_EQ(got.size(), L * V);
  const float diff = max_abs_diff(got.data(), c().logits.data(), L * V);
  RecordProperty("max_abs_diff", std::to_string(diff));
  std::printf("  %s: max |logit - oracle| = %.3g over %zu x %zu\n", GetParam().c_str(), diff, L, V);
  EXPECT_LE(diff, kOracleTol);
}

TEST_P(Golden, EveryPrefillLengthMatchesOracle) {
  Model m(load_weights(c().dequant_dir));
  const size_t V = static_cast<size_t>(c().cfg.vocab_size);
  const size_t L = std::min<size_t>(c().ids.size(), 70);
  for (size_t n = 1; n <= L; ++n) {
    std::vector<float> got = run_chunks(m, c().ids, n, n);
    ASSERT_LE(max_abs_diff(got.data(), c().logits.data(), n * V), kOracleTol) << "prefill length " << n;
  }
}

TEST_P(Golden, ChunkedPrefillMatchesOracle) {
  Model m(load_weights(c().dequant_dir));
  const size_t L = c().ids.size(), V = static_cast<size_t>(c().cfg.vocab_size);
  for (size_t chunk : {1, 2, 3, 5, 7, 16, 33}) {
    std::vector<float> got = run_chunks(m, c().ids, L, chunk);
    ASSERT_LE(max_abs_diff(got.data(), c().logits.data(), L * V), kOracleTol) << "chunk " << chunk;
  }
}

TEST_P(Golden, DecodeStepsMatchOracleCacheRun) {
  Model m(load_weights(c().dequant_dir));
  const size_t V = static_cast<size_t>(c().cfg.vocab_size), P = static_cast<size_t>(c().prefill);
  SequenceState st = m.new_sequence();
  SequenceChunk pre{&st, std::span<const int32_t>(c().ids.data(), P)};
  std::vector<float> last = m.forward(std::span<const SequenceChunk>(&pre, 1), false);
  ASSERT_LE(max_abs_diff(last.data(), c().decode_logits.data(), V), kOracleTol) << "after prefill";
  for (size_t t = P; t < c().ids.size(); ++t) {
    SequenceChunk step{&st, std::span<const int32_t>(c().ids.data() + t, 1)};
    last = m.forward(std::span<const SequenceChunk>(&step, 1), false);
    ASSERT_LE(max_abs_diff(last.data(), c().decode_logits.data() + (t - P + 1) * V, V), kOracleTol) << "step " << t;
  }
}

TEST_P(Golden, QuantisedCheckpointEqualsDequantisedTwin) {
  Model q(load_weights(c().quant_dir)), d(load_weights(c().dequant_dir));
  EXPECT_EQ(q.weights().format.linears, LinearFormat::FP8Block);
  EXPECT_EQ(q.weights().format.experts, LinearFormat::FP4Group32);
  const size_t L = c().ids.size(), V = static_cast<size_t>(c().cfg.vocab_size);
  std::vector<float> a = run_chunks(q, c().ids, L, 9), b = run_chunks(d, c().ids, L, 9);
  EXPECT_LE(max_abs_diff(a.data(), b.data(), L * V), kQuantTwinTol);
}

TEST_P(Golden, BatchedSequencesMatchSeparateRuns) {
  // Three sequences at different positions advance together in one forward call per step.
  Model m(load_weights(c().quant_dir));
  const size_t V = static_cast<size_t>(c().cfg.vocab_size);
  const std::vector<size_t> starts = {0, 5, 11};
  std::vector<SequenceState> st(3, m.new_sequence());
  for (size_t s = 0; s < 3; ++s) {  // different prefill lengths first
    SequenceChunk c0{&st[s], std::span<const int32_t>(c().ids.data(), starts[s] + 1)};
    m.forward(std::span<const SequenceChunk>(&c0, 1), false);
  }
  for (size_t step = 0; step < 12; ++step) {
    std::vector<SequenceChunk> chunks;
    for (size_t s = 0; s < 3; ++s) {
      const size_t at = starts[s] + 1 + step * (s + 1);  // sequence s takes s+1 tokens per step
      chunks.push_back({&st[s], std::span<const int32_t>(c().ids.data() + at, s + 1)});
    }
    std::vector<float> got = m.forward(chunks, true);
    size_t row = 0;
    for (size_t s = 0; s < 3; ++s)
      for (size_t k = 0; k <= s; ++k, ++row) {
        const size_t pos = starts[s] + 1 + step * (s + 1) + k;
        ASSERT_LE(max_abs_diff(got.data() + row * V, c().logits.data() + pos * V, V), kOracleTol)
            << "seq " << s << " pos " << pos;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, Golden, ::testing::Values("tiny-a", "tiny-b", "tiny-c"),
                         [](const auto& info) { return info.param == "tiny-a" ? std::string("a") : info.param == "tiny-b" ? std::string("b") : std::string("c"); });

}  // namespace
}  // namespace dsv4::test

namespace dsv4::test {
namespace {

// The comparison can fail: another checkpoint seed gives logits far outside the tolerance.
TEST(GoldenControl, OtherWeightsAreFarFromOracle) {
  const GoldenCase& c = golden_case("tiny-a");
  const std::string dir = c.dequant_dir + "-other-seed";
  write_random_checkpoint(c.cfg, dir, false, RandomCheckpointOptions{999, false});
  Model m(load_weights(dir));
  SequenceState st = m.new_sequence();
  SequenceChunk ch{&st, std::span<const int32_t>(c.ids.data(), c.ids.size())};
  std::vector<float> got = m.forward(std::span<const SequenceChunk>(&ch, 1), true);
  EXPECT_GT(max_abs_diff(got.data(), c.logits.data(), got.size()), 0.5f);
}

// The goldens exercise what they claim: closed HCA/CSA entries and an indexer that drops some.
TEST(GoldenControl, CasesCloseEntriesAndIndexerDrops) {
  for (const char* name : {"tiny-a", "tiny-b", "tiny-c"}) {
    const GoldenCase& c = golden_case(name);
    Model m(load_weights(c.quant_dir));
    SequenceState st = m.new_sequence();
    SequenceChunk ch{&st, std::span<const int32_t>(c.ids.data(), c.ids.size())};
    m.forward(std::span<const SequenceChunk>(&ch, 1), false);
    int hca = 0, csa_drop = 0;
    for (int64_t l = 0; l < c.cfg.num_layers; ++l) {
      const auto kind = c.cfg.layer_kinds[l];
      const int64_t entries = static_cast<int64_t>(st.layers[l].entries.size()) / c.cfg.head_dim;
      const int64_t expect = kind == AttnKind::SWA ? 0 : static_cast<int64_t>(c.ids.size()) / c.cfg.compress_ratio[l];
      EXPECT_EQ(entries, expect) << name << " layer " << l;
      if (kind == AttnKind::HCA && entries >= 2) ++hca;
      if (kind == AttnKind::CSA && entries > c.cfg.index_topk) ++csa_drop;
    }
    EXPECT_GT(hca, 0) << name << ": no HCA layer closed several entries";
    EXPECT_GT(csa_drop, 0) << name << ": no CSA layer where the indexer must drop entries";
  }
}

}  // namespace
}  // namespace dsv4::test
