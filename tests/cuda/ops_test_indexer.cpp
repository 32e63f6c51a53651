// Parity of cuda::indexer_topk with the CPU indexer: scores by the formula of indexer_select
// (cpu::dot per head, ω-weighted ReLU, summed over heads in order) and topk_indices.
// GPU and CPU sum in different orders (~1e-7 relative), so two entries whose CPU scores are
// within 1e-5 of the score scale may legitimately swap; every other slot must match exactly.
// Exact ties are exercised with duplicated keys (bit-identical scores on both sides).
#include <algorithm>
#include <cmath>

#include "backend/cpu/linear.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_indexer_mma.h"
#include "backend/cuda/ops_indexer_select.h"
#include "model/indexer.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::bf16_bits;
using test::bf16_round;
using test::poisoned;
using test::randn;
using Form = cuda::detail::SelectForm;

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

std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}

// fast: the bf16 tensor-core scores, checked against the CPU formula on bf16-rounded q and keys
// (the products are exact in fp32; only the summation order differs, hence the looser bound).
// bf16_keys (needs fast): the keys stored as bf16, as a Fast model's cache holds them.
// shared_keys: every row reads (a prefix of) one key buffer, as the rows of one sequence's chunk do.
void run_case(const std::vector<int64_t>& visible, int64_t nh, int64_t hd, int64_t topk, bool duplicate_keys,
              bool pass_max, bool fast = false, bool bf16_keys = false, bool shared_keys = false) {
  const int64_t R = static_cast<int64_t>(visible.size());
  const std::vector<float> q = randn(R * nh * hd);
  std::vector<float> omega = randn(R * nh, 1.0f / std::sqrt(float(nh * hd)));
  std::vector<std::vector<float>> own(shared_keys ? 1 : R);
  std::vector<DeviceBuffer> dkeys;
  std::vector<cuda::IndexerRow> rows;
  for (int64_t r = 0; r < R; ++r) {
    if (!shared_keys || r == 0) {
      const int64_t n = shared_keys ? *std::max_element(visible.begin(), visible.end()) : visible[r];
      std::vector<float>& k = own[shared_keys ? 0 : r];
      k = randn(std::max<int64_t>(n, 1) * hd);
      if (duplicate_keys)  // entry e copies entry e % 7: many exact ties
        for (int64_t e = 7; e < n; ++e) std::copy_n(k.data() + (e % 7) * hd, hd, k.data() + e * hd);
      dkeys.push_back(bf16_keys ? to_device(bf16_bits(k)) : to_device(k));
    }
    rows.push_back(cuda::IndexerRow{dkeys.back().as<uint8_t>(), visible[r]});
  }
  auto keys_of = [&](int64_t r) -> const std::vector<float>& { return own[shared_keys ? 0 : r]; };
  DeviceBuffer dq = to_device(q), dom = to_device(omega), drows = to_device(rows), dout = test::poisoned_indices(R * topk);
  if (pass_max || fast)
    cuda::indexer_topk(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, topk,
                       *std::max_element(visible.begin(), visible.end()), dout.as<int32_t>(), nullptr, fast,
                       bf16_keys ? cuda::KeyFormat::BF16 : cuda::KeyFormat::F32);
  else
    cuda::indexer_topk(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, topk,
                       dout.as<int32_t>(), nullptr);
  const std::vector<int32_t> got = to_host<int32_t>(dout, R * topk);
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<float> qr = fast ? bf16_rounded(std::vector<float>(q.begin() + r * nh * hd, q.begin() + (r + 1) * nh * hd))
                                       : std::vector<float>(q.begin() + r * nh * hd, q.begin() + (r + 1) * nh * hd);
    const std::vector<float> s =
        cpu_scores(qr.data(), omega.data() + r * nh, fast ? bf16_rounded(keys_of(r)) : keys_of(r), visible[r], nh, hd);
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
    // Near-ties swap at random (each one checked above): at top-2048 of 40000 fp32 scores a row
    // sees ~3 on average and more than 4 in ~15% of rows (a CPU model of both summation orders),
    // so the bound grows with topk; a systematic error fails the tolerance check instead.
    EXPECT_LE(swaps, std::max<int64_t>(fast ? 16 : 4, topk / 64)) << "row " << r;
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

// A prefill's rows (each sees a growing prefix of the compressed entries, up to 2048): the
// short-row select's 256-thread blocks with the picks sorted in registers and one warp a row
// (top-512, each forced), and at top-1024 the 1024-thread blocks, also sorting in registers.
TEST(CudaOpsIndexer, PrefillRowsShortSelects) {
  DSV4_REQUIRE_GPU();
  std::vector<int64_t> visible(160);
  for (size_t r = 0; r < visible.size(); ++r) visible[r] = static_cast<int64_t>((r + 1) * 2048 / visible.size());
  for (const Form form : {Form::kBlocks256, Form::kWarp}) {
    cuda::detail::set_indexer_select_form(form);
    run_case(visible, 64, 128, 512, false, true);
    run_case(visible, 64, 128, 512, false, true, true, true, true);  // as the model runs it: bf16 keys of one sequence
  }
  cuda::detail::set_indexer_select_form(Form::kAuto);
  run_case({3000, 1500, 1024, 40, 0}, 64, 128, 1024, false, true);
}

// The select alone on given scores (no scorer): each short-row form (and the size rule) against
// topk_indices exactly, on rows of every short length and scores that are smooth, piled into a
// few values (exact ties across the threshold), all one value, or signed zeros.
TEST(CudaOpsIndexer, WarpSelectMatchesCpuExactly) {
  DSV4_REQUIRE_GPU();
  const int64_t ld = cuda::detail::kWarpSelectMaxRow;
  std::vector<int64_t> visible = {0, 1, 2, 31, 32, 33, 299, 300, 301, 511, 512, 513, 1000, 2047, 2048};
  for (int64_t r = 0; r < 40; ++r) visible.push_back(37 + r * 51);
  const int64_t R = static_cast<int64_t>(visible.size());
  for (const int kind : {0, 1, 2, 3}) {
    std::vector<float> sc = randn(R * ld);
    for (size_t i = 0; i < sc.size(); ++i) {
      if (kind == 1) sc[i] = std::round(sc[i] * 2.0f);     // ~13 values: big exact ties
      if (kind == 2) sc[i] = 0.25f;                        // one value
      if (kind == 3) sc[i] = (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : -sc[i] * sc[i]);  // ±0 tie at the top
    }
    std::vector<cuda::IndexerRow> rows;
    for (int64_t n : visible) rows.push_back(cuda::IndexerRow{nullptr, n});
    DeviceBuffer dsc = to_device(sc), drows = to_device(rows);
    for (const int64_t topk : {512, 300, 33, 1}) {
      for (const Form form : {Form::kWarp, Form::kBlocks256, Form::kBlocks1024, Form::kAuto}) {
        cuda::detail::set_indexer_select_form(form);
        DeviceBuffer dout = test::poisoned_indices(R * topk);
        cuda::detail::indexer_select(dsc.as<float>(), ld, drows.as<cuda::IndexerRow>(), R, topk, ld,
                                     dout.as<int32_t>(), nullptr);
        const std::vector<int32_t> got = to_host<int32_t>(dout, R * topk);
        for (int64_t r = 0; r < R; ++r) {
          std::vector<int32_t> want =
              topk_indices(std::vector<float>(sc.begin() + r * ld, sc.begin() + r * ld + visible[r]), topk);
          want.resize(static_cast<size_t>(topk), -1);
          ASSERT_EQ(std::vector<int32_t>(got.begin() + r * topk, got.begin() + (r + 1) * topk), want)
              << "kind " << kind << " top-" << topk << " row " << r << " (n " << visible[r] << ") form "
              << static_cast<int>(form);
        }
      }
    }
  }
  cuda::detail::set_indexer_select_form(Form::kAuto);
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

// bf16 keys (a Fast model's cache) against the same CPU formula, short and long rows.
TEST(CudaOpsIndexer, FastBf16KeysMatchRoundedCpu) {
  DSV4_REQUIRE_GPU();
  run_case({0, 3, 511, 1000, 4097, 20000}, 64, 128, 512, false, true, true, true);
  run_case({50000, 700}, 64, 128, 512, false, true, true, true);
  run_case({5000, 700, 12}, 64, 128, 512, true, true, true, true);  // exact ties: lower index first
  run_case({1, 4, 9, 250}, 16, 128, 4, false, true, true, true);
  // Long rows: the scorer builds the select's histogram; piled scores overflow the candidates.
  run_case({40000, 33000}, 64, 128, 2048, true, true, true, true);
}

// The multi-block select sorts up to 2048 candidates in registers and more in shared memory:
// top-2048 of smooth scores puts more than 2048 at or above the threshold bin, top-16 fewer.
TEST(CudaOpsIndexer, LongRowsBothCandidateSorts) {
  DSV4_REQUIRE_GPU();
  run_case({40000, 36000}, 64, 128, 2048, false, true);
  run_case({40000, 36000}, 64, 128, 16, false, true);
  run_case({40000, 36000}, 64, 128, 2048, false, true, true, true);
}

// Stored bf16 keys are the rounding the scorer applies to fp32 keys: the scores agree bit for
// bit (so the picks do too) — a Fast model gives the same tokens with either cache format.
TEST(CudaOpsIndexer, Bf16KeysScoreBitwiseAsFp32Keys) {
  DSV4_REQUIRE_GPU();
  const int64_t nh = 64, hd = 128, topk = 512;
  const std::vector<int64_t> visible = {1, 17, 513, 5000, 70001};
  const int64_t R = static_cast<int64_t>(visible.size()), mx = 70001;
  const std::vector<float> q = randn(R * nh * hd), omega = randn(R * nh, 1.0f / std::sqrt(float(nh * hd)));
  const std::vector<float> keys = randn(mx * hd);
  DeviceBuffer k32 = to_device(keys), k16 = to_device(bf16_bits(keys)), dq = to_device(q), dom = to_device(omega);
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<int32_t>> picks;
  for (const cuda::KeyFormat f : {cuda::KeyFormat::F32, cuda::KeyFormat::BF16}) {
    const void* k = f == cuda::KeyFormat::BF16 ? static_cast<const void*>(k16.as<uint8_t>()) : k32.as<uint8_t>();
    std::vector<cuda::IndexerRow> rows;
    for (int64_t n : visible) rows.push_back(cuda::IndexerRow{k, n});
    DeviceBuffer drows = to_device(rows), dsc = poisoned<float>(R * mx), dout = test::poisoned_indices(R * topk);
    cuda::detail::indexer_score_mma(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, mx,
                                    dsc.as<float>(), mx, nullptr, f);
    cuda::indexer_topk(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, topk, mx,
                       dout.as<int32_t>(), nullptr, true, f);
    scores.push_back(to_host<float>(dsc, R * mx));
    picks.push_back(to_host<int32_t>(dout, R * topk));
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < visible[r]; ++i) {
      const float a = scores[0][r * mx + i], b = scores[1][r * mx + i];
      ASSERT_FALSE(std::isnan(a)) << "row " << r << " entry " << i << " not scored";
      ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "row " << r << " entry " << i << ": " << a << " vs " << b;
    }
  EXPECT_EQ(picks[0], picks[1]);
}

// At V4's shape (64 x 128) the wgmma scorer runs where the device has it; the mma.sync scorer is
// its twin (the same bf16 inputs, sums in another order): scores agree to fp32 rounding, with and
// without the fused histogram, for rows that take one CTA and rows spread over many.
TEST(CudaOpsIndexer, WgmmaScorerMatchesMmaScorer) {
  DSV4_REQUIRE_GPU();
  const int64_t nh = 64, hd = 128;
  if (!cuda::detail::indexer_wgmma_ok(nh, hd)) GTEST_SKIP() << "no wgmma on this device / build";
  const std::vector<int64_t> visible = {1, 63, 64, 65, 1000, 70001};
  const int64_t R = static_cast<int64_t>(visible.size()), mx = 70001;
  const std::vector<float> q = randn(R * nh * hd), omega = randn(R * nh, 1.0f / std::sqrt(float(nh * hd)));
  const std::vector<float> keys = randn(mx * hd);
  DeviceBuffer k16 = to_device(bf16_bits(keys)), dq = to_device(q), dom = to_device(omega);
  std::vector<cuda::IndexerRow> rows;
  for (int64_t n : visible) rows.push_back(cuda::IndexerRow{k16.as<uint8_t>(), n});
  DeviceBuffer drows = to_device(rows);
  std::vector<std::vector<float>> scores;
  std::vector<std::vector<uint32_t>> hists;
  for (const bool wgmma : {true, false}) {
    cuda::detail::set_indexer_wgmma(wgmma);
    DeviceBuffer dsc = poisoned<float>(R * mx), dh(R * cuda::detail::kSelectBins * 4);
    dh.fill_bytes(0);
    cuda::detail::indexer_score_mma(dq.as<float>(), dom.as<float>(), drows.as<cuda::IndexerRow>(), R, nh, hd, mx,
                                    dsc.as<float>(), mx, nullptr, cuda::KeyFormat::BF16, dh.as<uint32_t>());
    scores.push_back(to_host<float>(dsc, R * mx));
    hists.push_back(to_host<uint32_t>(dh, R * cuda::detail::kSelectBins));
  }
  cuda::detail::set_indexer_wgmma(true);
  for (int64_t r = 0; r < R; ++r) {
    float scale = 0;
    for (int64_t i = 0; i < visible[r]; ++i) scale = std::max(scale, std::fabs(scores[1][r * mx + i]));
    uint64_t counted = 0;
    for (int64_t b = 0; b < cuda::detail::kSelectBins; ++b) counted += hists[0][r * cuda::detail::kSelectBins + b];
    EXPECT_EQ(counted, static_cast<uint64_t>(visible[r])) << "row " << r << ": histogram total";
    for (int64_t i = 0; i < visible[r]; ++i) {
      const float a = scores[0][r * mx + i], b = scores[1][r * mx + i];
      ASSERT_FALSE(std::isnan(a)) << "row " << r << " entry " << i << " not scored";
      ASSERT_LE(std::fabs(a - b), 1e-5f * scale) << "row " << r << " entry " << i;
    }
    if (visible[r] < mx) {
      EXPECT_TRUE(std::isnan(scores[0][r * mx + visible[r]])) << "row " << r << " wrote past n";
    }
  }
}

// bf16 keys are only for the tensor-core scorer: Exact precision and shapes it does not take
// are refused by name.
TEST(CudaOpsIndexer, Bf16KeysOutsideFastScorerAreRefused) {
  DSV4_REQUIRE_GPU();
  DeviceBuffer keys(64 * 128 * 2), q(64 * 128 * 4), om(64 * 4), out(4 * 4);
  const std::vector<cuda::IndexerRow> rows = {{keys.as<uint8_t>(), 64}};
  DeviceBuffer drows = to_device(rows);
  for (const auto& [nh, fast] : {std::pair<int64_t, bool>{64, false}, {4, true}})
    EXPECT_THROW(cuda::indexer_topk(q.as<float>(), om.as<float>(), drows.as<cuda::IndexerRow>(), 1, nh, 128, 4, 64,
                                    out.as<int32_t>(), nullptr, fast, cuda::KeyFormat::BF16),
                 std::exception)
        << nh << " heads, fast " << fast;
  EXPECT_TRUE(cuda::indexer_bf16_keys_ok(64, 128));
  EXPECT_FALSE(cuda::indexer_bf16_keys_ok(4, 128));
}

// More rows than one grid dimension holds (65535; a 262144-token prefill has that many indexer
// rows): scoring and selection run over row ranges (indexer_select splits before choosing its
// path). Rows share one key buffer; fp32 scores, and bf16 tensor-core scores of bf16 keys.
TEST(CudaOpsIndexer, RowsBeyondOneGridDimension) {
  DSV4_REQUIRE_GPU();
  std::vector<int64_t> visible(65536 + 9);
  for (size_t r = 0; r < visible.size(); ++r) visible[r] = static_cast<int64_t>(r % 61);
  run_case(visible, 8, 32, 4, false, true, false, false, true);
  run_case(visible, 8, 32, 4, false, true, true, true, true);
}

TEST(CudaOpsIndexer, TinyModelShapes) {
  DSV4_REQUIRE_GPU();
  run_case({1, 4, 9, 250}, 8, 128, 4, false, false);
}

}  // namespace
}  // namespace dsv4
