#include "model/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "model/compressor.h"

namespace dsv4 {

std::vector<int32_t> topk_indices(const std::vector<float>& scores, int64_t k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  k = std::min<int64_t>(k, static_cast<int64_t>(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

std::vector<std::vector<int32_t>> indexer_select(const IndexerWeights& w, const ModelConfig& cfg, const RopeFreqs& rope,
                                                 const BatchRows& batch, size_t layer, const float* u,
                                                 const float* qr) {
  const int64_t R = batch.rows, nh = cfg.index_n_heads, hd = cfg.index_head_dim, d = cfg.hidden_size;
  const int64_t ratio = cfg.compress_ratio[layer];
  CompressorSpec spec{ratio, true, hd, static_cast<float>(cfg.rms_norm_eps)};
  compressor_forward(
      w.compressor, spec, rope, batch, u, d, [&](const BatchRows::Segment& s) -> CompressorState& {
        return s.state->layers[layer].idx_cmp;
      },
      [&](const BatchRows::Segment& s) -> std::vector<float>& { return s.state->layers[layer].idx_keys; });

  std::vector<float> q(R * nh * hd), omega(R * nh);
  cpu::linear(w.wq_b, qr, R, q.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < nh; ++h)
      cpu::rope_inplace(q.data() + (r * nh + h) * hd, hd, rope.inv_freq.data(), rope.pairs(), batch.pos[r], false);
  cpu::linear(w.weights_proj, u, R, omega.data());
  const float wscale = 1.0f / std::sqrt(static_cast<float>(hd)) / std::sqrt(static_cast<float>(nh));
  for (auto& v : omega) v *= wscale;

  std::vector<std::vector<int32_t>> sel(static_cast<size_t>(R));
  for (const auto& s : batch.segs) {
    const std::vector<float>& keys = s.state->layers[layer].idx_keys;
    parallel_for(static_cast<size_t>(s.n), [&](size_t b, size_t e) {
      std::vector<float> scores;
      for (size_t i = b; i < e; ++i) {
        const int64_t r = s.row0 + static_cast<int64_t>(i);
        const int64_t visible = (batch.pos[r] + 1) / ratio;
        scores.assign(static_cast<size_t>(visible), 0.0f);
        for (int64_t k = 0; k < visible; ++k) {
          float acc = 0;
          for (int64_t h = 0; h < nh; ++h) {
            const float dotv = cpu::dot(q.data() + (r * nh + h) * hd, keys.data() + k * hd, hd);
            acc += omega[r * nh + h] * std::max(dotv, 0.0f);
          }
          scores[k] = acc;
        }
        sel[r] = topk_indices(scores, cfg.index_topk);
      }
    });
  }
  return sel;
}

}  // namespace dsv4
