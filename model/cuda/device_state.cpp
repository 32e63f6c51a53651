#include "model/cuda/device_state.h"

#include "core/error.h"

namespace dsv4 {

DeviceSequence::DeviceSequence(const ModelConfig& cfg, int64_t capacity) : capacity_(capacity) {
  DSV4_CHECK(capacity > 0, "sequence capacity must be positive");
  const int64_t D = cfg.head_dim, W = cfg.sliding_window, dI = cfg.index_head_dim;
  // Two passes: sizes first, then pointers into one buffer.
  std::vector<int64_t> sizes;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t m = cfg.compress_ratio[l];
    const AttnKind k = cfg.layer_kinds[l];
    DeviceLayerState s;
    s.cmp_rows = k == AttnKind::CSA ? 2 * m : (k == AttnKind::HCA ? m : 0);
    s.cmp_width = k == AttnKind::CSA ? 2 * D : (k == AttnKind::HCA ? D : 0);
    s.idx_rows = k == AttnKind::CSA ? 2 * m : 0;
    s.idx_width = k == AttnKind::CSA ? 2 * dI : 0;
    const int64_t n_entries = m > 0 ? capacity / m + 1 : 0;
    sizes.push_back(W * D);
    sizes.push_back(s.cmp_rows * s.cmp_width);
    sizes.push_back(s.cmp_rows * s.cmp_width);
    sizes.push_back(s.idx_rows * s.idx_width);
    sizes.push_back(s.idx_rows * s.idx_width);
    sizes.push_back(n_entries * D);
    sizes.push_back(k == AttnKind::CSA ? n_entries * dI : 0);
    layers.push_back(s);
  }
  int64_t total = 0;
  for (int64_t n : sizes) total += (n + 63) / 64 * 64;
  buf_ = cuda::DeviceBuffer(static_cast<size_t>(total) * sizeof(float));
  buf_.fill_bytes(0);
  float* p = buf_.as<float>();
  size_t i = 0;
  auto take = [&](int64_t n) {
    float* r = n ? p : nullptr;
    p += (n + 63) / 64 * 64;
    return r;
  };
  for (auto& s : layers) {
    s.ring = take(sizes[i++]);
    s.cmp_a = take(sizes[i++]);
    s.cmp_z = take(sizes[i++]);
    s.idx_a = take(sizes[i++]);
    s.idx_z = take(sizes[i++]);
    s.entries = take(sizes[i++]);
    s.idx_keys = take(sizes[i++]);
  }
}

}  // namespace dsv4
