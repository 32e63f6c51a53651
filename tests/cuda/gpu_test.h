// Shared helpers for GPU tests: skip without a GPU, fresh random inputs, poisoned outputs.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/device.h"

#define DSV4_REQUIRE_GPU() \
  do {                     \
    if (!::dsv4::cuda::available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

namespace dsv4::test {

// A new seed per call (std::random_device): every run draws fresh inputs.
inline std::mt19937_64& rng() {
  static std::mt19937_64 g{std::random_device{}()};
  return g;
}

inline std::vector<float> randn(size_t n, float std = 1.0f) {
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

// Relative error ||a - b|| / ||b||; NaN (an unwritten, poisoned element) gives +inf.
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace dsv4::test
