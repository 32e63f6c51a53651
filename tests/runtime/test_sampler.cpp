// Sampler parameters against references computed here on crafted logits.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "runtime/sampler.h"

namespace dsv4 {
namespace {

std::vector<float> logits_of(std::vector<double> p) {  // logits whose softmax is p
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::vector<double> softmax_ref(const std::vector<float>& l, double T) {
  std::vector<double> p;
  double mx = *std::max_element(l.begin(), l.end()), s = 0;
  for (float x : l) s += std::exp((x - mx) / T);
  for (float x : l) p.push_back(std::exp((x - mx) / T) / s);
  return p;
}

void expect_dist(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

TEST(Penalties, RepetitionOverPromptAndGenerated) {
  std::vector<int32_t> prompt = {0, 1};
  TokenHistory h(5, prompt);
  h.add_generated(4);
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f, -4.0f};
  apply_penalties(l, p, h);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f, -8.0f}));  // positive ÷, negative ×
}

TEST(Penalties, FrequencyAndPresenceOverGeneratedOnly) {
  std::vector<int32_t> prompt = {0, 0, 1};
  TokenHistory h(4, prompt);
  for (int32_t t : {2, 2, 3}) h.add_generated(t);
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  p.logit_bias = {{1, 1.5f}};
  std::vector<float> l = {1.0f, 1.0f, 1.0f, 1.0f};
  apply_penalties(l, p, h);
  EXPECT_FLOAT_EQ(l[0], 1.0f);          // prompt only: untouched
  EXPECT_FLOAT_EQ(l[1], 2.5f);          // bias
  EXPECT_FLOAT_EQ(l[2], 1.0f - 1.25f);  // 2 × 0.5 + 0.25
  EXPECT_FLOAT_EQ(l[3], 1.0f - 0.75f);
}

TEST(Distribution, TemperatureMinPTopKTopP) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.temperature = 0.7f;
  expect_dist(sampling_distribution(l, p), softmax_ref(l, 0.7f));
  p.temperature = 1.0f;

  p.min_p = 0.2f;  // cut at 0.1: drops the 0.05 token
  expect_dist(sampling_distribution(l, p), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  p.min_p = 0;

  p.top_k = 2;
  expect_dist(sampling_distribution(l, p), {0.5 / 0.8, 0.3 / 0.8, 0, 0});
  p.top_k = 0;

  p.top_p = 0.75f;  // 0.5 < 0.75, 0.8 ≥ 0.75: two tokens
  expect_dist(sampling_distribution(l, p), {0.5 / 0.8, 0.3 / 0.8, 0, 0});
  p.top_p = 0.85f;
  expect_dist(sampling_distribution(l, p), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  p.top_p = 0.3f;  // the top token alone
  expect_dist(sampling_distribution(l, p), {1, 0, 0, 0});

  p.top_k = 3;  // top_p applies to the renormalised top-k: 0.5/0.95 < 0.6 ≤ 0.8/0.95
  p.top_p = 0.6f;
  expect_dist(sampling_distribution(l, p), {0.5 / 0.8, 0.3 / 0.8, 0, 0});
}

TEST(Sample, DrawsFollowTheDistributionAndRepeatPerSeedAndStep) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p;
  p.temperature = 1.0f;
  TokenHistory h(4, {});
  std::vector<int> seen(4, 0);
  const int N = 20000;
  for (int s = 0; s < N; ++s) ++seen[sample_next(l, p, h, 42, static_cast<uint64_t>(s)).token];
  const double want[4] = {0.5, 0.3, 0.15, 0.05};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(seen[i] / double(N), want[i], 0.015) << "token " << i;
  for (uint64_t s = 0; s < 50; ++s)
    EXPECT_EQ(sample_next(l, p, h, 7, s).token, sample_next(l, p, h, 7, s).token);
  int differ = 0;
  for (uint64_t s = 0; s < 50; ++s) differ += sampling_uniform(7, s) != sampling_uniform(8, s);
  EXPECT_EQ(differ, 50);
  p.top_k = 1;
  for (uint64_t s = 0; s < 50; ++s) EXPECT_EQ(sample_next(l, p, h, 1, s).token, 0);
}

TEST(Sample, GreedyIsArgmaxOfPenalisedLogits) {
  std::vector<float> l = {1.0f, 3.0f, 2.9f};
  std::vector<int32_t> prompt = {1};
  TokenHistory h(3, prompt);
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sample_next(l, p, h, 0, 0).token, 1);
  p.repetition_penalty = 1.1f;  // 3.0 / 1.1 < 2.9
  EXPECT_EQ(sample_next(l, p, h, 0, 0).token, 2);
}

TEST(Logprobs, RawAndProcessed) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, -1.0f};
  TokenHistory h(4, {});
  h.add_generated(1);
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 2.0f;  // token 1 → 1.0: token 2 wins
  p.logprobs = true;
  p.top_logprobs = 3;
  SampleResult r = sample_next(l, p, h, 0, 0);
  EXPECT_EQ(r.token, 2);
  std::vector<float> raw = log_softmax(l);
  EXPECT_FLOAT_EQ(r.logprob, raw[2]);
  ASSERT_EQ(r.top_logprobs.size(), 3u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);  // raw order
  EXPECT_EQ(r.top_logprobs[1].token, 2);
  EXPECT_EQ(r.top_logprobs[2].token, 0);
  EXPECT_FLOAT_EQ(r.top_logprobs[0].logprob, raw[1]);

  p.logprobs_mode = LogprobsMode::Processed;  // greedy: log-softmax of the penalised logits
  r = sample_next(l, p, h, 0, 0);
  std::vector<float> pen = log_softmax(std::vector<float>{1.0f, 1.0f, 2.0f, -1.0f});
  EXPECT_FLOAT_EQ(r.logprob, pen[2]);
  EXPECT_EQ(r.top_logprobs[0].token, 2);
  EXPECT_EQ(r.top_logprobs[1].token, 0);  // tie with 1: lower id first
  EXPECT_EQ(r.top_logprobs[2].token, 1);

  p.temperature = 0.5f;  // sampled: log of the truncated distribution, removed tokens -inf
  p.presence_penalty = 0;
  p.top_k = 2;
  r = sample_next(l, p, h, 3, 0);
  std::vector<double> d = sampling_distribution(l, p);
  EXPECT_FLOAT_EQ(r.logprob, static_cast<float>(std::log(d[r.token])));
  EXPECT_TRUE(std::isinf(r.top_logprobs[2].logprob));
  const double sum = std::exp(r.top_logprobs[0].logprob) + std::exp(r.top_logprobs[1].logprob);
  EXPECT_NEAR(sum, 1.0, 1e-6);
}

TEST(SamplingParams, RejectsOutOfRange) {
  auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    EXPECT_THROW(p.validate(10), Error);
  };
  bad([](SamplingParams& p) { p.temperature = -1; });
  bad([](SamplingParams& p) { p.top_p = 0; });
  bad([](SamplingParams& p) { p.top_p = 1.5f; });
  bad([](SamplingParams& p) { p.top_k = -2; });
  bad([](SamplingParams& p) { p.min_p = 2; });
  bad([](SamplingParams& p) { p.presence_penalty = 3; });
  bad([](SamplingParams& p) { p.frequency_penalty = -3; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0; });
  bad([](SamplingParams& p) { p.top_logprobs = 21; });
  bad([](SamplingParams& p) { p.logit_bias = {{10, 1.0f}}; });
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate(10));
}

}  // namespace
}  // namespace dsv4
