// Helpers of the CUDA op parity tests: poisoned output buffers, RoPE frequency tables, bf16
// rounding (what the Fast kernels and bf16-stored keys hold).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
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

// bf16 round-to-nearest-even of x, as bits / back in fp32.
inline uint16_t bf16_bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_round(float x) {
  const uint32_t u = static_cast<uint32_t>(bf16_bits_of(x)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
inline std::vector<float> bf16_round(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf16_round(v[i]);
  return r;
}
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_bits_of(v[i]);
  return b;
}

inline std::vector<int64_t> rand_positions(size_t n, int64_t max_pos) {
  std::uniform_int_distribution<int64_t> d(0, max_pos);
  std::vector<int64_t> p(n);
  for (auto& x : p) x = d(rng());
  return p;
}

}  // namespace dsv4::test
