// One warp per (row, 128-channel block): lanes hold 4 channels each, amax by shuffles.
#include <cuda_fp8.h>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/ops_common.cuh"
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

// The scale of a block whose 128 values the warp holds (any 4 a lane).
__device__ __forceinline__ float block_scale(const float (&v)[4]) { return detail::warp_block_scale(v); }

// Block (r, kb): returns the scale; v[j] = channel kb*128 + lane + 32j (0 beyond `in`).
__device__ __forceinline__ float load_block(const float* x, int64_t r, int64_t kb, int64_t in, int64_t ldx,
                                            float (&v)[4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t k = kb * 128 + lane + 32 * j;
    v[j] = k < in ? x[r * ldx + k] : 0.f;
  }
  return block_scale(v);
}

// Position of value kk (< 128) of a block in order 0 (stored), 1 (mma-packed) or 2 (wgmma B;
// act_quant.h).
__device__ __forceinline__ int block_pos(int kk, int order) {
  if (order == 1) return (kk & 31) / 8 * 32 + kk / 32 * 8 + (kk & 7);
  if (order == 2) return (kk & ~31) + (kk & 1) * 16 + ((kk >> 3) & 3) * 4 + ((kk >> 1) & 3);
  return kk;
}

// kVec (whole 128-blocks, 16-byte aligned rows, order 0 or 1): lane l holds channels 4l .. 4l + 3
// (one float4 load, one 4-byte store of the codes, which are consecutive in both orders);
// otherwise channels l + 32j. The same value math either way.
template <bool kVec>
__device__ __forceinline__ int lane_channel(int lane, int j) {
  return kVec ? 4 * lane + j : lane + 32 * j;
}

template <bool kVec>
__device__ __forceinline__ void load_lane(const float* x, int64_t r, int64_t kb, int64_t in, int64_t ldx, float* v) {
  const int lane = threadIdx.x & 31;
  if constexpr (kVec) {
    const float4 t = *reinterpret_cast<const float4*>(x + r * ldx + kb * 128 + 4 * lane);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = kb * 128 + lane + 32 * j;
      v[j] = k < in ? x[r * ldx + k] : 0.f;
    }
  }
}

// Codes of the lane's values v / s (s a power of two: v * (1 / s) is the same).
template <bool kVec>
__device__ __forceinline__ void store_codes(uint8_t* q, int64_t r, int64_t ldq, int64_t kb, int64_t in, int order,
                                            const float (&v)[4], float s) {
  const int lane = threadIdx.x & 31;
  if constexpr (kVec) {
    *reinterpret_cast<uint32_t*>(q + r * ldq + kb * 128 + block_pos(4 * lane, order)) = detail::codes4(v, s);
  } else {
    const float inv = 1.0f / s;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = kb * 128 + lane + 32 * j;
      if (k < in) q[r * ldq + kb * 128 + block_pos(lane + 32 * j, order)] = to_e4m3(v[j] * inv);
    }
  }
}

template <bool kVec>
__global__ void quant_kernel(const float* __restrict__ x, int64_t rows, int64_t in, int64_t ldx, int64_t rows_pad,
                             uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scales, int64_t kblocks,
                             int order) {
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
  load_lane<kVec>(x, r, kb, in, ldx, v);
  const float s = block_scale(v);
  store_codes<kVec>(q, r, ldq, kb, in, order, v, s);
  if (lane == 0) scales[kb * rows_pad + r] = s;
}

// rms_norm_kernel (ops_norm.cu, its float4 path: the same sum of squares in the same order, the
// same block size, the same normalised floats, stored back into x), then quant_kernel<true> of
// the normalised row (stored order, rows_pad = rows): warp w takes 128-blocks w, w + warps, ...
__global__ void rms_norm_quant_kernel(float* __restrict__ x, const float* __restrict__ gamma, int64_t n, float eps,
                                      int64_t rows, uint8_t* __restrict__ q, int64_t ldq, float* __restrict__ scales) {
  detail::pdl_trigger();  // the GEMV after this one may start pulling its weights
  __shared__ double red[32];
  const int64_t r = blockIdx.x;
  float* xr = x + r * n;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(xr)[i];
    ss += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
  }
  ss = detail::block_sum(ss, red);  // (its barriers order every read of x above before the writes below)
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / n) + eps);
  const int lane = threadIdx.x & 31, warps = blockDim.x / 32;
  for (int64_t kb = threadIdx.x / 32; kb < n / 128; kb += warps) {
    float4 v = reinterpret_cast<const float4*>(xr + kb * 128)[lane];
    const float4 g = gamma ? reinterpret_cast<const float4*>(gamma + kb * 128)[lane] : make_float4(1.f, 1.f, 1.f, 1.f);
    v.x = g.x * (v.x * inv);
    v.y = g.y * (v.y * inv);
    v.z = g.z * (v.z * inv);
    v.w = g.w * (v.w * inv);
    reinterpret_cast<float4*>(xr + kb * 128)[lane] = v;
    const float vals[4] = {v.x, v.y, v.z, v.w};
    const float sc = block_scale(vals);
    store_codes<true>(q, r, ldq, kb, n, 0, vals, sc);
    if (lane == 0) scales[kb * rows + r] = sc;
  }
}

// quant_kernel (no padding rows, stored order) after rotating the RoPE channels of each head
// back in registers: a pair's two channels sit in lanes 2m, 2m + 1 (channel k and k ^ 1).
// kRowTable (a row's blocks a multiple of the block's warps, pairs <= kMaxTablePairs): the block's
// warps share one row, and its (cos, sin) per rotary pair are computed once into shared memory —
// at 64 heads a row's 32 angles had been evaluated 64 times each, per lane (ncu at 256 rows:
// compute-bound at 79% of the SM, DRAM 29%). Same cosf / sinf of the same fp32 angle as
// rope_kernel, so the same bits.
constexpr int kMaxTablePairs = kWarps * 32;
template <bool kRowTable, bool kVec>
__global__ void quant_inverse_rope_kernel(float* __restrict__ x, int64_t rows, int64_t in, int64_t ldx,
                                          InverseRope rope, uint8_t* __restrict__ q, int64_t ldq,
                                          float* __restrict__ scales, int64_t kblocks) {
  detail::pdl_trigger();
  __shared__ float2 table[kRowTable ? kMaxTablePairs : 1];
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (!kRowTable && id >= rows * kblocks) return;  // (kRowTable: every warp of the grid has a block)
  const int64_t r = id / kblocks, kb = id % kblocks;
  const int lane = threadIdx.x & 31;
  const float p = static_cast<float>(rope.pos[r]);
  // Channel within its head without a 64-bit modulo per value: the block's first channel once,
  // then subtraction (a block spans at most 128 / head_len + 1 heads).
  const int hl = static_cast<int>(rope.head_len), tail = hl - 2 * static_cast<int>(rope.pairs);
  const int c0 = static_cast<int>((kb * 128) % rope.head_len);
  float v[4];
  load_lane<kVec>(x, r, kb, in, ldx, v);
  if constexpr (kRowTable) {
    if (threadIdx.x < rope.pairs) {
      const float ang = p * rope.inv_freq[threadIdx.x];  // rope_kernel's fp32 angle
      table[threadIdx.x] = make_float2(cosf(ang), -sinf(ang));
    }
    __syncthreads();
  }
  auto rotation = [&](int c) {  // (cos, -sin) of the pair holding channel c (>= tail)
    if constexpr (kRowTable) return table[(c - tail) / 2];
    const float ang = p * rope.inv_freq[(c - tail) / 2];
    return make_float2(cosf(ang), -sinf(ang));
  };
  if constexpr (kVec) {  // channels c, c + 1 and c + 2, c + 3: two pairs in the lane (c even)
    int c = c0 + 4 * lane;
    while (c >= hl) c -= hl;
    bool rotated = false;
#pragma unroll
    for (int j = 0; j < 4; j += 2)
      if (c + j >= tail) {
        const float2 t = rotation(c + j);
        detail::rope_rotate(v[j], v[j + 1], t.x, t.y);
        rotated = true;
      }
    if (rotated)
      *reinterpret_cast<float4*>(x + r * ldx + kb * 128 + 4 * lane) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = kb * 128 + lane + 32 * j;
      int c = c0 + lane + 32 * j;
      while (c >= hl) c -= hl;
      const float partner = __shfl_xor_sync(0xFFFFFFFFu, v[j], 1);
      if (k < in && c >= tail) {
        const float2 t = rotation(c);
        const bool odd = lane & 1;
        float a = odd ? partner : v[j], b = odd ? v[j] : partner;
        detail::rope_rotate(a, b, t.x, t.y);
        v[j] = odd ? b : a;
        x[r * ldx + k] = v[j];
      }
    }
  }
  const float s = block_scale(v);
  store_codes<kVec>(q, r, ldq, kb, in, 0, v, s);
  if (lane == 0) scales[kb * rows + r] = s;
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

// The float4-per-lane form: whole 128-blocks, 16-byte aligned rows of x, 4-byte aligned code rows.
bool vec_ok(const float* x, int64_t in, int64_t ldx, const uint8_t* q, int64_t ldq) {
  const auto al = [](const void* p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0; };
  return in % 128 == 0 && ldx % 4 == 0 && ldq % 4 == 0 && al(x, 16) && al(q, 4);
}

}  // namespace

void act_quant_fp8(const float* x, int64_t rows, int64_t in, int64_t ldx, int64_t rows_pad, uint8_t* q, int64_t ldq,
                   float* scales, cudaStream_t s, bool mma_packed) {
  DSV4_CHECK(!mma_packed || in % 128 == 0, "act_quant_fp8: the mma-packed order needs whole 128-blocks");
  const int64_t kb = (in + 127) / 128;
  if (rows_pad * kb == 0) return;
  auto* kernel = vec_ok(x, in, ldx, q, ldq) ? quant_kernel<true> : quant_kernel<false>;
  kernel<<<blocks_for(rows_pad * kb), kWarps * 32, 0, s>>>(x, rows, in, ldx, rows_pad, q, ldq, scales, kb,
                                                           mma_packed ? 1 : 0);
  DSV4_CUDA_LAUNCH_CHECK();
}

bool act_quant_fp8_rms_norm(float* x, const float* gamma, float eps, int64_t rows, int64_t n, uint8_t* q, int64_t ldq,
                            float* scales, cudaStream_t s) {
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (rows <= 0 || n % 128 != 0 || ldq % 4 != 0 || !al(x) || (gamma && !al(gamma)) || !al(q)) return false;
  rms_norm_quant_kernel<<<static_cast<unsigned>(rows), detail::row_threads(n), 0, s>>>(x, gamma, n, eps, rows, q, ldq,
                                                                                    scales);
  DSV4_CUDA_LAUNCH_CHECK();
  return true;
}

void act_quant_fp8_wgmma_b(const float* x, int64_t rows, int64_t in, int64_t ldx, uint8_t* q, int64_t ldq,
                           float* scales, cudaStream_t s) {
  DSV4_CHECK(in % 128 == 0, "act_quant_fp8_wgmma_b: needs whole 128-blocks");
  const int64_t kb = in / 128;
  if (rows * kb == 0) return;
  quant_kernel<false><<<blocks_for(rows * kb), kWarps * 32, 0, s>>>(x, rows, in, ldx, rows, q, ldq, scales, kb, 2);
  DSV4_CUDA_LAUNCH_CHECK();
}

void act_quant_fp8_inverse_rope(float* x, int64_t rows, int64_t in, int64_t ldx, const InverseRope& rope, uint8_t* q,
                                int64_t ldq, float* scales, cudaStream_t s) {
  DSV4_CHECK(rope.head_len > 0 && rope.head_len % 2 == 0 && in % rope.head_len == 0 && rope.pairs >= 0 &&
                 2 * rope.pairs <= rope.head_len,
             "act_quant_fp8_inverse_rope: ", in, " channels do not split into heads of ", rope.head_len, " with ",
             rope.pairs, " rotary pairs");
  const int64_t kb = (in + 127) / 128;
  if (rows * kb == 0) return;
  // vec: a lane's 4 channels in one head (head_len % 4 == 0).
  const bool table = kb % kWarps == 0 && rope.pairs <= kMaxTablePairs,
             vec = vec_ok(x, in, ldx, q, ldq) && rope.head_len % 4 == 0;
  auto* kernel = table ? (vec ? quant_inverse_rope_kernel<true, true> : quant_inverse_rope_kernel<true, false>)
                       : (vec ? quant_inverse_rope_kernel<false, true> : quant_inverse_rope_kernel<false, false>);
  kernel<<<blocks_for(rows * kb), kWarps * 32, 0, s>>>(x, rows, in, ldx, rope, q, ldq, scales, kb);
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
