// Routed experts on tensor cores at decode sizes (see moe_tiles.cuh). A CTA of 8 warps owns 16
// output rows of one expert tile; the warps split K and reduce in shared memory in warp order
// (deterministic). Fragment mapping of mma.m16n8k16 (g = lane / 4, q = lane % 4): rows g and g+8
// of the weight tile, token column g. The k order inside one mma is free as long as A and B
// agree, so thread q takes the 8 elements [8q, 8q + 8) of each 32-group (4 bytes of FP4, 8 FP8
// activation codes) and feeds the even ones to k-step 0, the odd ones to k-step 1: both k-steps
// of a group then cover exactly that group, whose scale is applied to the fresh accumulator.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/check.h"
#include "backend/cuda/mma_f16.cuh"
#include "backend/cuda/moe_tiles.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kSplitWarps = 8;  // K slices per CTA: 1-token tiles need the parallelism
constexpr float kE2m1Unscale = 16384.f;  // the f16 trick below stores e2m1 values × 2^-14

// Eight e2m1 (element 2j in the low nibble of byte j) -> f16x2 (e0,e2) (e4,e6) (e1,e3) (e5,e7),
// each value × 2^-14 exactly (the magnitude bits become f16 exponent/mantissa bits).
__device__ __forceinline__ void e2m1x8_f16(uint32_t w, uint32_t (&h)[4]) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
  const uint32_t p[4] = {__byte_perm(lo, 0, 0x4140), __byte_perm(lo, 0, 0x4342), __byte_perm(hi, 0, 0x4140),
                         __byte_perm(hi, 0, 0x4342)};
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = ((p[i] << 9) & 0x0E000E00u) | ((p[i] << 12) & 0x80008000u);
}

// Eight e4m3 codes c0..c7 -> f16x2 (c0,c2) (c4,c6) (c1,c3) (c5,c7): the same order as the weights.
__device__ __forceinline__ void e4m3x8_f16(uint2 c, uint32_t (&h)[4]) {
  const uint32_t ev = __byte_perm(c.x, c.y, 0x6420), od = __byte_perm(c.x, c.y, 0x7531);
  h[0] = e4m3x2_f16(ev);
  h[1] = e4m3x2_f16(ev >> 16);
  h[2] = e4m3x2_f16(od);
  h[3] = e4m3x2_f16(od >> 16);
}

__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// The activation operand: token column g's codes (row-major, ld = K of the weight) and the
// per-128-block scales of the thread's two C columns.
struct TokenOperand {
  const uint8_t* codes;  // row of token g, offset 8q; nullptr: no token in this column
  const float* s0;       // scales of column 2q / 2q+1: s[kb * ld]
  const float* s1;
  int64_t ld_s;
};

// acc[i] += Σ_k W[row_i, k] x[col_i, k] over 128-blocks [kb0, kb1) (unscaled by 2^14).
__device__ __forceinline__ void rows_times_tile(const DevWeight& w, int64_t r0, const TokenOperand& x, int64_t kb0,
                                                int64_t kb1, float (&acc)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t rb = w.in / 2;
  const uint8_t* pa = w.data + (r0 + g) * rb + 4 * q;
  const uint8_t* pb = pa + 8 * rb;
  const uint8_t* sa = w.scale + (r0 + g) * w.scale_cols;
  const uint8_t* sb = sa + 8 * w.scale_cols;
#pragma unroll 2
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    uint32_t wa[4], wb[4];
    uint2 xc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t grp = kb * 4 + j;
      wa[j] = ld32(pa + grp * 16);
      wb[j] = ld32(pb + grp * 16);
      xc[j] = x.codes ? __ldg(reinterpret_cast<const uint2*>(x.codes + grp * 32)) : make_uint2(0u, 0u);
    }
    const uint32_t ea = ld32(sa + kb * 4), eb = ld32(sb + kb * 4);  // E8M0 of the block's 4 groups
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t A[4], B[4], X[4];
      e2m1x8_f16(wa[j], A);
      e2m1x8_f16(wb[j], B);
      e4m3x8_f16(xc[j], X);
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      mma16816(c, A[0], B[0], A[1], B[1], X[0], X[1]);  // even elements of the thread's slice
      mma16816(c, A[2], B[2], A[3], B[3], X[2], X[3]);  // odd elements
      const float s_a = e8m0_dev(static_cast<uint8_t>(ea >> (8 * j))), s_b = e8m0_dev(static_cast<uint8_t>(eb >> (8 * j)));
      blk[0] += c[0] * s_a;
      blk[1] += c[1] * s_a;
      blk[2] += c[2] * s_b;
      blk[3] += c[3] * s_b;
    }
    const float x0 = __ldg(x.s0 + kb * x.ld_s), x1 = __ldg(x.s1 + kb * x.ld_s);
    acc[0] += blk[0] * x0;
    acc[1] += blk[1] * x1;
    acc[2] += blk[2] * x0;
    acc[3] += blk[3] * x1;
  }
}

// Sums the warps' partials in warp order into warp 0's registers; false for the other warps.
template <int N>
__device__ __forceinline__ bool reduce_split(float (&acc)[N][4], float (*red)[N][4][32]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][n][i][lane] = acc[n][i];
  __syncthreads();
  if (warp != 0) return false;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = red[0][n][i][lane];
      for (int w = 1; w < kSplitWarps; ++w) v += red[w][n][i][lane];
      acc[n][i] = v;
    }
  return true;
}

__device__ __forceinline__ float swiglu_clamped(float g, float v, float limit) {
  if (limit > 0.f) {
    g = fminf(g, limit);
    v = fminf(fmaxf(v, -limit), limit);
  }
  return g / (1.f + expf(-g)) * v;
}

__global__ void __launch_bounds__(kSplitWarps * 32)
    gateup_mma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                      const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                      const uint8_t* __restrict__ xq, const float* __restrict__ xs, int64_t ldxs, int64_t d, int64_t I,
                      float limit, float* __restrict__ H) {
  __shared__ float red[kSplitWarps][2][4][32];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16;
  auto row_of = [&](int col) { return static_cast<int64_t>(slot_pair[t.start + (col < t.count ? col : 0)] / K); };
  const TokenOperand x{g < t.count ? xq + row_of(g) * d + 8 * q : nullptr, xs + row_of(2 * q), xs + row_of(2 * q + 1),
                       ldxs};
  const int64_t nkb = d / 128, kb0 = warp * nkb / kSplitWarps, kb1 = (warp + 1) * nkb / kSplitWarps;
  float acc[2][4] = {};
  rows_times_tile(tab[3 * t.expert], r0, x, kb0, kb1, acc[0]);
  rows_times_tile(tab[3 * t.expert + 2], r0, x, kb0, kb1, acc[1]);
  if (!reduce_split<2>(acc, red)) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 2 * q + (i & 1);
    if (col < t.count)
      H[static_cast<int64_t>(t.start + col) * I + r0 + g + (i >= 2 ? 8 : 0)] =
          swiglu_clamped(acc[0][i] * kE2m1Unscale, acc[1][i] * kE2m1Unscale, limit);
  }
}

__global__ void __launch_bounds__(kSplitWarps * 32)
    down_mma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                    const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                    const uint8_t* __restrict__ hq, const float* __restrict__ hs, int64_t ldhs, int64_t d, int64_t I,
                    float* __restrict__ Y) {
  __shared__ float red[kSplitWarps][1][4][32];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16;
  auto slot_of = [&](int col) { return static_cast<int64_t>(t.start + (col < t.count ? col : 0)); };
  const TokenOperand x{g < t.count ? hq + slot_of(g) * I + 8 * q : nullptr, hs + slot_of(2 * q),
                       hs + slot_of(2 * q + 1), ldhs};
  const int64_t nkb = I / 128, kb0 = warp * nkb / kSplitWarps, kb1 = (warp + 1) * nkb / kSplitWarps;
  float acc[1][4] = {};
  rows_times_tile(tab[3 * t.expert + 1], r0, x, kb0, kb1, acc[0]);
  if (!reduce_split<1>(acc, red)) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 2 * q + (i & 1);
    if (col < t.count)
      Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + r0 + g + (i >= 2 ? 8 : 0)] = acc[0][i] * kE2m1Unscale;
  }
}

}  // namespace

bool mma_experts_ok(const DevWeight* host_tab, int n, int64_t d, int64_t I) {
  if (d % 128 != 0 || I % 128 != 0) return false;
  for (int i = 0; i < n; ++i) {
    const DevWeight& w = host_tab[i];
    if (w.fmt != kFP4 || w.scale_f32 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(w.scale) % 4 != 0)
      return false;
  }
  return true;
}

void mma_gateup(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                int64_t I, float limit, float* H, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(I / 16), max_tiles);
  gateup_mma_kernel<<<grid, kSplitWarps * 32, 0, s>>>(tab, tiles, n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
  DSV4_CUDA_LAUNCH_CHECK();
}

void mma_down(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
              const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
              float* Y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(d / 16), max_tiles);
  down_mma_kernel<<<grid, kSplitWarps * 32, 0, s>>>(tab, tiles, n_tiles, slot_pair, hq, hs, ldhs, d, I, Y);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
