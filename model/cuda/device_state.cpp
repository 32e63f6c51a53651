#include "model/cuda/device_state.h"

#include <algorithm>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace dsv4 {

DeviceSequence::DeviceSequence(const ModelConfig& cfg, int64_t capacity, cuda::KeyFormat index_keys,
                               cuda::KeyFormat kv)
    : capacity_(capacity), index_keys_(index_keys), kv_(kv) {
  DSV4_CHECK(capacity > 0, "sequence capacity must be positive");
  DSV4_CHECK(kv == cuda::KeyFormat::F32 || cfg.head_dim % 2 == 0, "bf16 attention keys need an even head dim");
  // Dk: float slots per attention key (a bf16 key is D / 2 slots of bf16 pairs; every copy
  // below moves slots, so rings, entries, rollback and state copies need no other change).
  const int64_t D = cfg.head_dim, W = cfg.sliding_window, dI = cfg.index_head_dim;
  const int64_t Dk = kv == cuda::KeyFormat::BF16 ? D / 2 : D;
  const int64_t key_bytes = index_keys == cuda::KeyFormat::BF16 ? 2 : 4;
  // Two passes: sizes first (in floats), then pointers into one buffer.
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
    sizes.push_back(W * Dk);
    sizes.push_back(s.cmp_rows * s.cmp_width);
    sizes.push_back(s.cmp_rows * s.cmp_width);
    sizes.push_back(s.idx_rows * s.idx_width);
    sizes.push_back(s.idx_rows * s.idx_width);
    sizes.push_back(n_entries * Dk);
    sizes.push_back(k == AttnKind::CSA ? (n_entries * dI * key_bytes + 3) / 4 : 0);
    layers.push_back(s);
    ratio_.push_back(m);
    idx_key_bytes_.push_back(k == AttnKind::CSA ? dI * key_bytes : 0);
  }
  W_ = W;
  D0_ = Dk;
  max_verify_ = W;
  for (const auto& s : layers) {
    if (s.cmp_rows > 0) max_verify_ = std::min(max_verify_, s.cmp_rows);
    if (s.idx_rows > 0) max_verify_ = std::min(max_verify_, s.idx_rows);
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

void DeviceSequence::copy_state_from(const DeviceSequence& src, cudaStream_t stream) {
  DSV4_CHECK(layers.size() == src.layers.size(), "copy_state_from: sequences of different models");
  DSV4_CHECK(capacity_ >= src.pos, "copy_state_from: capacity ", capacity_, " < ", src.pos, " tokens");
  DSV4_CHECK(index_keys_ == src.index_keys_ && kv_ == src.kv_,
             "copy_state_from: sequences with different indexer key or attention key formats");
  auto copy_bytes = [&](void* dst, const void* from, int64_t bytes) {
    if (bytes > 0) DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, from, bytes, cudaMemcpyDeviceToDevice, stream));
  };
  auto copy = [&](float* dst, const float* from, int64_t n) { copy_bytes(dst, from, n * int64_t(sizeof(float))); };
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
    copy_bytes(b.idx_keys, a.idx_keys, closed * idx_key_bytes_[l]);
  }
  pos = src.pos;
  undo_p0_ = -1;  // a pending verify of the old state no longer applies
  undo_n_ = 0;
}

namespace {

// Copies positions [p, p + n) between a ring ([rows, width], slot = pos % rows) and a dense
// [n, width] buffer; n <= rows, so at most two pieces (the ring may wrap).
void ring_copy(float* ring, int64_t rows, int64_t width, int64_t p, int64_t n, float* dense, bool to_ring,
               cudaStream_t stream) {
  if (ring == nullptr || n <= 0) return;
  const int64_t slot = p % rows, first = std::min(n, rows - slot);
  auto piece = [&](int64_t ring_row, int64_t dense_row, int64_t count) {
    float* r = ring + ring_row * width;
    float* d = dense + dense_row * width;
    const size_t bytes = static_cast<size_t>(count * width) * sizeof(float);
    DSV4_CUDA_CHECK(cudaMemcpyAsync(to_ring ? r : d, to_ring ? d : r, bytes, cudaMemcpyDeviceToDevice, stream));
  };
  piece(slot, 0, first);
  if (first < n) piece(0, first, n - first);
}

}  // namespace

// The undo buffer holds, per layer, n rows of each ring in this order: window, cmp_a, cmp_z,
// idx_a, idx_z (rings a layer lacks take no room).
void DeviceSequence::begin_verify(int64_t n, cudaStream_t stream) {
  DSV4_CHECK(n > 0 && n <= max_verify_, "begin_verify: ", n, " tokens outside [1, ", max_verify_, "]");
  int64_t per_row = 0;
  for (const auto& s : layers) per_row += D0_ + 2 * s.cmp_width + 2 * s.idx_width;
  const size_t need = static_cast<size_t>(n * per_row) * sizeof(float);
  if (undo_.bytes() < need) {
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream));  // the old buffer may still be read by queued copies
    undo_ = cuda::DeviceBuffer(need);
  }
  float* d = undo_.as<float>();
  for (auto& s : layers) {
    ring_copy(s.ring, W_, D0_, pos, n, d, false, stream);
    d += n * D0_;
    for (float* r : {s.cmp_a, s.cmp_z}) {
      ring_copy(r, s.cmp_rows, s.cmp_width, pos, n, d, false, stream);
      d += n * s.cmp_width;
    }
    for (float* r : {s.idx_a, s.idx_z}) {
      ring_copy(r, s.idx_rows, s.idx_width, pos, n, d, false, stream);
      d += n * s.idx_width;
    }
  }
  undo_p0_ = pos;
  undo_n_ = n;
}

void DeviceSequence::truncate(int64_t new_pos, cudaStream_t stream) {
  if (undo_p0_ < 0) {
    DSV4_CHECK(new_pos == pos, "truncate: no verify pending, cannot go back to ", new_pos, " from ", pos);
    return;
  }
  DSV4_CHECK(new_pos >= undo_p0_ && new_pos <= pos && pos <= undo_p0_ + undo_n_, "truncate: position ", new_pos,
             " outside the verify [", undo_p0_, ", ", pos, "]");
  const int64_t n = undo_n_, skip = new_pos - undo_p0_, back = undo_p0_ + n - new_pos;  // rows to restore
  float* d = undo_.as<float>();
  for (auto& s : layers) {
    ring_copy(s.ring, W_, D0_, new_pos, back, d + skip * D0_, true, stream);
    d += n * D0_;
    for (float* r : {s.cmp_a, s.cmp_z}) {
      ring_copy(r, s.cmp_rows, s.cmp_width, new_pos, back, d + skip * s.cmp_width, true, stream);
      d += n * s.cmp_width;
    }
    for (float* r : {s.idx_a, s.idx_z}) {
      ring_copy(r, s.idx_rows, s.idx_width, new_pos, back, d + skip * s.idx_width, true, stream);
      d += n * s.idx_width;
    }
  }
  pos = new_pos;
  undo_p0_ = -1;
  undo_n_ = 0;
}

}  // namespace dsv4
