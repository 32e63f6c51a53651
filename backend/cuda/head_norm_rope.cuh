// One head's RMS norm (optional weight) and RoPE of its rotary tail, as a warp computes it with
// lane l holding the head's 4-value chunks l + 32 k: the arithmetic that rms_norm_rope_kernel
// (ops_norm.cu, a warp per head) and the attention kernel's Q staging (ops_attention_wgmma.cu, a
// warp per 8 heads) share, from one source, so that both give the same bits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda::detail {

// A lane's running sum of squares, one chunk at a time in chunk order (in double, as the CPU twin).
__device__ __forceinline__ double add_squares(double ss, float4 v) {
  return ss + (double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w);
}

// 1 / rms of len values from the warp's total (warp_sum of the lanes' add_squares).
__device__ __forceinline__ float inv_rms(double ss, int64_t len, float eps) {
  return 1.0f / sqrtf(static_cast<float>(ss / len) + eps);
}

// Chunk c's values normalised and weighted (g: ones without a weight); in the rotary tail (the
// last len - tail channels, interleaved pairs) rotated by cs(i) = (cos, sin) of pair i.
template <class CosSin>
__device__ __forceinline__ void norm_rope4(float4 u, float4 g, float inv, int64_t c, int64_t tail, CosSin cs,
                                           float (&o)[4]) {
  o[0] = g.x * (u.x * inv);
  o[1] = g.y * (u.y * inv);
  o[2] = g.z * (u.z * inv);
  o[3] = g.w * (u.w * inv);
  if (4 * c >= tail) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 t = cs((4 * c - tail) / 2 + h);
      rope_rotate(o[2 * h], o[2 * h + 1], t.x, t.y);
    }
  }
}

}  // namespace dsv4::cuda::detail
