// Per-sequence decoding state on the GPU (spec/model.md §6): per layer the sliding-window ring,
// compressor input rings (previous + open window for CSA, open window for HCA, indexer likewise),
// and the compressed entries / indexer keys up to a fixed context capacity. One allocation.
#pragma once
#include <cstdint>
#include <vector>

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

 private:
  int64_t capacity_;
  cuda::DeviceBuffer buf_;
};

}  // namespace dsv4
