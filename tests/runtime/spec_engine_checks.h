// Speculative-decoding checks shared by the CPU and CUDA engine tests.
//
// Greedy: greedy_spec_requests() are six concurrent requests whose prompts share prefixes (cache
// hits) and half of which lift three tokens so drafts get accepted.
//
// Sampled: check_spec_sampling() runs k = 2; the first
// three tokens (all decided by one draft/verify round, drafted from the cached prompt) over
// N = 3000 seeds against their exact law from the target alone (27 outcomes). logit_bias lifts
// three tokens by 30 in target and draft alike, so the MTP's drafts land in the target's
// support and both branches of the rule run. Bins with expected count < 5 are pooled; the
// critical value is the 1 − 1e-4 quantile (z = 3.719): a correct sampler fails with
// probability 1e-4 (seeds fixed: the outcome is reproducible).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace dsv4::test {

// Deterministic prompt of `len` tokens; prompts of one salt are prefixes of each other.
inline std::vector<int32_t> spec_prompt(int64_t len, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(2 + (i * 131 + salt * 17 + i * i * 7) % 509));
  return p;
}

// Runs all requests concurrently; returns their tokens in submission order.
inline std::vector<std::vector<int32_t>> run_engine(Engine& e, const std::vector<Request>& reqs) {
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    Request r = reqs[i];
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
    };
    e.submit(std::move(r));
  }
  e.run_until_idle();
  return out;
}

inline std::vector<Request> greedy_spec_requests() {
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    Request r;
    r.prompt = spec_prompt(5 + 7 * i, i == 2 ? 2 : 1);
    r.sampling.temperature = 0;
    // Odd requests lift three tokens in target and draft alike: drafts get accepted there.
    if (i % 2) r.sampling.logit_bias = {{7, 30.0f}, {11, 30.0f}, {13, 30.0f}};
    r.stop.max_tokens = 12 + i;
    r.stop.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Wilson–Hilferty upper quantile of chi²(df) at standard-normal z.
inline double chi2_quantile(double df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// target_logits(ctx): the target model's last-row logits after the tokens ctx (the law's
// reference); backend: the MTP backend under test. label names the run in the printout.
inline void check_spec_sampling(const std::function<std::vector<float>(const std::vector<int32_t>&)>& target_logits,
                                ModelBackend& backend, const std::vector<int32_t>& prompt, const char* label) {
  const int64_t V = backend.config().vocab_size;
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 3;
  sp.logit_bias = {{7, 30.0f}, {11, 30.0f}, {13, 30.0f}};
  TokenHistory h0(V, prompt);
  auto dist = [&](const std::vector<int32_t>& ctx) {
    std::vector<float> l = target_logits(ctx);
    apply_penalties(l, sp, h0);  // logit_bias only: independent of the history
    return sampling_distribution(l, sp);
  };
  std::map<std::vector<int32_t>, double> law;
  std::vector<int32_t> ctx = prompt;
  const std::vector<double> p1 = dist(ctx);
  for (int32_t a : {7, 11, 13}) {
    ctx.push_back(a);
    const std::vector<double> p2 = dist(ctx);
    for (int32_t b : {7, 11, 13}) {
      ctx.push_back(b);
      const std::vector<double> p3 = dist(ctx);
      for (int32_t c : {7, 11, 13}) law[{a, b, c}] = p1[a] * p2[b] * p3[c];
      ctx.pop_back();
    }
    ctx.pop_back();
  }

  EngineOptions o;
  o.speculative_tokens = 2;
  o.limits.max_batch = 64;
  o.limits.max_tokens_per_step = 4096;
  o.prefix_block = 8;
  Engine e(backend, o);
  const int N = 3000;
  std::vector<Request> reqs;
  for (int i = 0; i < N; ++i) {
    Request r;
    r.prompt = prompt;
    r.sampling = sp;
    r.sampling.seed = static_cast<uint64_t>(i) + 1;
    r.stop.max_tokens = 3;
    r.stop.ignore_eos = true;
    reqs.push_back(std::move(r));
  }
  const auto outs = run_engine(e, reqs);
  std::map<std::vector<int32_t>, int> seen;
  for (const auto& t : outs) {
    ASSERT_EQ(t.size(), 3u);
    ++seen[t];
  }
  double chi = 0, pooled_e = 0;
  int pooled_o = 0, bins = 0, outside = 0;
  for (const auto& [key, n] : seen) outside += law.count(key) ? 0 : n;
  for (const auto& [key, p] : law) {
    const double ex = p * N;
    const int obs = seen.count(key) ? seen[key] : 0;
    if (ex < 5) {
      pooled_e += ex;
      pooled_o += obs;
      continue;
    }
    chi += (obs - ex) * (obs - ex) / ex;
    ++bins;
  }
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  }
  const EngineStats s = e.stats();
  const double crit = chi2_quantile(bins - 1, 3.719);
  std::printf("  %s sampled k=2: chi2 = %.1f (df %d, critical %.1f); %lld/%lld drafts accepted (%.1f%%)\n", label, chi,
              bins - 1, crit, static_cast<long long>(s.spec_accepted_tokens),
              static_cast<long long>(s.spec_draft_tokens),
              100.0 * static_cast<double>(s.spec_accepted_tokens) /
                  static_cast<double>(std::max<int64_t>(1, s.spec_draft_tokens)));
  EXPECT_EQ(outside, 0);
  EXPECT_LT(chi, crit);
  EXPECT_GT(s.spec_accepted_tokens, 0) << "the accept branch never ran";
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens) << "the reject branch never ran";
}

}  // namespace dsv4::test
