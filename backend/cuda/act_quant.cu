// One warp per (row, 128-channel block): lanes hold 4 channels each, amax by shuffles.
#include <cuda_fp8.h>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda {
namespace {

using detail::pow2_scale;
using detail::to_e4m3;

constexpr int kWarps = 8;

__device__ __forceinline__ float from_e4m3(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// Block (r, kb): returns the scale; v[j] = channel kb*128 + lane + 32j (0 beyond `in`).
__device__ __forceinline__ float load_block(const float* x, int64_t r, int64_t kb, int64_t in, int64_t ldx,
                                            float* v) {
  const int lane = threadIdx.x & 31;
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = kb * 128 + lane + 32 * j;
    v[j] = k < in ? x[r * ldx + k] : 0.f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
#pragma unroll
  for (int m = 16; m; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));
  return pow2_scale(amax);
}

// Position of value kk (< 128) of a block: itself, or the mma-packed order (act_quant.h).
__device__ __forceinline__ int block_pos(int kk, bool packed) {
  return packed ? (kk & 31) / 8 * 32 + kk / 32 * 8 + (kk & 7) : kk;
}

__global__ void quant_kernel(const float* __restrict__ x, int64_t rows, int64_t in, int64_t ldx, int64_t rows_pad,
                             uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scales, int64_t kblocks,
                             bool packed) {
  detail::pdl_trigger();  // the GEMV / expert kernel after this one may start pulling its weights
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (id >= rows_pad * kblocks) return;
  const int64_t r = id / kblocks, kb = id % kblocks;
  const int lane = threadIdx.x & 31;
  if (r >= rows) {
    for (int j = 0; j < 4; ++j) {
      const int64_t k = kb * 128 + lane + 32 * j;
      if (k < in) q[r * ldq + k] = 0;
    }
    if (lane == 0) scales[kb * rows_pad + r] = 1.f;
    return;
  }
  float v[4];
  const float s = load_block(x, r, kb, in, ldx, v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = kb * 128 + lane + 32 * j;
    if (k < in) q[r * ldq + kb * 128 + block_pos(lane + 32 * j, packed)] = to_e4m3(v[j] / s);
  }
  if (lane == 0) scales[kb * rows_pad + r] = s;
}

// Position of value kk (< 128) of a block in the wgmma operand order (act_quant.h).
__device__ __forceinline__ int wgmma_pos(int kk) {
  const int u = kk & 7;
  return (kk & ~31) + 16 * (u >> 2) + 8 * ((u >> 1) & 1) + 2 * ((kk >> 3) & 3) + (u & 1);
}

__global__ void quant_bf16_kernel(const float* __restrict__ x, int64_t rows, int64_t ldx, __nv_bfloat16* __restrict__ y,
                                  int64_t ldy, int64_t kblocks) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (id >= rows * kblocks) return;
  const int64_t r = id / kblocks, kb = id % kblocks;
  float v[4];
  const float s = load_block(x, r, kb, kblocks * 128, ldx, v);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    y[r * ldy + kb * 128 + wgmma_pos(lane + 32 * j)] = __float2bfloat16_rn(from_e4m3(to_e4m3(v[j] / s)) * s);
}

__global__ void fake_quant_kernel(const float* x, int64_t rows, int64_t in, int64_t ldx, float* y, int64_t ldy,
                                  int64_t kblocks) {
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (id >= rows * kblocks) return;
  const int64_t r = id / kblocks, kb = id % kblocks;
  float v[4];
  const float s = load_block(x, r, kb, in, ldx, v);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = kb * 128 + lane + 32 * j;
    if (k < in) y[r * ldy + k] = from_e4m3(to_e4m3(v[j] / s)) * s;
  }
}

unsigned blocks_for(int64_t warps) { return static_cast<unsigned>((warps + kWarps - 1) / kWarps); }

}  // namespace

void act_quant_fp8(const float* x, int64_t rows, int64_t in, int64_t ldx, int64_t rows_pad, uint8_t* q, int64_t ldq,
                   float* scales, cudaStream_t s, bool mma_packed) {
  DSV4_CHECK(!mma_packed || in % 128 == 0, "act_quant_fp8: the mma-packed order needs whole 128-blocks");
  const int64_t kb = (in + 127) / 128;
  if (rows_pad * kb == 0) return;
  quant_kernel<<<blocks_for(rows_pad * kb), kWarps * 32, 0, s>>>(x, rows, in, ldx, rows_pad, q, ldq, scales, kb,
                                                                 mma_packed);
  DSV4_CUDA_LAUNCH_CHECK();
}

void act_quant_bf16_wgmma(const float* x, int64_t rows, int64_t in, int64_t ldx, __nv_bfloat16* y, int64_t ldy,
                          cudaStream_t s) {
  DSV4_CHECK(in % 128 == 0, "act_quant_bf16_wgmma: needs whole 128-blocks");
  const int64_t kb = in / 128;
  if (rows * kb == 0) return;
  quant_bf16_kernel<<<blocks_for(rows * kb), kWarps * 32, 0, s>>>(x, rows, ldx, y, ldy, kb);
  DSV4_CUDA_LAUNCH_CHECK();
}

void act_fake_quant_fp8(const float* x, int64_t rows, int64_t in, int64_t ldx, float* y, int64_t ldy, cudaStream_t s) {
  const int64_t kb = (in + 127) / 128;
  if (rows * kb == 0) return;
  fake_quant_kernel<<<blocks_for(rows * kb), kWarps * 32, 0, s>>>(x, rows, in, ldx, y, ldy, kb);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
