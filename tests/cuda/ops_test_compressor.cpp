// Parity of cuda::compressor_pool with compressor_segment: the CPU pools a fresh sequence of N
// rows; the GPU sees the same rows split into a ring (positions before chunk_p0, at slot
// p % ring_rows) and a chunk, so windows straddling the boundary read both sources.
#include <cstring>

#include "backend/cuda/ops.h"
#include "model/compressor.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;
using test::rel_error;

struct PoolCase {
  int64_t m, c;
  bool overlap;
};

class CudaOpsCompressor : public ::testing::TestWithParam<PoolCase> {};

TEST_P(CudaOpsCompressor, PoolMatchesCompressorSegment) {
  DSV4_REQUIRE_GPU();
  const auto [m, c, overlap] = GetParam();
  const int64_t width = (overlap ? 2 : 1) * c, pairs = 32, N = 7 * m + 3;
  const int64_t ring_rows = 2 * m, chunk_p0 = 3 * m + 1;  // windows 2 and 3 straddle the boundary
  CompressorWeights w;
  w.norm = randn(c);
  CompressorSpec spec{m, overlap, c, 1e-6f};
  RopeFreqs rope;
  rope.inv_freq = test::inv_freqs(pairs, 160000.0);
  const std::vector<float> a = randn(N * width), z = randn(N * width, 2.0f);
  CompressorState st;
  std::vector<float> entries;
  compressor_segment(w, spec, rope, a.data(), z.data(), 0, N, st, entries);
  ASSERT_EQ(static_cast<int64_t>(entries.size()), (N / m) * c);

  std::vector<float> ring_a(ring_rows * width), ring_z(ring_rows * width);
  for (int64_t p = chunk_p0 - ring_rows; p < chunk_p0; ++p)
    for (int64_t k = 0; k < width; ++k) {
      ring_a[(p % ring_rows) * width + k] = a[p * width + k];
      ring_z[(p % ring_rows) * width + k] = z[p * width + k];
    }
  const std::vector<float> chunk_a(a.begin() + chunk_p0 * width, a.end()),
      chunk_z(z.begin() + chunk_p0 * width, z.end());
  DeviceBuffer dca = to_device(chunk_a), dcz = to_device(chunk_z), dra = to_device(ring_a), drz = to_device(ring_z);
  DeviceBuffer dgamma = to_device(w.norm), dfreq = to_device(rope.inv_freq);
  // Every window whose rows are still in ring or chunk.
  std::vector<int64_t> wins;
  for (int64_t win = 0; (win + 1) * m <= N; ++win)
    if ((overlap && win > 0 ? win - 1 : win) * m >= chunk_p0 - ring_rows) wins.push_back(win);
  ASSERT_GE(wins.size(), 4u);
  // One more output slot, owned by a padding job (w = -1) between the real ones: it must stay
  // untouched (the forward pads its job lists to a fixed count per shape for CUDA graphs).
  DeviceBuffer dout = poisoned<float>((wins.size() + 1) * c);
  std::vector<cuda::PoolJob> jobs;
  for (size_t j = 0; j < wins.size(); ++j) {
    jobs.push_back(cuda::PoolJob{dca.as<float>(), dcz.as<float>(), chunk_p0, dra.as<float>(), drz.as<float>(),
                                 ring_rows, wins[j], dout.as<float>() + j * c});
    if (j == 1)
      jobs.push_back(cuda::PoolJob{dca.as<float>(), dcz.as<float>(), chunk_p0, dra.as<float>(), drz.as<float>(),
                                   ring_rows, -1, dout.as<float>() + wins.size() * c});
  }
  DeviceBuffer djobs = to_device(jobs);
  cuda::compressor_pool(djobs.as<cuda::PoolJob>(), static_cast<int64_t>(jobs.size()), m, c, overlap,
                        dgamma.as<float>(), 1e-6f, dfreq.as<float>(), pairs, nullptr);
  const std::vector<float> got = to_host<float>(dout, wins.size() * c);
  for (size_t j = 0; j < wins.size(); ++j) {
    const std::vector<float> g(got.begin() + j * c, got.begin() + (j + 1) * c),
        r(entries.begin() + wins[j] * c, entries.begin() + (wins[j] + 1) * c);
    EXPECT_LE(rel_error(g, r), 1e-5) << "window " << wins[j];
  }
  const std::vector<float> pad = to_host<float>(dout, (wins.size() + 1) * c);
  for (int64_t k = 0; k < c; ++k) ASSERT_TRUE(std::isnan(pad[wins.size() * c + k])) << "padding job wrote " << k;

  // bf16 output (a Fast model's indexer keys): each value is the fp32 result rounded to nearest
  // even, bit for bit; the padding slot stays poisoned.
  DeviceBuffer dout16 = poisoned<uint16_t>((wins.size() + 1) * c);
  size_t slot = 0;  // the real jobs in order, the padding job on the extra slot
  for (cuda::PoolJob& J : jobs) J.out = dout16.as<uint16_t>() + (J.w < 0 ? wins.size() : slot++) * c;
  DeviceBuffer djobs16 = to_device(jobs);
  cuda::compressor_pool(djobs16.as<cuda::PoolJob>(), static_cast<int64_t>(jobs.size()), m, c, overlap,
                        dgamma.as<float>(), 1e-6f, dfreq.as<float>(), pairs, nullptr, cuda::KeyFormat::BF16);
  const std::vector<uint16_t> got16 = to_host<uint16_t>(dout16, (wins.size() + 1) * c);
  for (size_t i = 0; i < wins.size() * c; ++i) {
    uint32_t u;
    std::memcpy(&u, &got[i], 4);
    const uint16_t want = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    ASSERT_EQ(got16[i], want) << "window slot " << i / c << " channel " << i % c;
  }
  for (int64_t k = 0; k < c; ++k) ASSERT_EQ(got16[wins.size() * c + k], 0xFFFFu) << "padding job wrote " << k;
}

// CSA attention (m 4, overlap), indexer keys (c 128), HCA (m 128, no overlap).
INSTANTIATE_TEST_SUITE_P(Kinds, CudaOpsCompressor,
                         ::testing::Values(PoolCase{4, 512, true}, PoolCase{4, 128, true}, PoolCase{128, 512, false}));

}  // namespace
}  // namespace dsv4
