#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace dsv4 {

void SamplingParams::validate(int64_t vocab) const {
  DSV4_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature must be >= 0, got ", temperature);
  DSV4_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got ", top_p);
  DSV4_CHECK(top_k >= -1, "top_k must be -1, 0 (off) or positive, got ", top_k);
  DSV4_CHECK(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got ", min_p);
  DSV4_CHECK(presence_penalty >= -2 && presence_penalty <= 2, "presence_penalty must be in [-2, 2], got ", presence_penalty);
  DSV4_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2, "frequency_penalty must be in [-2, 2], got ",
             frequency_penalty);
  DSV4_CHECK(repetition_penalty > 0 && std::isfinite(repetition_penalty), "repetition_penalty must be > 0, got ",
             repetition_penalty);
  DSV4_CHECK(top_logprobs >= 0 && top_logprobs <= 20, "top_logprobs must be in [0, 20], got ", top_logprobs);
  for (const auto& [tok, b] : logit_bias) {
    DSV4_CHECK(tok >= 0 && tok < vocab, "logit_bias: token id ", tok, " out of range [0, ", vocab, ")");
    DSV4_CHECK(std::isfinite(b), "logit_bias: bias of token ", tok, " is not finite");
  }
}

TokenHistory::TokenHistory(int64_t vocab, std::span<const int32_t> prompt)
    : out_count_(static_cast<size_t>(vocab), 0), seen_(static_cast<size_t>(vocab), 0) {
  for (int32_t t : prompt) {
    if (!seen_[t]) seen_list_.push_back(t);
    seen_[t] = 1;
  }
}

void TokenHistory::add_generated(int32_t t) {
  if (out_count_[t]++ == 0) out_tokens_.push_back(t);
  if (!seen_[t]) seen_list_.push_back(t);
  seen_[t] = 1;
}

void apply_penalties(std::span<float> l, const SamplingParams& p, const TokenHistory& h) {
  for (const auto& [tok, b] : p.logit_bias) l[tok] += b;
  if (p.repetition_penalty != 1.0f)
    for (int32_t t : h.seen_tokens()) l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    for (int32_t t : h.generated_tokens())
      l[t] -= p.frequency_penalty * static_cast<float>(h.generated_count(t)) + p.presence_penalty;
}

std::vector<double> sampling_distribution(std::span<const float> z, const SamplingParams& p) {
  DSV4_CHECK(p.temperature > 0, "sampling_distribution: temperature must be > 0");
  const size_t V = z.size();
  std::vector<double> pr(V);
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += (pr[i] = std::exp((static_cast<double>(z[i]) - mx) / p.temperature));
  for (auto& x : pr) x /= sum;
  if (p.min_p > 0) {
    const double cut = p.min_p * *std::max_element(pr.begin(), pr.end());
    for (auto& x : pr)
      if (x < cut) x = 0;
  }
  const bool top_k = p.top_k > 0 && static_cast<size_t>(p.top_k) < V;
  if (top_k || p.top_p < 1.0f) {
    std::vector<int32_t> idx;
    for (size_t i = 0; i < V; ++i)
      if (pr[i] > 0) idx.push_back(static_cast<int32_t>(i));
    auto more_likely = [&](int32_t a, int32_t b) { return pr[a] != pr[b] ? pr[a] > pr[b] : a < b; };
    size_t keep = top_k ? std::min(idx.size(), static_cast<size_t>(p.top_k)) : idx.size();
    if (keep < idx.size()) {  // only the top k need an order (vocab-size sorts are slow)
      std::nth_element(idx.begin(), idx.begin() + keep, idx.end(), more_likely);
      std::sort(idx.begin(), idx.begin() + keep, more_likely);
    } else {
      std::sort(idx.begin(), idx.end(), more_likely);
    }
    if (p.top_p < 1.0f) {
      double total = 0, cum = 0;
      for (size_t i = 0; i < keep; ++i) total += pr[idx[i]];
      size_t n = 0;
      while (n < keep && (n == 0 || cum < p.top_p * total)) cum += pr[idx[n++]];
      keep = n;
    }
    for (size_t i = keep; i < idx.size(); ++i) pr[idx[i]] = 0;
  }
  sum = std::accumulate(pr.begin(), pr.end(), 0.0);
  for (auto& x : pr) x /= sum;
  return pr;
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  // splitmix64 of a (seed, step) mix: a counter-based stream, no state carried between steps.
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (step + 0x632BE59BD9B4E019ull) * 0xD1B54A32D192ED03ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
}

std::vector<float> log_softmax(std::span<const float> l) {
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float v : l) sum += std::exp(static_cast<double>(v) - mx);
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<float> out(l.size());
  for (size_t i = 0; i < l.size(); ++i) out[i] = l[i] - lse;
  return out;
}

namespace {
void fill_logprobs(SampleResult& r, std::span<const float> raw, std::span<const float> z, const std::vector<double>& pr,
                   const SamplingParams& p);
}  // namespace

SampleResult sample_next(std::span<const float> raw, const SamplingParams& p, const TokenHistory& h, uint64_t seed,
                         uint64_t step) {
  const size_t V = raw.size();
  std::vector<float> z(raw.begin(), raw.end());
  apply_penalties(z, p, h);
  SampleResult r;
  std::vector<double> pr;
  if (p.temperature == 0.0f) {
    r.token = static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  } else {
    pr = sampling_distribution(z, p);
    const double u = sampling_uniform(seed, step);
    double c = 0;
    r.token = -1;
    for (size_t i = 0; i < V; ++i) {
      if (pr[i] <= 0) continue;
      r.token = static_cast<int32_t>(i);  // last kept token absorbs rounding at u → 1
      if ((c += pr[i]) > u) break;
    }
  }
  if (!p.logprobs && p.top_logprobs == 0) return r;
  fill_logprobs(r, raw, z, pr, p);
  return r;
}

SampleResult describe_token(std::span<const float> raw, const SamplingParams& p, const TokenHistory& h,
                            int32_t token) {
  SampleResult r;
  r.token = token;
  if (!p.logprobs && p.top_logprobs == 0) return r;
  std::vector<float> z(raw.begin(), raw.end());
  apply_penalties(z, p, h);
  std::vector<double> pr;
  if (p.temperature > 0.0f) pr = sampling_distribution(z, p);
  fill_logprobs(r, raw, z, pr, p);
  return r;
}

namespace {

void fill_logprobs(SampleResult& r, std::span<const float> raw, std::span<const float> z, const std::vector<double>& pr,
                   const SamplingParams& p) {
  const size_t V = raw.size();
  std::vector<float> lp;
  if (p.logprobs_mode == LogprobsMode::Raw) {
    lp = log_softmax(raw);
  } else if (p.temperature == 0.0f) {
    lp = log_softmax(z);
  } else {
    lp.resize(V);
    for (size_t i = 0; i < V; ++i)
      lp[i] = pr[i] > 0 ? static_cast<float>(std::log(pr[i])) : -std::numeric_limits<float>::infinity();
  }
  r.logprob = lp[r.token];
  if (p.top_logprobs > 0) {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = std::min(V, static_cast<size_t>(p.top_logprobs));
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return lp[a] != lp[b] ? lp[a] > lp[b] : a < b; });
    for (size_t i = 0; i < k; ++i) r.top_logprobs.push_back({idx[i], lp[idx[i]]});
  }
}

}  // namespace

}  // namespace dsv4
