#include "model/mtp.h"

#include <algorithm>
#include <set>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/attention.h"
#include "model/batch.h"
#include "model/mhc.h"
#include "model/moe.h"

namespace dsv4 {

MtpModule::MtpModule(const Model& model) : model_(&model), rope_(make_rope_freqs(model.config(), false)) {
  DSV4_CHECK(!model.weights().mtp.empty(), "MTP: the checkpoint has no mtp.* tensors (num_nextn_predict_layers = ",
             model.config().num_nextn_predict_layers, ")");
}

SequenceState MtpModule::new_state() const {
  const ModelConfig& cfg = model_->config();
  SequenceState s;
  s.layers.resize(1);
  s.layers[0].window.assign(static_cast<size_t>(cfg.sliding_window * cfg.head_dim), 0.0f);
  return s;
}

std::vector<float> MtpModule::forward(std::span<const MtpChunk> chunks, bool all_logits,
                                      std::vector<float>* out_streams) const {
  const ModelWeights& w = model_->weights();
  const MtpWeights& M = w.mtp[0];
  const ModelConfig& cfg = w.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);

  BatchRows b;
  std::set<const SequenceState*> seen;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.state && seen.insert(c.state).second, "MTP forward: each sequence may appear once per call");
    DSV4_CHECK(c.state->layers.size() == 1, "MTP forward: not an MTP state");
    DSV4_CHECK(!c.next.empty(), "MTP forward: empty chunk");
    b.segs.push_back({c.state, b.rows, static_cast<int64_t>(c.next.size()), c.state->pos});
    for (size_t i = 0; i < c.next.size(); ++i) {
      DSV4_CHECK(c.next[i] >= 0 && c.next[i] < V, "MTP forward: token id ", c.next[i], " out of range");
      b.token.push_back(c.next[i]);
      b.pos.push_back(c.state->pos + static_cast<int64_t>(i));
    }
    b.rows += static_cast<int64_t>(c.next.size());
  }
  const int64_t R = b.rows;

  // Input streams Z_i = W_h RMSNorm(X_i; hnorm) + W_e RMSNorm(e; enorm).
  std::vector<float> X(R * n * d), e(R * d), We(R * d), Wh(R * n * d);
  for (size_t ci = 0; ci < chunks.size(); ++ci)
    std::copy_n(chunks[ci].streams, b.segs[ci].n * n * d, X.data() + b.segs[ci].row0 * n * d);
  for (int64_t r = 0; r < R; ++r) cpu::dequant_row(w.embed, b.token[r], e.data() + r * d);
  cpu::rms_norm(e.data(), M.enorm.data(), e.data(), R, d, eps);
  cpu::linear(M.e_proj, e.data(), R, We.data());
  cpu::rms_norm(X.data(), M.hnorm.data(), X.data(), R * n, d, eps);
  cpu::linear(M.h_proj, X.data(), R * n, Wh.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < d; ++c) X[(r * n + i) * d + c] = Wh[(r * n + i) * d + c] + We[r * d + c];

  // The decoder block, as a main layer with its own state at layer index 0.
  const LayerWeights& L = M.block;
  std::vector<float> u(R * d), F(R * d);
  HcMix mix;
  hc_pre(L.hc_attn, cfg, X.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), L.attn_norm.data(), u.data(), R, d, eps);
  attention_forward(L, 0, cfg, rope_, b, u.data(), F.data());
  hc_post(mix, F.data(), X.data(), R, n, d);
  hc_pre(L.hc_ffn, cfg, X.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), L.ffn_norm.data(), u.data(), R, d, eps);
  moe_forward(L.ffn, cfg, false, b, u.data(), F.data());
  hc_post(mix, F.data(), X.data(), R, n, d);
  for (const auto& s : b.segs) s.state->pos += s.n;

  std::vector<int64_t> out_rows;
  for (const auto& s : b.segs) {
    if (all_logits) {
      for (int64_t i = 0; i < s.n; ++i) out_rows.push_back(s.row0 + i);
    } else {
      out_rows.push_back(s.row0 + s.n - 1);
    }
  }
  const int64_t O = static_cast<int64_t>(out_rows.size());
  std::vector<float> Xo(O * n * d), h(O * d), logits(O * V);
  for (int64_t i = 0; i < O; ++i) std::copy_n(X.data() + out_rows[i] * n * d, n * d, Xo.data() + i * n * d);
  hc_head(M.hc_head, cfg, Xo.data(), O, h.data());
  cpu::rms_norm(h.data(), M.norm.data(), h.data(), O, d, eps);
  cpu::linear(w.head, h.data(), O, logits.data());
  if (out_streams) *out_streams = std::move(Xo);
  return logits;
}

}  // namespace dsv4
