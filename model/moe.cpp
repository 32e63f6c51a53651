#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/indexer.h"

namespace dsv4 {

void swiglu_expert(const ExpertWeights& e, float limit, const float* x, int64_t rows, float* y) {
  const int64_t I = e.w1.out;
  std::vector<float> g(rows * I), v(rows * I);
  cpu::linear(e.w1, x, rows, g.data());
  cpu::linear(e.w3, x, rows, v.data());
  for (int64_t i = 0; i < rows * I; ++i) {
    float gi = g[i], vi = v[i];
    if (limit > 0) {
      gi = std::min(gi, limit);
      vi = std::clamp(vi, -limit, limit);
    }
    g[i] = cpu::silu(gi) * vi;
  }
  cpu::linear(e.w2, g.data(), rows, y);
}

Routing route(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch, const float* u) {
  const int64_t R = batch.rows, E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  std::vector<float> logits(R * E);
  cpu::linear(w.gate, u, R, logits.data());
  Routing rt;
  rt.experts.resize(R * K);
  rt.weights.resize(R * K);
  std::vector<float> score(E), biased(E);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t e = 0; e < E; ++e) score[e] = std::sqrt(cpu::softplus(logits[r * E + e]));
    std::vector<int32_t> pick;
    if (hash) {
      const int32_t tok = batch.token[r];
      DSV4_CHECK(tok >= 0 && tok < cfg.vocab_size, "token id ", tok, " out of range");
      pick.assign(w.tid2eid.begin() + tok * K, w.tid2eid.begin() + (tok + 1) * K);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = score[e] + w.bias[e];
      pick = topk_indices(biased, K);
    }
    float sum = 0;
    for (int32_t e : pick) sum += score[e];
    for (int64_t k = 0; k < K; ++k) {
      rt.experts[r * K + k] = pick[k];
      rt.weights[r * K + k] = score[pick[k]] / sum * static_cast<float>(cfg.routed_scaling_factor);
    }
  }
  return rt;
}

void moe_forward(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch, const float* u,
                 float* out) {
  const int64_t R = batch.rows, d = cfg.hidden_size, E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  const float limit = static_cast<float>(cfg.swiglu_limit);
  Routing rt = route(w, cfg, hash, batch, u);

  // Group rows by expert so each expert's weights are read once per call.
  std::vector<std::vector<int64_t>> rows_of(E);
  std::vector<std::vector<float>> wt_of(E);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      rows_of[rt.experts[r * K + k]].push_back(r);
      wt_of[rt.experts[r * K + k]].push_back(rt.weights[r * K + k]);
    }
  swiglu_expert(w.shared, limit, u, R, out);
  std::vector<float> xs, ys;
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = rows_of[e];
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    xs.resize(n * d);
    ys.resize(n * d);
    for (int64_t i = 0; i < n; ++i) std::copy_n(u + rows[i] * d, d, xs.data() + i * d);
    swiglu_expert(w.experts[e], limit, xs.data(), n, ys.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < d; ++c) out[rows[i] * d + c] += wt_of[e][i] * ys[i * d + c];
  }
}

}  // namespace dsv4
