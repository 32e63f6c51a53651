#include "model/model.h"

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

Model::Model(ModelWeights weights)
    : w_(std::move(weights)),
      rope_swa_(make_rope_freqs(w_.config, false)),
      rope_compressed_(make_rope_freqs(w_.config, true)) {}

Model::Model(ModelWeights weights, const RankContext& par) : Model(std::move(weights)) { par_ = par; }

std::vector<float> Model::forward(std::span<const SequenceChunk> chunks, bool all_logits, std::vector<float>* hidden) {
  const ModelConfig& cfg = w_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size;

  BatchRows b;
  std::set<const SequenceState*> seen;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.state && seen.insert(c.state).second, "forward: each sequence may appear once per call");
    DSV4_CHECK(c.state->layers.size() == static_cast<size_t>(cfg.num_layers), "forward: state of another model");
    DSV4_CHECK(!c.tokens.empty(), "forward: empty chunk");
    b.segs.push_back({c.state, b.rows, static_cast<int64_t>(c.tokens.size()), c.state->pos});
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int32_t t = c.tokens[i];
      DSV4_CHECK(t >= 0 && t < V, "token id ", t, " out of range [0, ", V, ")");
      b.token.push_back(t);
      b.pos.push_back(c.state->pos + static_cast<int64_t>(i));
    }
    b.rows += static_cast<int64_t>(c.tokens.size());
  }
  const int64_t R = b.rows;

  // Residual streams: n copies of the embedding.
  std::vector<float> X(R * n * d), e(d);
  for (int64_t r = 0; r < R; ++r) {
    cpu::dequant_row(w_.embed, b.token[r], e.data());
    for (int64_t i = 0; i < n; ++i) std::copy(e.begin(), e.end(), X.begin() + (r * n + i) * d);
  }

  for (size_t li = 0; li < w_.layers.size(); ++li) {
    const LayerWeights& L = w_.layers[li];
    decoder_block(L, li, cfg, L.kind == AttnKind::SWA ? rope_swa_ : rope_compressed_, b, L.hash, X,
                  par_.active() ? &par_ : nullptr);
  }
  for (const auto& s : b.segs) s.state->pos += s.n;
  if (hidden) *hidden = X;

  // Head on every row, or on each chunk's last row.
  std::vector<int64_t> out_rows;
  for (size_t ci = 0; ci < b.segs.size(); ++ci) {
    const auto& s = b.segs[ci];
    if (all_logits || chunks[ci].every_row) {
      for (int64_t i = 0; i < s.n; ++i) out_rows.push_back(s.row0 + i);
    } else {
      out_rows.push_back(s.row0 + s.n - 1);
    }
  }
  return head_logits(w_.hc_head, w_.norm, w_.head, cfg, X, out_rows);
}

}  // namespace dsv4
