// The per-128-block FP8 activation quantisation of the official demo, as device functions shared
// by act_quant.cu and the kernels that quantise their own input (gemv_fp8_mma.cu): the scale is
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

}  // namespace dsv4::cuda::detail
