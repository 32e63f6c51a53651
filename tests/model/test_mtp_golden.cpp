// The CPU MTP module (model/mtp.h) against the fp32 torch reference of scripts/mtp_reference.py
// (make_goldens.py writes mtp_logits into a case's golden file when its checkpoint has mtp.0.*;
// skipped with a message until the goldens are regenerated), plus chunk invariance and the
// quantised checkpoint against its dequantised twin.
#include <gtest/gtest.h>

#include "golden_case.h"
#include "model/mtp.h"

namespace dsv4::test {
namespace {

// MTP logits of positions 0..L-2 (token t+1 = ids[t+1]) from the main model's streams, fed
// to the module in chunks of `chunk` rows.
std::vector<float> mtp_rows(Model& m, const std::vector<int32_t>& ids, size_t chunk) {
  const size_t L = ids.size(), hd = static_cast<size_t>(m.config().hc_mult * m.config().hidden_size);
  SequenceState st = m.new_sequence();
  SequenceChunk c{&st, ids};
  std::vector<float> hidden;
  m.forward(std::span<const SequenceChunk>(&c, 1), false, &hidden);
  EXPECT_EQ(hidden.size(), L * hd);
  MtpModule mtp(m);
  SequenceState ms = mtp.new_state();
  std::vector<float> all;
  for (size_t i = 0; i + 1 < L; i += chunk) {
    const size_t k = std::min(chunk, L - 1 - i);
    MtpChunk mc{&ms, hidden.data() + i * hd, std::span<const int32_t>(ids.data() + i + 1, k)};
    std::vector<float> l = mtp.forward(std::span<const MtpChunk>(&mc, 1), true);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

class MtpGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpGolden, MatchesTorchReference) {
  const GoldenCase& c = golden_case(GetParam());
  SafetensorsFile g(source_dir() + "/tests/model/data/" + GetParam() + "/golden.safetensors");
  if (!g.tensors().count("mtp_logits"))
    GTEST_SKIP() << GetParam() << ": golden.safetensors has no mtp_logits yet (regenerate with scripts/make_goldens.py)";
  const std::vector<float> want = read_f32(g.tensors().at("mtp_logits"));
  Model m(load_weights(c.dequant_dir));
  const std::vector<float> got = mtp_rows(m, c.ids, c.ids.size());
  ASSERT_EQ(got.size(), want.size());
  const float diff = max_abs_diff(got.data(), want.data(), got.size());
  std::printf("  %s: max |mtp logit - reference| = %.3g\n", GetParam().c_str(), diff);
  EXPECT_LE(diff, 1e-3f);
}

TEST_P(MtpGolden, ChunkedEqualsWholeAndQuantisedEqualsTwin) {
  const GoldenCase& c = golden_case(GetParam());
  Model q(load_weights(c.quant_dir)), d(load_weights(c.dequant_dir));
  const std::vector<float> whole = mtp_rows(d, c.ids, c.ids.size());
  for (size_t chunk : {1, 3, 7}) {
    const std::vector<float> part = mtp_rows(d, c.ids, chunk);
    ASSERT_LE(max_abs_diff(part.data(), whole.data(), whole.size()), 1e-4f) << "chunk " << chunk;
  }
  const std::vector<float> quant = mtp_rows(q, c.ids, 5);
  EXPECT_LE(max_abs_diff(quant.data(), whole.data(), whole.size()), 1e-4f);
}

// tiny-c's config has num_nextn_predict_layers = 0: no MTP tensors, no case.
INSTANTIATE_TEST_SUITE_P(Tiny, MtpGolden, ::testing::Values("tiny-a", "tiny-b"),
                         [](const auto& info) { return info.param == "tiny-a" ? std::string("a") : std::string("b"); });

class CleanupTemp : public ::testing::Environment {
 public:
  void TearDown() override { remove_golden_checkpoints(); }
};
const auto* kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupTemp);

}  // namespace
}  // namespace dsv4::test
