// Parity of cuda::indexer_topk with the CPU indexer: scores by the formula of indexer_select
// (cpu::dot per head, ω-weighted ReLU, summed over heads in order) and topk_indices.
// GPU and CPU sum in different orders (~1e-7 relative), so two entries whose CPU scores are
// within 1e-5 of the score scale may legitimately swap; every other slot must match exactly.
// Exact ties are exercised with duplicated keys (bit-identical scores on both sides).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cuda/ops.h"
#include "model/indexer.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;

std::vector<float> cpu_scores(const float* q, const float* omega, const std::vector<float>& keys, int64_t n,
                              int64_t nh, int64_t hd) {
  std::vector<float> s(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    float acc = 0;
    for (int64_t h = 0; h < nh; ++h)
      acc += omega[h] * std::max(cpu::dot(q + h * hd, keys.data() + k * hd, hd), 0.0f);
    s[k] = acc;
  }
  return s;
}

// bf16 round-to-nearest-even of x, back in fp32 (what the Fast scoring kernel feeds the mma).
float bf16_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}

// fast: the bf16 tensor-core scores, checked against the CPU formula on bf16-rounded q and keys
// (the products are exact in fp32; only the summation order differs, hence the looser bound).
void run_case(const std::vector<int64_t>& visible, int64_t nh, int64_t hd, int64_t topk, bool duplicate_keys,
              bool pass_max, bool fast = false) {
  const int64_t R = static_cast<int64_t>(visible.size());
  const std::vector<float> q = randn(R * nh * hd);
  std::vector<float> omega = randn(R * nh, 1.0f / std::sqrt(float(nh * hd)));
  std::vector<std::vector<float>> keys(R);
  std::vector<DeviceBuffer> dkeys;
  std::vector<cuda::IndexerRow> rows;
  for (int64_t r = 0; r < R; ++r) {
    keys[r] = randn(std::max<int64_t>(visible[r], 1) * hd);
    if (duplicate_keys)  // entry k copies entry k % 7: many exact ties
      for (int64_t k = 7; k < visible[r]; ++k) std::copy_n(keys[r].data() + (k % 7) * hd, hd, keys[r].data() + k * hd);
    dkeys.push_back(to_device(keys[r]));
    rows.push_back(cuda::IndexerRow{dkeys.back().as<float>(), visible[r]});
  }
  DeviceBuffer dq = to_device(q), dom = to_device(omega), drows = to_device(rows), dout = poisoned<int32_t>(R * topk);
  if (pass_max || fast)
    cuda::indexer_topk(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, topk,
                       *std::max_element(visible.begin(), visible.end()), dout.as<int32_t>(), nullptr, fast);
  else
    cuda::indexer_topk(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, topk,
                       dout.as<int32_t>(), nullptr);
  const std::vector<int32_t> got = to_host<int32_t>(dout, R * topk);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> qr = fast ? bf16_rounded(std::vector<float>(q.begin() + r * nh * hd, q.begin() + (r + 1) * nh * hd))
                                       : std::vector<float>(q.begin() + r * nh * hd, q.begin() + (r + 1) * nh * hd);
    const std::vector<float> s =
        cpu_scores(qr.data(), omega.data() + r * nh, fast ? bf16_rounded(keys[r]) : keys[r], visible[r], nh, hd);
    const std::vector<int32_t> want = topk_indices(s, topk);
    float scale = 0;
    for (float v : s) scale = std::max(scale, std::fabs(v));
    int swaps = 0;
    for (int64_t i = 0; i < topk; ++i) {
      const int32_t g = got[r * topk + i];
      if (i >= static_cast<int64_t>(want.size())) {
        EXPECT_EQ(g, -1) << "row " << r << " slot " << i;
        continue;
      }
      if (g == want[i]) continue;
      ASSERT_TRUE(g >= 0 && g < visible[r]) << "row " << r << " slot " << i << " index " << g;
      EXPECT_FALSE(duplicate_keys) << "exact ties must resolve to the lower index; row " << r << " slot " << i;
      EXPECT_LE(std::fabs(s[g] - s[want[i]]), (fast ? 1e-4f : 1e-5f) * scale) << "row " << r << " slot " << i;
      ++swaps;
    }
    EXPECT_LE(swaps, fast ? 16 : 4) << "row " << r;
    // The picks are distinct.
    std::vector<int32_t> picks(got.begin() + r * topk, got.begin() + r * topk + want.size());
    std::sort(picks.begin(), picks.end());
    EXPECT_EQ(std::adjacent_find(picks.begin(), picks.end()), picks.end()) << "row " << r;
  }
}

TEST(CudaOpsIndexer, TopkMatchesCpuRealShapes) {
  DSV4_REQUIRE_GPU();
  // Empty, fewer than topk, tile-ragged, and long rows; V4-Flash heads and top-k.
  run_case({0, 3, 511, 1000, 4097, 20000}, 64, 128, 512, false, true);
}

TEST(CudaOpsIndexer, TopkLongestRowTopk1024) {
  DSV4_REQUIRE_GPU();
  run_case({65536, 1500}, 64, 128, 1024, false, true);
}

TEST(CudaOpsIndexer, ExactTiesTakeLowerIndexFirst) {
  DSV4_REQUIRE_GPU();
  run_case({5000, 700, 12}, 64, 128, 512, true, false);
}

// Long rows take the multi-block select (ops_indexer_select.cu): smooth scores through the
// candidate list, mixed with short rows in the same call.
TEST(CudaOpsIndexer, LongRowsMultiBlockSelect) {
  DSV4_REQUIRE_GPU();
  run_case({40000, 70001, 5, 0}, 64, 128, 512, false, true);
}

// Seven distinct scores over 40000 entries: the threshold bin overflows the candidate list and
// the row falls back to the full select; exact ties still go to the lower index.
TEST(CudaOpsIndexer, LongRowsPiledScoresFallBack) {
  DSV4_REQUIRE_GPU();
  run_case({40000, 33000}, 64, 128, 2048, true, true);
}

// Fast precision: bf16 tensor-core scores, V4 shape and the tiny model's, short and long rows.
TEST(CudaOpsIndexer, FastBf16ScoresMatchRoundedCpu) {
  DSV4_REQUIRE_GPU();
  run_case({0, 3, 511, 1000, 4097, 20000}, 64, 128, 512, false, true, true);
  run_case({50000, 700}, 64, 128, 512, false, true, true);
  run_case({1, 4, 9, 250}, 16, 128, 4, false, true, true);
}

TEST(CudaOpsIndexer, TinyModelShapes) {
  DSV4_REQUIRE_GPU();
  run_case({1, 4, 9, 250}, 8, 128, 4, false, false);
}

}  // namespace
}  // namespace dsv4
