// The MoE sub-layer on one rank of a TP × EP world. Routing is replicated (every rank holds
// the same u and router). The shared expert is TP-split: partial sums all-reduced over the TP
// group. Routed experts: each EP rank dispatches the (row, k) picks of its contiguous block of
// rows to the ranks owning those experts (all-to-all of counts, then of the rows and expert
// ids), computes the picks it received for its own experts, sends the results back the same
// way, adds them in ascending expert order (the single-rank order, so EP alone is bit-exact),
// and the EP group all-gathers the finished rows.
#pragma once
#include "model/batch.h"
#include "model/parallel/rank_context.h"
#include "model/weights.h"

namespace dsv4 {

// u: [R, d] after ffn_norm (same on every rank); out: [R, d], the same on every rank.
void moe_forward_parallel(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch,
                          const float* u, float* out, const RankContext& par);

}  // namespace dsv4
