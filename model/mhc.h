// Manifold-constrained hyper-connections (spec/model.md §5.2, §5.5): per-token mixing
// coefficients of the n residual streams, Sinkhorn-projected combine matrix, head collapse.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/weights.h"

namespace dsv4 {

struct HcMix {
  std::vector<float> pre, post, comb;  // [R, n], [R, n], [R, n, n] (comb[j][k] row-major)
};

// X: [R, n, d] streams. Computes the mix and the sub-layer input u = Σ_i pre_i X_i ([R, d]).
void hc_pre(const HcWeights& w, const ModelConfig& cfg, const float* X, int64_t R, HcMix& mix, float* u);
// X'[k] = post_k F + Σ_j comb[j][k] X[j], in place on X.
void hc_post(const HcMix& mix, const float* F, float* X, int64_t R, int64_t n, int64_t d);
// Head collapse h = Σ_i (σ(scale μ_i + base_i) + eps) X_i, [R, d].
void hc_head(const HcWeights& w, const ModelConfig& cfg, const float* X, int64_t R, float* h);

// Exposed for tests: Sinkhorn projection of one n×n logit matrix (in place → doubly stochastic).
void sinkhorn(float* M, int64_t n, int64_t iters, float eps);

}  // namespace dsv4
