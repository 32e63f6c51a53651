// cuda::sample: greedy rows equal the CPU sampler's argmax exactly; stochastic rows use a
// different RNG stream than tools/generate.cpp's sample_token (by design), so they are checked
// statistically: frequencies over many seeds against the (top-k / top-p restricted) softmax
// with a chi-square bound whose false-failure rate is ~1e-6.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cuda/ops.h"
#include "tools/generate.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;

struct Params {
  float temperature = 1.0f, top_p = 1.0f;
  int32_t top_k = 0;
};

// Samples each of R rows (logits [R, V]) with seed = row index and the given step.
std::vector<int32_t> run(const std::vector<float>& logits, int64_t R, int64_t V, const Params& p, uint64_t step) {
  std::vector<float> T(R, p.temperature), P(R, p.top_p);
  std::vector<int32_t> K(R, p.top_k);
  std::vector<uint64_t> seed(R), st(R, step);
  std::iota(seed.begin(), seed.end(), uint64_t(1));
  DeviceBuffer dl = to_device(logits), dT = to_device(T), dP = to_device(P), dK = to_device(K), dS = to_device(seed),
               dst = to_device(st), dtok = poisoned<int32_t>(R);
  cuda::sample(dl.as<float>(), R, V, dT.as<float>(), dP.as<float>(), dK.as<int32_t>(), dS.as<uint64_t>(),
               dst.as<uint64_t>(), dtok.as<int32_t>(), nullptr);
  return to_host<int32_t>(dtok, R);
}

// Upper chi-square quantile for ~1e-6 tail (Wilson-Hilferty, z = 4.75).
double chi2_bound(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 4.75 * std::sqrt(a), 3.0);
}

// Counts N draws of one logit row (replicated over seeds) and tests them against probs; tokens
// with probability 0 must never appear.
void expect_distribution(const std::vector<float>& row, const Params& p, const std::vector<double>& probs) {
  const int64_t V = static_cast<int64_t>(row.size()), N = 200000;
  std::vector<float> logits(N * V);
  for (int64_t r = 0; r < N; ++r) std::copy(row.begin(), row.end(), logits.begin() + r * V);
  const std::vector<int32_t> tok = run(logits, N, V, p, 7);
  std::vector<int64_t> count(V, 0);
  for (int32_t t : tok) {
    ASSERT_TRUE(t >= 0 && t < V) << t;
    ++count[t];
  }
  double chi2 = 0;
  int df = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (probs[v] == 0) {
      EXPECT_EQ(count[v], 0) << "token " << v << " is outside the kept set";
      continue;
    }
    const double e = probs[v] * N;
    chi2 += (count[v] - e) * (count[v] - e) / e;
    ++df;
  }
  if (df > 0) {
    EXPECT_LE(chi2, chi2_bound(df)) << "df " << df;
  }
}

std::vector<double> softmax(const std::vector<float>& l, float T) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += (p[i] = std::exp((l[i] - mx) / T));
  for (auto& x : p) x /= s;
  return p;
}

// Keeps the probs of `keep` (renormalised), zero elsewhere.
std::vector<double> restrict_to(std::vector<double> p, const std::vector<int32_t>& keep) {
  std::vector<double> q(p.size(), 0.0);
  double s = 0;
  for (int32_t i : keep) s += p[i];
  for (int32_t i : keep) q[i] = p[i] / s;
  return q;
}

std::vector<int32_t> by_prob_desc(const std::vector<double>& p) {
  std::vector<int32_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  return idx;
}

TEST(CudaOpsSample, GreedyMatchesCpuArgmax) {
  DSV4_REQUIRE_GPU();
  const int64_t R = 6, V = 129280;
  std::vector<float> logits = randn(R * V);
  logits[2 * V + 77] = logits[2 * V + 90000] = 50.0f;  // tie: the first index wins, as max_element
  GenerateOptions opt;
  opt.temperature = 0.0f;
  for (Params p : {Params{0.0f, 1.0f, 0}, Params{1.0f, 0.9f, 1}}) {  // temperature 0, or top_k 1
    const std::vector<int32_t> got = run(logits, R, V, p, 0);
    for (int64_t r = 0; r < R; ++r) EXPECT_EQ(got[r], sample_token(logits.data() + r * V, V, opt, 0)) << "row " << r;
  }
}

TEST(CudaOpsSample, TinyTemperatureIsArgmax) {
  DSV4_REQUIRE_GPU();
  const int64_t R = 64, V = 5000;
  std::vector<float> logits = randn(R * V);
  std::vector<int32_t> want(R);
  for (int64_t r = 0; r < R; ++r) {
    float* l = logits.data() + r * V;
    want[r] = static_cast<int32_t>(std::max_element(l, l + V) - l);
    l[want[r]] += 0.05f;  // margin: exp(-0.05 / 1e-3) ~ 2e-22 for the runner-up
  }
  EXPECT_EQ(run(logits, R, V, Params{1e-3f, 1.0f, 0}, 3), want);
}

TEST(CudaOpsSample, FrequenciesMatchSoftmax) {
  DSV4_REQUIRE_GPU();
  const std::vector<float> row = randn(16);
  expect_distribution(row, Params{0.8f, 1.0f, 0}, softmax(row, 0.8f));
}

TEST(CudaOpsSample, TopKKeepsOnlyTheKLargest) {
  DSV4_REQUIRE_GPU();
  const std::vector<float> row = randn(16);
  const std::vector<double> p = softmax(row, 1.0f);
  std::vector<int32_t> order = by_prob_desc(p);
  order.resize(5);
  expect_distribution(row, Params{1.0f, 1.0f, 5}, restrict_to(p, order));
}

TEST(CudaOpsSample, TopPExcludesTheTail) {
  DSV4_REQUIRE_GPU();
  // Redraw until the nucleus boundary is not razor-close to top_p (float vs double masses).
  const float top_p = 0.7f;
  for (;;) {
    const std::vector<float> row = randn(16, 1.5f);
    const std::vector<double> p = softmax(row, 1.0f);
    const std::vector<int32_t> order = by_prob_desc(p);
    double c = 0;
    size_t keep = 0;
    bool close = false;
    while (keep < order.size()) {
      c += p[order[keep++]];
      if (std::fabs(c - top_p) < 1e-3) close = true;
      if (c >= top_p) break;
    }
    if (close || keep < 2) continue;
    const std::vector<int32_t> kept(order.begin(), order.begin() + keep);
    expect_distribution(row, Params{1.0f, top_p, 0}, restrict_to(p, kept));
    return;
  }
}

TEST(CudaOpsSample, TopKAndTopPOnFullVocab) {
  DSV4_REQUIRE_GPU();
  // Large vocab: only the 40 largest logits may ever be drawn with top_k 40.
  const int64_t R = 300, V = 129280;
  const std::vector<float> row = randn(V, 2.0f);
  std::vector<float> logits(R * V);
  for (int64_t r = 0; r < R; ++r) std::copy(row.begin(), row.end(), logits.begin() + r * V);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(), [&](int a, int b) { return row[a] > row[b]; });
  const std::vector<int32_t> top(order.begin(), order.begin() + 40);
  for (int32_t t : run(logits, R, V, Params{1.0f, 0.95f, 40}, 11))
    EXPECT_NE(std::find(top.begin(), top.end(), t), top.end()) << t;
}

}  // namespace
}  // namespace dsv4
