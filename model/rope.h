// RoPE inverse frequencies per layer kind (spec/model.md §4): SWA layers use rope_theta without
// scaling; layers with a compressor use compress_rope_theta with YaRN (no mscale).
#pragma once
#include <vector>

#include "io/config.h"

namespace dsv4 {

struct RopeFreqs {
  std::vector<float> inv_freq;  // one per rotated pair (rope_dim / 2)
  int64_t pairs() const { return static_cast<int64_t>(inv_freq.size()); }
};

RopeFreqs make_rope_freqs(const ModelConfig& cfg, bool compressed_layer);

}  // namespace dsv4
