// Speculative-verify rollback on the device (DeviceSequence::begin_verify / truncate): a verify of
// k+1 tokens cut back to j kept tokens must continue exactly like a run that never saw the
// rejected ones, at positions around the window and compression boundaries of the tiny goldens.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "../model/golden_case.h"
#include "gpu_test.h"
#include "model/cuda/cuda_model.h"

namespace dsv4::test {
namespace {

constexpr float kRollbackTol = 1e-5f;
constexpr size_t kContinue = 6;  // tokens decoded after the cut, one per call

std::vector<float> run(CudaModel& m, DeviceSequence& seq, const int32_t* ids, size_t n, bool all_logits) {
  DeviceChunk c{&seq, std::span<const int32_t>(ids, n)};
  return m.forward(std::span<const DeviceChunk>(&c, 1), all_logits);
}

// Prefix lengths just before, at and after each ring's wrap: W, m and 2m per compressed layer.
std::vector<size_t> boundary_positions(const ModelConfig& cfg, size_t max_p) {
  std::set<size_t> ps = {1, 2};
  std::vector<int64_t> edges = {cfg.sliding_window};
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    if (cfg.compress_ratio[l] > 0) {
      edges.push_back(cfg.compress_ratio[l]);
      edges.push_back(2 * cfg.compress_ratio[l]);
    }
  for (int64_t e : edges)
    for (int64_t dp = -3; dp <= 1; ++dp)
      if (e + dp >= 1 && static_cast<size_t>(e + dp) <= max_p) ps.insert(static_cast<size_t>(e + dp));
  return {ps.begin(), ps.end()};
}

class CudaRollback : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSV4_REQUIRE_GPU(); }
  const GoldenCase& c() { return golden_case(GetParam()); }
};

TEST_P(CudaRollback, TruncatedVerifyContinuesLikeCleanRun) {
  const GoldenCase& g = c();
  CudaModel m(load_weights(g.quant_dir), cuda::Precision::Exact);
  m.set_poison(true);
  const int32_t V = static_cast<int32_t>(g.cfg.vocab_size);
  const size_t Vs = static_cast<size_t>(V), L = g.ids.size();
  for (size_t k = 1; k <= 3; ++k) {
    for (size_t p : boundary_positions(g.cfg, L - (k + 1) - kContinue)) {
      for (size_t j = 0; j <= k + 1; ++j) {
        // Reference: prefix, the j kept tokens as one chunk, then the continuation.
        DeviceSequence ref = m.new_sequence(static_cast<int64_t>(L));
        run(m, ref, g.ids.data(), p, false);
        std::vector<float> ref_kept;
        if (j > 0) ref_kept = run(m, ref, g.ids.data() + p, j, true);
        // Verify: the same prefix, then j right tokens followed by k+1-j wrong ones, cut to j.
        DeviceSequence seq = m.new_sequence(static_cast<int64_t>(L));
        ASSERT_GE(seq.max_verify_tokens(), static_cast<int64_t>(k + 1));
        run(m, seq, g.ids.data(), p, false);
        std::vector<int32_t> draft(g.ids.begin() + p, g.ids.begin() + p + k + 1);
        for (size_t i = j; i <= k; ++i) draft[i] = (draft[i] + 1 + static_cast<int32_t>(i)) % V;
        seq.begin_verify(static_cast<int64_t>(k + 1), m.stream());
        std::vector<float> verify = run(m, seq, draft.data(), k + 1, true);
        seq.truncate(static_cast<int64_t>(p + j), m.stream());
        ASSERT_EQ(seq.pos, static_cast<int64_t>(p + j));
        const std::string where = "k " + std::to_string(k) + " p " + std::to_string(p) + " j " + std::to_string(j);
        if (j > 0) {
          ASSERT_LE(max_abs_diff(verify.data(), ref_kept.data(), j * Vs), kRollbackTol) << where;
        }
        for (size_t t = p + j; t < p + j + kContinue; ++t) {
          std::vector<float> a = run(m, seq, g.ids.data() + t, 1, false);
          std::vector<float> b = run(m, ref, g.ids.data() + t, 1, false);
          ASSERT_LE(max_abs_diff(a.data(), b.data(), Vs), kRollbackTol) << where << " step " << t;
        }
      }
    }
  }
}

// Repeated verify rounds (accepting a varying number each time) over the whole sequence track
// the oracle's teacher-forced logits, as the accepted prefix is always the true sequence.
TEST_P(CudaRollback, RepeatedRoundsTrackOracle) {
  const GoldenCase& g = c();
  CudaModel m(load_weights(g.quant_dir), cuda::Precision::Exact);
  const int32_t V = static_cast<int32_t>(g.cfg.vocab_size);
  const size_t Vs = static_cast<size_t>(V), L = g.ids.size();
  DeviceSequence seq = m.new_sequence(static_cast<int64_t>(L));
  run(m, seq, g.ids.data(), 1, false);
  const size_t n = std::min<size_t>(4, static_cast<size_t>(seq.max_verify_tokens()));
  size_t round = 0;
  while (static_cast<size_t>(seq.pos) + n <= L) {
    const size_t p = static_cast<size_t>(seq.pos), keep = 1 + round++ % n;  // at least one accepted
    std::vector<int32_t> draft(g.ids.begin() + p, g.ids.begin() + p + n);
    for (size_t i = keep; i < n; ++i) draft[i] = (draft[i] + 7) % V;
    seq.begin_verify(static_cast<int64_t>(n), m.stream());
    std::vector<float> got = run(m, seq, draft.data(), n, true);
    seq.truncate(static_cast<int64_t>(p + keep), m.stream());
    for (size_t i = 0; i < keep; ++i)
      ASSERT_LE(max_abs_diff(got.data() + i * Vs, g.logits.data() + (p + i) * Vs, Vs), 1e-3f) << "position " << p + i;
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, CudaRollback, ::testing::Values("tiny-a", "tiny-b", "tiny-c"));

}  // namespace
}  // namespace dsv4::test
