// Helpers of the CUDA op parity tests: poisoned output buffers and RoPE frequency tables.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/device.h"
#include "tests/cuda/gpu_test.h"

namespace dsv4::test {

// An output buffer filled with 0xFF bytes (NaN floats, -1 ints) so unwritten elements fail.
template <typename T>
cuda::DeviceBuffer poisoned(size_t count) {
  cuda::DeviceBuffer b(count * sizeof(T));
  b.fill_bytes(0xFF);
  return b;
}

// int32 outputs where -1 is a valid value (the indexer's empty slots): 0x7F7F7F7F, neither -1
// nor any index, so an unwritten row fails.
inline cuda::DeviceBuffer poisoned_indices(size_t count) {
  cuda::DeviceBuffer b(count * sizeof(int32_t));
  b.fill_bytes(0x7F);
  return b;
}

// theta^(-2i/rope_dim), i < pairs (the unscaled RoPE table).
inline std::vector<float> inv_freqs(int64_t pairs, double theta = 10000.0) {
  std::vector<float> f(static_cast<size_t>(pairs));
  for (int64_t i = 0; i < pairs; ++i) f[i] = static_cast<float>(std::pow(theta, -2.0 * i / (2.0 * pairs)));
  return f;
}

inline std::vector<int64_t> rand_positions(size_t n, int64_t max_pos) {
  std::uniform_int_distribution<int64_t> d(0, max_pos);
  std::vector<int64_t> p(n);
  for (auto& x : p) x = d(rng());
  return p;
}

}  // namespace dsv4::test
