// Per-sequence decoding state on the GPU (spec/model.md §6): per layer the sliding-window ring,
// compressor input rings (previous + open window for CSA, open window for HCA, indexer likewise),
// and the compressed entries / indexer keys up to a fixed context capacity. One allocation.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/device.h"
#include "io/config.h"

namespace dsv4 {

struct DeviceLayerState {
  float* ring = nullptr;          // [W, D], slot = pos % W
  float *cmp_a = nullptr, *cmp_z = nullptr;  // [cmp_rows, cmp_width]
  int64_t cmp_rows = 0, cmp_width = 0;
  float *idx_a = nullptr, *idx_z = nullptr;  // [idx_rows, idx_width]
  int64_t idx_rows = 0, idx_width = 0;
  float* entries = nullptr;       // [capacity / m, D]
  float* idx_keys = nullptr;      // [capacity / m, dI]
};

class DeviceSequence {
 public:
  DeviceSequence(const ModelConfig& cfg, int64_t capacity);
  int64_t pos = 0;  // tokens consumed
  int64_t capacity() const { return capacity_; }
  size_t bytes() const { return buf_.bytes(); }
  std::vector<DeviceLayerState> layers;
  // Makes this sequence continue exactly like `src` (device-to-device copies of the rings, the
  // closed entries and indexer keys). Needs capacity() >= src.pos. Ordered on `stream`.
  void copy_state_from(const DeviceSequence& src, cudaStream_t stream);

 private:
  int64_t capacity_;
  std::vector<int64_t> ratio_, D_, dI_;  // per layer: compression ratio and entry widths
  int64_t W_ = 0, D0_ = 0;
  cuda::DeviceBuffer buf_;
};

}  // namespace dsv4
