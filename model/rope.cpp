#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

namespace {
// Dimension index at which a frequency completes `rotations` turns over the original context.
double correction_dim(double rotations, double dim, double base, double max_pos) {
  return dim * std::log(max_pos / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}
}  // namespace

RopeFreqs make_rope_freqs(const ModelConfig& cfg, bool compressed_layer) {
  const int64_t dim = cfg.rope_dim, pairs = dim / 2;
  const double base = compressed_layer ? cfg.compress_rope_theta : cfg.rope_theta;
  RopeFreqs r;
  r.inv_freq.resize(static_cast<size_t>(pairs));
  const bool yarn = compressed_layer && cfg.yarn.enabled;
  double low = 0, high = 0;
  if (yarn) {
    const double omax = static_cast<double>(cfg.yarn.original_max_position);
    low = std::floor(correction_dim(cfg.yarn.beta_fast, dim, base, omax));
    high = std::ceil(correction_dim(cfg.yarn.beta_slow, dim, base, omax));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // avoid a zero-width ramp
  }
  for (int64_t i = 0; i < pairs; ++i) {
    // fp32 exponent like the reference: base ** (2i/dim) with the ratio computed in fp32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    const double theta = 1.0 / std::pow(base, static_cast<double>(expo));
    double f = theta;
    if (yarn) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      f = theta * (1.0 - ramp) + (theta / cfg.yarn.factor) * ramp;
    }
    r.inv_freq[i] = static_cast<float>(f);
  }
  return r;
}

}  // namespace dsv4
