#include "model/cuda/device_state.h"

#include "backend/cuda/check.h"
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
    ratio_.push_back(m);
    dI_.push_back(k == AttnKind::CSA ? dI : 0);
  }
  W_ = W;
  D0_ = D;
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

void DeviceSequence::copy_state_from(const DeviceSequence& src, cudaStream_t stream) {
  DSV4_CHECK(layers.size() == src.layers.size(), "copy_state_from: sequences of different models");
  DSV4_CHECK(capacity_ >= src.pos, "copy_state_from: capacity ", capacity_, " < ", src.pos, " tokens");
  auto copy = [&](float* dst, const float* from, int64_t n) {
    if (n > 0) DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, from, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const DeviceLayerState &a = src.layers[l];
    DeviceLayerState& b = layers[l];
    copy(b.ring, a.ring, W_ * D0_);
    copy(b.cmp_a, a.cmp_a, a.cmp_rows * a.cmp_width);
    copy(b.cmp_z, a.cmp_z, a.cmp_rows * a.cmp_width);
    copy(b.idx_a, a.idx_a, a.idx_rows * a.idx_width);
    copy(b.idx_z, a.idx_z, a.idx_rows * a.idx_width);
    const int64_t closed = ratio_[l] > 0 ? src.pos / ratio_[l] : 0;
    copy(b.entries, a.entries, closed * D0_);
    copy(b.idx_keys, a.idx_keys, closed * dI_[l]);
  }
  pos = src.pos;
}

}  // namespace dsv4
