// Mixture of experts (spec/model.md §5.4): hash routing (tid2eid) or sqrt(softplus) scores with
// bias-for-selection top-k, renormalised × routed_scaling_factor; clamped SwiGLU experts; shared
// expert added.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/weights.h"

namespace dsv4 {

struct Routing {
  std::vector<int32_t> experts;  // [R, top_k]
  std::vector<float> weights;    // [R, top_k]
};

// y[rows, d] = W2 (silu(min(W1 x, L)) ⊙ clamp(W3 x, ±L)) of one expert (limit 0: no clamp).
void swiglu_expert(const ExpertWeights& e, float limit, const float* x, int64_t rows, float* y);

Routing route(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch, const float* u);

// u: [R, d] after ffn_norm; out: [R, d].
void moe_forward(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch, const float* u,
                 float* out);

}  // namespace dsv4
