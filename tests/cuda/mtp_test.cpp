// The CUDA MTP module (CudaModel::mtp_forward, spec/model.md §5.6) on the tiny goldens: fed the
// device model's own streams, its logits match the fp32 torch reference (golden mtp_logits,
// scripts/mtp_reference.py) for any chunking, and its logits and output streams match the CPU
// MtpModule (the feedback input of later draft steps).
#include <gtest/gtest.h>

#include "../model/golden_case.h"
#include "gpu_test.h"
#include "model/cuda/cuda_model.h"
#include "core/error.h"
#include "model/mtp.h"

namespace dsv4::test {
namespace {

class CudaMtp : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { DSV4_REQUIRE_GPU(); }
  const GoldenCase& c() { return golden_case(GetParam()); }
};

// MTP logits (and output streams) of positions 0..L-2 from `hidden`, in chunks of `chunk` rows.
std::vector<float> device_mtp_rows(CudaModel& m, const std::vector<int32_t>& ids, const std::vector<float>& hidden,
                                   size_t chunk, std::vector<float>* streams) {
  const size_t L = ids.size(), hd = static_cast<size_t>(m.config().hc_mult * m.config().hidden_size);
  DeviceSequence ms = m.new_mtp_sequence(static_cast<int64_t>(L));
  std::vector<float> all, s;
  if (streams) streams->clear();
  for (size_t i = 0; i + 1 < L; i += chunk) {
    const size_t k = std::min(chunk, L - 1 - i);
    DeviceMtpChunk mc{&ms, hidden.data() + i * hd, std::span<const int32_t>(ids.data() + i + 1, k)};
    std::vector<float> l = m.mtp_forward(std::span<const DeviceMtpChunk>(&mc, 1), true, &s);
    all.insert(all.end(), l.begin(), l.end());
    if (streams) streams->insert(streams->end(), s.begin(), s.end());
  }
  return all;
}

TEST_P(CudaMtp, LogitsMatchTorchReferenceForAnyChunking) {
  SafetensorsFile g(source_dir() + "/tests/model/data/" + GetParam() + "/golden.safetensors");
  ASSERT_TRUE(g.tensors().count("mtp_logits")) << "golden has no mtp_logits (scripts/make_goldens.py)";
  const std::vector<float> want = read_f32(g.tensors().at("mtp_logits"));
  CudaModel m(load_weights(c().dequant_dir), cuda::Precision::Exact);
  m.set_poison(true);
  const size_t L = c().ids.size();
  DeviceSequence seq = m.new_sequence(static_cast<int64_t>(L));
  DeviceChunk dc{&seq, std::span<const int32_t>(c().ids.data(), L)};
  std::vector<float> hidden;
  m.forward(std::span<const DeviceChunk>(&dc, 1), false, &hidden);
  for (size_t chunk : {L - 1, size_t{1}, size_t{3}, size_t{7}}) {
    const std::vector<float> got = device_mtp_rows(m, c().ids, hidden, chunk, nullptr);
    ASSERT_EQ(got.size(), want.size());
    const float diff = max_abs_diff(got.data(), want.data(), got.size());
    std::printf("  %s chunk %zu: max |cuda mtp logit - reference| = %.3g\n", GetParam().c_str(), chunk, diff);
    EXPECT_LE(diff, 1e-3f) << "chunk " << chunk;
  }
}

TEST_P(CudaMtp, LogitsAndStreamsMatchCpuModule) {
  ModelWeights w = load_weights(c().quant_dir);
  CudaModel m(w, cuda::Precision::Exact);
  m.set_poison(true);
  Model cpu(std::move(w));
  const size_t L = c().ids.size(), hd = static_cast<size_t>(cpu.config().hc_mult * cpu.config().hidden_size);
  // Fresh random input streams: the module must not depend on them being the target's.
  const std::vector<float> hidden = randn(L * hd);
  MtpModule mtp(cpu);
  SequenceState ms = mtp.new_state();
  MtpChunk mc{&ms, hidden.data(), std::span<const int32_t>(c().ids.data() + 1, L - 1)};
  std::vector<float> want_streams;
  const std::vector<float> want = mtp.forward(std::span<const MtpChunk>(&mc, 1), true, &want_streams);
  std::vector<float> got_streams;
  const std::vector<float> got = device_mtp_rows(m, c().ids, hidden, 4, &got_streams);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got_streams.size(), want_streams.size());
  const double el = rel_error(got, want), es = rel_error(got_streams, want_streams);
  std::printf("  %s: rel error cuda vs cpu MTP logits %.3g, output streams %.3g\n", GetParam().c_str(), el, es);
  EXPECT_LE(el, 1e-4);
  EXPECT_LE(es, 1e-4);
}

// tiny-c has no MTP layer.
INSTANTIATE_TEST_SUITE_P(Tiny, CudaMtp, ::testing::Values("tiny-a", "tiny-b"),
                         [](const auto& info) { return info.param == "tiny-a" ? std::string("a") : std::string("b"); });

TEST(CudaMtpErrors, CheckpointWithoutMtpIsRefused) {
  DSV4_REQUIRE_GPU();
  const GoldenCase& g = golden_case("tiny-c");
  CudaModel m(load_weights(g.quant_dir), cuda::Precision::Exact);
  EXPECT_FALSE(m.has_mtp());
  EXPECT_THROW(m.new_mtp_sequence(8), Error);
}

class CleanupTemp : public ::testing::Environment {
 public:
  void TearDown() override { remove_golden_checkpoints(); }
};
const auto* kCleanup = ::testing::AddGlobalTestEnvironment(new CleanupTemp);

}  // namespace
}  // namespace dsv4::test
