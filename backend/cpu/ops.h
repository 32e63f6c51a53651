// CPU reference elementwise / normalisation ops (fp32 math), row-major buffers.
#pragma once
#include <cstdint>

namespace dsv4::cpu {

// y = gamma ⊙ x / sqrt(mean(x²) + eps), per row of length n. gamma == nullptr: unweighted. In place OK.
void rms_norm(const float* x, const float* gamma, float* y, int64_t rows, int64_t n, float eps);

// Interleaved-pair RoPE on the last 2*n_pairs channels of a vector of length len:
// pair i rotates channels (c0+2i, c0+2i+1) by angle pos*inv_freq[i] (negated when inverse).
void rope_inplace(float* x, int64_t len, const float* inv_freq, int64_t n_pairs, int64_t pos, bool inverse);

inline float sigmoid(float x);
float silu(float x);
float softplus(float x);  // PyTorch default: beta 1, threshold 20

}  // namespace dsv4::cpu

#include <cmath>
inline float dsv4::cpu::sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
