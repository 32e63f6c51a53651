#include "backend/cpu/ops.h"

#include <cmath>

namespace dsv4::cpu {

void rms_norm(const float* x, const float* gamma, float* y, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = (gamma ? gamma[i] : 1.0f) * (xr[i] * inv);
  }
}

void rope_inplace(float* x, int64_t len, const float* inv_freq, int64_t n_pairs, int64_t pos, bool inverse) {
  float* p = x + (len - 2 * n_pairs);
  for (int64_t i = 0; i < n_pairs; ++i) {
    // The reference computes the angle in fp32 (pos * inv_freq); do the same so long contexts agree.
    const float ang = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
    const float a = p[2 * i], b = p[2 * i + 1];
    p[2 * i] = a * c - b * s;
    p[2 * i + 1] = a * s + b * c;
  }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

}  // namespace dsv4::cpu
