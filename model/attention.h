// DeepSeek-V4 attention (spec/model.md §5.3): shared-KV MQA over the sliding window plus
// compressed entries (HCA: all visible, CSA: indexer top-k), attention sink, inverse RoPE and
// grouped low-rank output.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/rope.h"
#include "model/weights.h"

namespace dsv4 {

// Softmax attention of one head over keys (= values) with a sink logit in the denominator;
// `logits` is scratch. Exposed as the CPU twin of the CUDA sparse attention.
void attend(const float* q, const std::vector<const float*>& keys, int64_t D, float scale, float sink, float* o,
            std::vector<float>& logits);

// u: [R, d] after attn_norm; out: [R, d]. Advances each segment's layer state (ring, entries).
void attention_forward(const LayerWeights& L, size_t layer, const ModelConfig& cfg, const RopeFreqs& rope,
                       const BatchRows& batch, const float* u, float* out);

}  // namespace dsv4
