// The per-128-block FP8 activation quantisation of the official demo, as device functions shared
// by act_quant.cu and the kernels that quantise their own input or output (gemv_fp8_mma.cu,
// ops_attention_wgmma.cu): the scale is
// 2^ceil(log2(amax/448)) with amax floored at 1e-4, taken exactly from the fp32 bits, and codes
// are e4m3(clamp(x / s, ±448)) (x / s is exact: s is a power of two). Only .cu files include it.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda::detail {

__device__ __forceinline__ float pow2_scale(float amax) {
  const float t = fmaxf(amax, 1e-4f) / 448.0f;
  const int bits = __float_as_int(t);
  int e = ((bits >> 23) & 0xFF) - 127;
  if (bits & 0x7FFFFF) ++e;
  return __int_as_float((e + 127) << 23);
}

__device__ __forceinline__ uint8_t to_e4m3(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(fminf(fmaxf(v, -448.f), 448.f), __NV_SATFINITE, __NV_E4M3));
}

// The scale of a 128-value block that a warp holds, 4 values a lane (amax by shuffles).
__device__ __forceinline__ float warp_block_scale(const float (&v)[4]) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = fmaxf(amax, fabsf(v[j]));
#pragma unroll
  for (int m = 16; m; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
  return pow2_scale(amax);
}

// The codes of 4 consecutive values v / s (s a power of two: v * (1 / s) is the same), packed
// first value lowest: one 4-byte store.
__device__ __forceinline__ uint32_t codes4(const float (&v)[4], float s) {
  const float inv = 1.0f / s;
  return uint32_t(to_e4m3(v[0] * inv)) | uint32_t(to_e4m3(v[1] * inv)) << 8 | uint32_t(to_e4m3(v[2] * inv)) << 16 |
         uint32_t(to_e4m3(v[3] * inv)) << 24;
}

}  // namespace dsv4::cuda::detail
