#include "model/mhc.h"

#include <cmath>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"

namespace dsv4 {

namespace {
WeightView f32_matrix(const Vec& v, int64_t out, int64_t in) {
  WeightView w;
  w.format = WeightFormat::Dense;
  w.dtype = DType::F32;
  w.out = out;
  w.in = in;
  w.data = reinterpret_cast<const uint8_t*>(v.data());
  return w;
}

// mu [R, rows_of_fn] = rho · (fn · flatten(X)), rho = 1/sqrt(mean(v²) + eps).
std::vector<float> project(const HcWeights& w, const ModelConfig& cfg, const float* X, int64_t R, int64_t n_out) {
  const int64_t nd = cfg.hc_mult * cfg.hidden_size;
  std::vector<float> mu(static_cast<size_t>(R * n_out));
  cpu::linear(f32_matrix(w.fn, n_out, nd), X, R, mu.data());
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < nd; ++i) ss += static_cast<double>(X[r * nd + i]) * X[r * nd + i];
    const float rho = 1.0f / std::sqrt(static_cast<float>(ss / nd) + static_cast<float>(cfg.rms_norm_eps));
    for (int64_t i = 0; i < n_out; ++i) mu[r * n_out + i] *= rho;
  }
  return mu;
}
}  // namespace

void sinkhorn(float* M, int64_t n, int64_t iters, float eps) {
  // Row softmax + eps, then column normalise; then (iters-1) × {row, column} normalise.
  for (int64_t j = 0; j < n; ++j) {
    float mx = M[j * n];
    for (int64_t k = 1; k < n; ++k) mx = std::max(mx, M[j * n + k]);
    float s = 0;
    for (int64_t k = 0; k < n; ++k) s += (M[j * n + k] = std::exp(M[j * n + k] - mx));
    for (int64_t k = 0; k < n; ++k) M[j * n + k] = M[j * n + k] / s + eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < n; ++k) {
      float s = 0;
      for (int64_t j = 0; j < n; ++j) s += M[j * n + k];
      for (int64_t j = 0; j < n; ++j) M[j * n + k] /= (s + eps);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0;
      for (int64_t k = 0; k < n; ++k) s += M[j * n + k];
      for (int64_t k = 0; k < n; ++k) M[j * n + k] /= (s + eps);
    }
  };
  col_norm();
  for (int64_t it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
}

void hc_pre(const HcWeights& w, const ModelConfig& cfg, const float* X, int64_t R, HcMix& mix, float* u) {
  const int64_t n = cfg.hc_mult, d = cfg.hidden_size, n_out = (2 + n) * n;
  const float eps = static_cast<float>(cfg.hc_eps);
  std::vector<float> mu = project(w, cfg, X, R, n_out);
  mix.pre.resize(R * n);
  mix.post.resize(R * n);
  mix.comb.resize(R * n * n);
  for (int64_t r = 0; r < R; ++r) {
    const float* m = mu.data() + r * n_out;
    for (int64_t i = 0; i < n; ++i) {
      mix.pre[r * n + i] = cpu::sigmoid(w.scale[0] * m[i] + w.base[i]) + eps;
      mix.post[r * n + i] = 2.0f * cpu::sigmoid(w.scale[1] * m[n + i] + w.base[n + i]);
    }
    float* P = mix.comb.data() + r * n * n;
    for (int64_t i = 0; i < n * n; ++i) P[i] = w.scale[2] * m[2 * n + i] + w.base[2 * n + i];
    sinkhorn(P, n, cfg.hc_sinkhorn_iters, eps);
    float* ur = u + r * d;
    for (int64_t c = 0; c < d; ++c) {
      float acc = 0;
      for (int64_t i = 0; i < n; ++i) acc += mix.pre[r * n + i] * X[(r * n + i) * d + c];
      ur[c] = acc;
    }
  }
}

void hc_post(const HcMix& mix, const float* F, float* X, int64_t R, int64_t n, int64_t d) {
  std::vector<float> old(static_cast<size_t>(n * d));
  for (int64_t r = 0; r < R; ++r) {
    float* Xr = X + r * n * d;
    std::copy(Xr, Xr + n * d, old.begin());
    const float* P = mix.comb.data() + r * n * n;
    for (int64_t k = 0; k < n; ++k) {
      const float post = mix.post[r * n + k];
      for (int64_t c = 0; c < d; ++c) {
        float acc = post * F[r * d + c];
        for (int64_t j = 0; j < n; ++j) acc += P[j * n + k] * old[j * d + c];
        Xr[k * d + c] = acc;
      }
    }
  }
}

void hc_head(const HcWeights& w, const ModelConfig& cfg, const float* X, int64_t R, float* h) {
  const int64_t n = cfg.hc_mult, d = cfg.hidden_size;
  std::vector<float> mu = project(w, cfg, X, R, n);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < d; ++c) h[r * d + c] = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float pre = cpu::sigmoid(w.scale[0] * mu[r * n + i] + w.base[i]) + static_cast<float>(cfg.hc_eps);
      for (int64_t c = 0; c < d; ++c) h[r * d + c] += pre * X[(r * n + i) * d + c];
    }
  }
}

}  // namespace dsv4
