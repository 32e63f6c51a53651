// Per-sequence decoding state (spec/model.md §6): for every layer the sliding-window ring of
// shared-KV vectors, closed compressed entries, indexer keys, and the compressor inputs of
// windows that are still open (or, for CSA, needed as the overlap of the next entry).
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// Projected compressor inputs a (kv) and z (gate logits + ape) of positions [start, start + rows).
struct CompressorState {
  int64_t start = 0;
  std::vector<float> a, z;  // rows × width
  // Rows at positions >= pin are kept after their window closes (speculative verification
  // may roll back into that window; see state_undo.h).
  int64_t pin = std::numeric_limits<int64_t>::max();
};

struct LayerState {
  std::vector<float> window;    // sliding_window × head_dim ring; slot = position % window
  CompressorState cmp, idx_cmp;
  std::vector<float> entries;   // closed compressed KV entries, n × head_dim
  std::vector<float> idx_keys;  // indexer keys, n × index_head_dim (CSA)
};

struct SequenceState {
  int64_t pos = 0;  // tokens consumed so far
  std::vector<LayerState> layers;
  size_t bytes() const;  // memory held (for reporting)
};

SequenceState make_sequence_state(const ModelConfig& cfg);

}  // namespace dsv4
