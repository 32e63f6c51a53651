// The pieces every DeepSeek-V4 stack shares (main model and MTP block): one decoder block with
// its two mHC-wrapped sub-layers, and the hc_head → norm → head projection of chosen rows.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/parallel/rank_context.h"
#include "model/rope.h"
#include "model/weights.h"

namespace dsv4 {

// X [R, n, d] streams, updated in place: attention sub-layer then MoE sub-layer, each as
// hc_pre → RMSNorm → F → hc_post. `layer` indexes the per-sequence state. With `par`, L and
// cfg are one rank's shard (model/parallel/shard_weights.h) and the sub-layers' partial
// outputs are combined over its groups.
void decoder_block(const LayerWeights& L, size_t layer, const ModelConfig& cfg, const RopeFreqs& rope,
                   const BatchRows& batch, bool hash, std::vector<float>& X, const RankContext* par = nullptr);

// Logits [rows.size(), vocab] of the listed rows of X; their gathered streams go to *streams.
std::vector<float> head_logits(const HcWeights& hc_head, const Vec& norm, const WeightView& head, const ModelConfig& cfg,
                               const std::vector<float>& X, const std::vector<int64_t>& rows,
                               std::vector<float>* streams = nullptr);

}  // namespace dsv4
