#include "model/state_undo.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace dsv4 {

StateLayout target_layout(const ModelConfig& cfg) {
  return {cfg.layer_kinds, cfg.compress_ratio, cfg.sliding_window, cfg.head_dim, cfg.index_head_dim};
}

StateLayout mtp_layout(const ModelConfig& cfg) {
  return {{AttnKind::SWA}, {0}, cfg.sliding_window, cfg.head_dim, cfg.index_head_dim};
}

namespace {

void pin(CompressorState& c, int64_t at) { c.pin = std::min(c.pin, at); }

// Unpins, and drops the rows an unpinned run at `pos` would no longer hold (model/compressor.cpp:
// the open window, plus the previous one for CSA's overlap). Without this the next verify
// would pin them again and speculation would keep every row it ever saw.
void unpin(CompressorState& c, int64_t pos, int64_t m, bool overlap) {
  c.pin = std::numeric_limits<int64_t>::max();
  if (m <= 0 || c.a.empty()) return;
  const int64_t width = static_cast<int64_t>(c.a.size()) / (pos - c.start), next_w = pos / m;
  const int64_t keep = std::max<int64_t>(0, (overlap ? next_w - 1 : next_w) * m);
  if (keep <= c.start) return;
  const int64_t drop = (keep - c.start) * width;
  c.a.erase(c.a.begin(), c.a.begin() + drop);
  c.z.erase(c.z.begin(), c.z.begin() + drop);
  c.start = keep;
}

void unpin_layers(SequenceState& st, const StateLayout& lay, int64_t pos) {
  for (size_t l = 0; l < st.layers.size(); ++l) {
    const bool csa = lay.kinds[l] == AttnKind::CSA;
    unpin(st.layers[l].cmp, pos, lay.ratios[l], csa);
    unpin(st.layers[l].idx_cmp, pos, lay.ratios[l], csa);
  }
}

}  // namespace

void undo_record(StateUndo& u, SequenceState& st, const StateLayout& lay, int64_t n) {
  const size_t Lc = st.layers.size();
  DSV4_CHECK(Lc == lay.kinds.size(), "undo: state and layout disagree");
  if (u.empty()) {
    u.pos0 = st.pos;
    for (auto& L : st.layers) {  // no row may go: CSA re-pools the previous window after a cut
      pin(L.cmp, L.cmp.start);
      pin(L.idx_cmp, L.idx_cmp.start);
    }
  }
  const int64_t W = lay.window, D = lay.head_dim;
  for (int64_t t = st.pos; t < st.pos + n; ++t) {
    u.slot_pos.push_back(t);
    for (const auto& L : st.layers) {
      const float* s = L.window.data() + (t % W) * D;
      u.saved.insert(u.saved.end(), s, s + D);
    }
  }
}

void undo_truncate(StateUndo& u, SequenceState& st, const StateLayout& lay, int64_t new_pos) {
  if (u.empty()) {
    DSV4_CHECK(new_pos == st.pos, "undo: nothing recorded, cannot go back to ", new_pos, " from ", st.pos);
    return;
  }
  DSV4_CHECK(new_pos >= u.pos0 && new_pos <= st.pos, "undo: position ", new_pos, " outside [", u.pos0, ", ", st.pos, "]");
  const int64_t W = lay.window, D = lay.head_dim, Lc = static_cast<int64_t>(st.layers.size());
  // Newest first, so a slot written twice ends with its oldest surviving content.
  for (int64_t i = static_cast<int64_t>(u.slot_pos.size()) - 1; i >= 0; --i) {
    const int64_t t = u.slot_pos[i];
    if (t < new_pos) continue;
    for (int64_t l = 0; l < Lc; ++l)
      std::copy_n(u.saved.data() + (i * Lc + l) * D, D, st.layers[l].window.data() + (t % W) * D);
  }
  for (int64_t l = 0; l < Lc; ++l) {
    LayerState& L = st.layers[l];
    const int64_t m = lay.ratios[l];
    if (m > 0) {
      L.entries.resize(static_cast<size_t>(new_pos / m * D));
      if (lay.kinds[l] == AttnKind::CSA) L.idx_keys.resize(static_cast<size_t>(new_pos / m * lay.index_head_dim));
    }
    for (CompressorState* c : {&L.cmp, &L.idx_cmp}) {
      if (c->a.empty()) continue;
      const size_t width = c->a.size() / static_cast<size_t>(st.pos - c->start);  // rows are [start, pos)
      DSV4_CHECK(c->start <= new_pos, "undo: compressor rows before ", new_pos, " were dropped");
      c->a.resize(static_cast<size_t>(new_pos - c->start) * width);
      c->z.resize(c->a.size());
    }
  }
  st.pos = new_pos;
  unpin_layers(st, lay, new_pos);
  u = StateUndo{};
}

}  // namespace dsv4
