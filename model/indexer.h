// Lightning indexer (spec/model.md §5.3, CSA layers): scores every causally visible compressed
// entry per query, I(t,s) = Σ_h ω_{t,h} ReLU(q_{t,h} · K_s), and keeps the top-k.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/rope.h"
#include "model/weights.h"

namespace dsv4 {

// Runs the indexer's compressor (appending keys to each segment's layer state), then returns for
// every row the selected entry indices (at most index_topk, all visible ones when fewer).
std::vector<std::vector<int32_t>> indexer_select(const IndexerWeights& w, const ModelConfig& cfg, const RopeFreqs& rope,
                                                 const BatchRows& batch, size_t layer, const float* u,
                                                 const float* qr);

// Top-k of scores (descending; ties keep the lower index first). Exposed for tests.
std::vector<int32_t> topk_indices(const std::vector<float>& scores, int64_t k);

}  // namespace dsv4
