// Device helpers shared by the op kernels: warp/block reductions with a fixed summation order
// (so results do not depend on scheduling), order-preserving float keys for radix selection.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda::detail {

constexpr unsigned kFull = 0xffffffffu;

// A grid holds at most 65535 blocks in y and z: an op whose grid puts rows there (attention,
// indexer, hc_post) runs over row ranges of at most this many (a 65536-token prefill, or the
// context fill of 256 sequences x 512 tokens, is one call).
constexpr int64_t kMaxGridRows = 65535;
// f(r0, n) for consecutive row ranges [r0, r0 + n) covering [0, R), n <= kMaxGridRows.
template <typename F>
void for_row_ranges(int64_t R, F&& f) {
  for (int64_t r0 = 0; r0 < R; r0 += kMaxGridRows) f(r0, R - r0 < kMaxGridRows ? R - r0 : kMaxGridRows);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// Sum over the block, returned to every thread. scratch: >= 32 elements of shared memory.
// Warp sums are added in warp order by every thread: deterministic for a fixed block size.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = 0;
  const int nw = (blockDim.x + 31) >> 5;
  for (int w = 0; w < nw; ++w) r += scratch[w];
  return r;
}

// Monotone map float -> uint32 (larger float, larger key); -0 maps like +0 so that the two
// zeros tie, as they do under the CPU's float comparisons.
__device__ __forceinline__ uint32_t float_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Warp-wide argmax of (bv, bi) pairs, ties to the lower index; every lane ends with the winner.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (ov > bv || (ov == bv && oi < bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

// One interleaved RoPE pair (a, b) rotated by the angle whose cosine / sine are c / s (s negated
// for the inverse): the products and sums rounded one by one (no fma contraction), so that every
// kernel that rotates (rope, q/kv-norm + RoPE, the quantisation fused with the inverse) gives the
// same bits, and the CPU twin's mul / sub order.
__device__ __forceinline__ void rope_rotate(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Four bf16 (as bits, element 0 lowest) in fp32: exact.
__device__ __forceinline__ float4 bf16x4_to_float4(uint2 u) {
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xFFFF0000u));
}

// Threads of the one-block-per-row norm kernels (rms_norm, rms_norm_rope, the fused norm +
// quantisation of act_quant.cu): their sums of squares run in the same order.
inline int row_threads(int64_t n) { return n >= 1024 ? 256 : 128; }

// Multiprocessor count of the current device (queried once): sizes split-K / split-KV grids.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      v = 132;
    return v;
  }();
  return n;
}

}  // namespace dsv4::cuda::detail
