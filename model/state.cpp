#include "model/state.h"

namespace dsv4 {

SequenceState make_sequence_state(const ModelConfig& cfg) {
  SequenceState s;
  s.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (auto& L : s.layers) L.window.assign(static_cast<size_t>(cfg.sliding_window * cfg.head_dim), 0.0f);
  return s;
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const auto& L : layers)
    n += 4 * (L.window.size() + L.cmp.a.size() + L.cmp.z.size() + L.idx_cmp.a.size() + L.idx_cmp.z.size() +
              L.entries.size() + L.idx_keys.size());
  return n;
}

}  // namespace dsv4
