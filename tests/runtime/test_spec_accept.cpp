// The speculative acceptance rule (runtime/spec_accept.h) on crafted p and q: drawing x ~ q and
// applying verify_draft yields tokens distributed as p — checked exactly (the output law is
// linear in the accept/reject branches, integrated over u) and by a chi-square test on samples.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/spec_accept.h"

namespace dsv4 {
namespace {

// Exact law of the emitted token: Σ_x q(x) [a(x) δ_x + (1 − a(x)) r], a = min(1, p/q), with the
// residual r read off verify_draft itself by sweeping its resample uniform finely.
std::vector<double> exact_output(const std::vector<double>& p, const std::vector<double>& q) {
  const size_t V = p.size();
  std::vector<double> out(V, 0.0);
  const int kGrid = 20000;
  for (size_t x = 0; x < V; ++x) {
    if (q[x] <= 0) continue;
    const double a = std::min(1.0, p[x] / q[x]);
    out[x] += q[x] * a;
    if (a >= 1.0) {
      EXPECT_TRUE(verify_draft(p, q, static_cast<int32_t>(x), 0.999999, 0.5).accepted);
      continue;
    }
    EXPECT_FALSE(verify_draft(p, q, static_cast<int32_t>(x), a + 1e-9, 0.5).accepted);
    EXPECT_TRUE(verify_draft(p, q, static_cast<int32_t>(x), a - 1e-9, 0.5).accepted || a < 1e-9);
    for (int g = 0; g < kGrid; ++g) {
      const DraftVerdict v = verify_draft(p, q, static_cast<int32_t>(x), 0.999999999, (g + 0.5) / kGrid);
      out[v.token] += q[x] * (1 - a) / kGrid;
    }
  }
  return out;
}

TEST(SpecAccept, OutputLawIsTheTargetOnCraftedDistributions) {
  const std::vector<std::pair<std::vector<double>, std::vector<double>>> cases = {
      {{0.5, 0.3, 0.2, 0.0}, {0.25, 0.25, 0.25, 0.25}},   // q wider than p
      {{0.1, 0.1, 0.4, 0.4}, {0.7, 0.2, 0.1, 0.0}},       // q misses a token of p
      {{0.25, 0.25, 0.25, 0.25}, {0.25, 0.25, 0.25, 0.25}},  // q == p: always accepted
      {{0.0, 0.0, 1.0, 0.0}, {0.5, 0.5, 0.0, 0.0}},       // disjoint: always rejected
  };
  for (const auto& [p, q] : cases) {
    const std::vector<double> out = exact_output(p, q);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(out[i], p[i], 1e-3) << "token " << i;
  }
}

// Samples: x ~ q, then the rule; chi-square against p with 5 bins (4 dof). The critical value
// 23.51 is the 1 − 1e-4 quantile of chi²(4): a correct rule fails with probability 1e-4 (the
// seed is fixed, so in practice it either always passes or always fails).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double c = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    if (e > 0) c += (counts[i] - e) * (counts[i] - e) / e;
    else if (counts[i] > 0) return INFINITY;
  }
  return c;
}

TEST(SpecAccept, SampledTokensFollowTheTarget) {
  const std::vector<double> p = {0.05, 0.4, 0.15, 0.3, 0.1}, q = {0.4, 0.1, 0.3, 0.1, 0.1};
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> U(0.0, 1.0);
  const int N = 200000;
  std::vector<int> got(5, 0), naive(5, 0);
  int accepted = 0;
  for (int i = 0; i < N; ++i) {
    const int32_t x = draw_token(q, U(rng));
    const DraftVerdict v = verify_draft(p, q, x, U(rng), U(rng));
    ++got[v.token];
    accepted += v.accepted;
    ++naive[x];  // control: keeping every draft gives q, not p
  }
  EXPECT_LT(chi_square(got, p, N), 23.51);
  EXPECT_GT(chi_square(naive, p, N), 23.51);
  // Acceptance rate = Σ min(p, q) = 0.05 + 0.1 + 0.15 + 0.1 + 0.1 = 0.5.
  EXPECT_NEAR(static_cast<double>(accepted) / N, 0.5, 0.01);
}

TEST(SpecAccept, GreedyOneHotKeepsOnlyTheArgmax) {
  const std::vector<double> p = {0, 0, 1, 0}, q_hit = {0, 0, 1, 0}, q_miss = {0, 1, 0, 0};
  EXPECT_TRUE(verify_draft(p, q_hit, 2, 0.99, 0.3).accepted);
  const DraftVerdict v = verify_draft(p, q_miss, 1, 0.01, 0.3);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 2);
}

}  // namespace
}  // namespace dsv4
