#include "model/mtp.h"

#include <algorithm>
#include <set>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "model/attention.h"
#include "model/batch.h"
#include "model/block.h"
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
  decoder_block(M.block, 0, cfg, rope_, b, false, X);
  for (const auto& s : b.segs) s.state->pos += s.n;

  std::vector<int64_t> out_rows;
  for (const auto& s : b.segs) {
    if (all_logits) {
      for (int64_t i = 0; i < s.n; ++i) out_rows.push_back(s.row0 + i);
    } else {
      out_rows.push_back(s.row0 + s.n - 1);
    }
  }
  return head_logits(M.hc_head, M.norm, w.head, cfg, X, out_rows, out_streams);
}

}  // namespace dsv4
