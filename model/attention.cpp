#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/thread_pool.h"
#include "model/compressor.h"
#include "model/indexer.h"

namespace dsv4 {

void attend(const float* q, const std::vector<const float*>& keys, int64_t D, float scale, float sink, float* o,
            std::vector<float>& logits) {
  logits.resize(keys.size());
  float mx = sink;
  for (size_t s = 0; s < keys.size(); ++s) {
    logits[s] = cpu::dot(q, keys[s], D) * scale;
    mx = std::max(mx, logits[s]);
  }
  float den = std::exp(sink - mx);
  for (auto& l : logits) den += (l = std::exp(l - mx));
  std::fill(o, o + D, 0.0f);
  for (size_t s = 0; s < keys.size(); ++s) {
    const float p = logits[s] / den;
    const float* k = keys[s];
    for (int64_t c = 0; c < D; ++c) o[c] += p * k[c];
  }
}

void attention_forward(const LayerWeights& L, size_t layer, const ModelConfig& cfg, const RopeFreqs& rope,
                       const BatchRows& batch, const float* u, float* out) {
  const AttentionWeights& A = L.attn;
  const int64_t R = batch.rows, d = cfg.hidden_size, H = cfg.num_heads, D = cfg.head_dim;
  const int64_t ql = cfg.q_lora_rank, W = cfg.sliding_window, P = rope.pairs();
  const float eps = static_cast<float>(cfg.rms_norm_eps);

  // Query: low-rank, q_norm, per-head weightless RMS, RoPE on the last channels.
  std::vector<float> qr(R * ql), q(R * H * D), kv(R * D);
  cpu::linear(A.wq_a, u, R, qr.data());
  cpu::rms_norm(qr.data(), A.q_norm.data(), qr.data(), R, ql, eps);
  cpu::linear(A.wq_b, qr.data(), R, q.data());
  cpu::rms_norm(q.data(), nullptr, q.data(), R * H, D, eps);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < H; ++h) cpu::rope_inplace(q.data() + (r * H + h) * D, D, rope.inv_freq.data(), P, batch.pos[r], false);

  // Shared K = V.
  cpu::linear(A.wkv, u, R, kv.data());
  cpu::rms_norm(kv.data(), A.kv_norm.data(), kv.data(), R, D, eps);
  for (int64_t r = 0; r < R; ++r) cpu::rope_inplace(kv.data() + r * D, D, rope.inv_freq.data(), P, batch.pos[r], false);

  // Compressed entries close before attention, so a window's last token sees its own entry.
  const int64_t m = L.ratio;
  if (A.has_compressor) {
    CompressorSpec spec{m, L.kind == AttnKind::CSA, D, eps};
    compressor_forward(
        A.compressor, spec, rope, batch, u, d,
        [&](const BatchRows::Segment& s) -> CompressorState& { return s.state->layers[layer].cmp; },
        [&](const BatchRows::Segment& s) -> std::vector<float>& { return s.state->layers[layer].entries; });
  }
  std::vector<std::vector<int32_t>> sel;
  if (A.has_indexer) sel = indexer_select(A.indexer, cfg, rope, batch, layer, u, qr.data());

  std::vector<float> o(R * H * D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (const auto& s : batch.segs) {
    LayerState& st = s.state->layers[layer];
    parallel_for(static_cast<size_t>(s.n), [&](size_t b, size_t e) {
      std::vector<const float*> keys;
      std::vector<float> logits;
      for (size_t i = b; i < e; ++i) {
        const int64_t r = s.row0 + static_cast<int64_t>(i), p = batch.pos[r];
        keys.clear();
        for (int64_t t = std::max<int64_t>(0, p - W + 1); t <= p; ++t)
          keys.push_back(t >= s.p0 ? kv.data() + (s.row0 + t - s.p0) * D : st.window.data() + (t % W) * D);
        if (L.kind == AttnKind::HCA) {
          for (int64_t w = 0; w < (p + 1) / m; ++w) keys.push_back(st.entries.data() + w * D);
        } else if (L.kind == AttnKind::CSA) {
          for (int32_t w : sel[r]) keys.push_back(st.entries.data() + static_cast<int64_t>(w) * D);
        }
        for (int64_t h = 0; h < H; ++h) {
          float* oh = o.data() + (r * H + h) * D;
          attend(q.data() + (r * H + h) * D, keys, D, scale, A.sink[h], oh, logits);
          cpu::rope_inplace(oh, D, rope.inv_freq.data(), P, p, true);
        }
      }
    });
    // The ring keeps the last W shared-KV vectors for later chunks.
    for (int64_t t = std::max(s.p0, s.p0 + s.n - W); t < s.p0 + s.n; ++t)
      std::copy_n(kv.data() + (s.row0 + t - s.p0) * D, D, st.window.data() + (t % W) * D);
  }

  // Grouped low-rank output: group g's heads (H/g · D inputs) → o_lora_rank, then wo_b.
  const int64_t G = cfg.o_groups, Ro = cfg.o_lora_rank, gin = H * D / G;
  std::vector<float> y(R * G * Ro);
  for (int64_t g = 0; g < G; ++g) cpu::linear(A.wo_a, o.data() + g * gin, R, y.data() + g * Ro, g * Ro, (g + 1) * Ro, H * D, G * Ro);
  cpu::linear(A.wo_b, y.data(), R, out);
}

}  // namespace dsv4
