// Device pieces of the mHC kernels shared by ops_mhc.cu (split-K projection + finish) and
// ops_mhc_decode.cu (the one-launch decode form): the same functions, so both give the same bits.
// Only .cu files include this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::mhc {

using detail::bf16x4_to_float4;
using detail::warp_sum;

constexpr int kProjThreads = 128;
constexpr int kMaxN = 4;  // hc_pre: (2+n)n <= 24

// stash[r, ks*(n_out+1) + o] = Σ_{k in slice ks} fn[o, k] X[r, k]; slot n_out holds Σ X[r, k]².
// kProjRows rows per block reuse each fn float4 (4 for batches; 1 at R < 4, where padding rows
// would quadruple the block's reduction tail, which is what a decode step waits for).
// One block (kProjThreads threads) does rows r0.. and slice ks; ends with a barrier-free write of
// the stash (callers synchronise before the stash is read).
template <int MAXO, int kProjRows>
__device__ __forceinline__ void project_slice(const float* fn, const float* X, int64_t R, int64_t nd, int n_out,
                                              int64_t slice4, float* stash, int64_t ld, int64_t r0, int ks) {
  __shared__ float red[kProjThreads / 32][kProjRows][MAXO + 1];
  const int rows = static_cast<int>(std::min<int64_t>(kProjRows, R - r0));
  const int64_t nd4 = nd / 4, b = ks * slice4, e = std::min(nd4, b + slice4);
  const float4* X4 = reinterpret_cast<const float4*>(X) + r0 * nd4;
  const float4* F4 = reinterpret_cast<const float4*>(fn);
  float acc[kProjRows][MAXO + 1];
#pragma unroll
  for (int rr = 0; rr < kProjRows; ++rr)
#pragma unroll
    for (int o = 0; o <= MAXO; ++o) acc[rr][o] = 0.f;
  for (int64_t k = b + threadIdx.x; k < e; k += kProjThreads) {
    float4 xv[kProjRows];
#pragma unroll
    for (int rr = 0; rr < kProjRows; ++rr) {
      xv[rr] = rr < rows ? X4[rr * nd4 + k] : make_float4(0.f, 0.f, 0.f, 0.f);
      acc[rr][MAXO] += xv[rr].x * xv[rr].x + xv[rr].y * xv[rr].y + xv[rr].z * xv[rr].z + xv[rr].w * xv[rr].w;
    }
    // Every output's load is issued unconditionally (outputs past n_out re-read the last row and
    // are never stored): behind an `o < n_out` branch the 24 loads went out one after another,
    // each waiting for the previous one's DRAM round trip (~14 us per decode call).
    float4 f[MAXO];
#pragma unroll
    for (int o = 0; o < MAXO; ++o) f[o] = __ldg(F4 + min(o, n_out - 1) * nd4 + k);
#pragma unroll
    for (int o = 0; o < MAXO; ++o)
#pragma unroll
      for (int rr = 0; rr < kProjRows; ++rr)
        acc[rr][o] += f[o].x * xv[rr].x + f[o].y * xv[rr].y + f[o].z * xv[rr].z + f[o].w * xv[rr].w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int rr = 0; rr < kProjRows; ++rr)
#pragma unroll
    for (int o = 0; o <= MAXO; ++o) {
      const float v = warp_sum(acc[rr][o]);
      if (lane == 0) red[warp][rr][o] = v;
    }
  __syncthreads();
  for (int t = threadIdx.x; t < kProjRows * (MAXO + 1); t += kProjThreads) {
    const int rr = t / (MAXO + 1), o = t % (MAXO + 1);
    if (rr >= rows || (o >= n_out && o != MAXO)) continue;
    float v = 0.f;
    for (int w = 0; w < kProjThreads / 32; ++w) v += red[w][rr][o];
    stash[(r0 + rr) * ld + ks * (n_out + 1) + (o == MAXO ? n_out : o)] = v;
  }
}

// Asks L2 for slice ks of every projection row (thread o < n_out: row o): what project_slice
// reads of fn, so that a kernel launched as a dependent (pdl.cuh) fetches it before its wait.
__device__ __forceinline__ void prefetch_fn_slice(const float* fn, int64_t nd, int n_out, int64_t slice4, int ks) {
  const int64_t b = ks * slice4, e = std::min(nd / 4, b + slice4);
  const int o = threadIdx.x;
  if (o < n_out && e > b) detail::prefetch_l2_span(fn + o * nd + 4 * b, static_cast<uint32_t>(16 * (e - b)));
}

// Reduces the slices of the stash into mu[0..n_out]: warp w takes outputs w, w + 8, ..., its
// lanes the slices (a fixed shuffle tree: deterministic). One thread per output walking ~30
// slices serially was a chain of dependent L2 loads, ~15 us of every decode hc_pre. Must be
// followed by a barrier before mu is read or the stash (the output row) is overwritten.
// kPerWarp: outputs per warp whose loads are in flight together. 4 for the 8-warp finish
// kernels (8 there took prefill hc_pre from ~270 to ~340 us per 4096-row call: 26 of 64 slots
// used, twice the registers); 8 for the 4-warp decode kernel (25 outputs in one round). The
// sums do not depend on it (same bits).
template <int kPerWarp = 4>
__device__ inline void gather_mu(const float* stash, int n_out, int ksplit, float* mu) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int o0 = threadIdx.x >> 5; o0 <= n_out; o0 += warps * kPerWarp) {
    // Every slice of kPerWarp outputs is loaded before any is summed (ksplit <= 4 x 32 in
    // practice; the loop below covers more): one L2 round trip instead of one per output.
    float part[kPerWarp][4];
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int o = o0 + i * warps;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int ks = lane + 32 * j;
        part[i][j] = o <= n_out && ks < ksplit ? __ldcg(stash + ks * (n_out + 1) + o) : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int o = o0 + i * warps;
      float v = ((part[i][0] + part[i][1]) + part[i][2]) + part[i][3];
      if (o <= n_out)
        for (int ks = lane + 128; ks < ksplit; ks += 32) v += __ldcg(stash + ks * (n_out + 1) + o);
      v = warp_sum(v);
      if (lane == 0 && o <= n_out) mu[o] = v;
    }
  }
}

__device__ inline float rms_factor(float ss, int64_t nd, float eps) {
  return 1.0f / sqrtf(static_cast<float>(static_cast<double>(ss) / nd) + eps);
}

// Twin of dsv4::sinkhorn, one matrix element per lane (lane = j*n + k < n*n; the whole warp
// must call it). Every sum gathers its n terms by shuffles and adds them in the CPU's order,
// so the result has the same bits as the serial loop; the matrix never leaves registers (the
// former one-thread version kept it in local memory and took ~60 us at n = 4, 20 iterations).
// N > 0: n == N at compile time, so every sum's shuffles are unrolled and in flight together (a
// runtime-bounded loop issued them one after another: the chain is ~40 dependent sums).
template <int N>
__device__ __forceinline__ float sinkhorn_warp_n(float m, int n_rt, int iters, float eps) {
  const int n = N > 0 ? N : n_rt;
  const int lane = threadIdx.x & 31;
  const int j = lane / n, k = lane % n;
  const int row0 = (j * n) & 31;  // lanes past n*n compute garbage that is never stored
  float mx = __shfl_sync(0xFFFFFFFFu, m, row0);
#pragma unroll
  for (int c = 1; c < n; ++c) mx = fmaxf(mx, __shfl_sync(0xFFFFFFFFu, m, (row0 + c) & 31));
  const float e = expf(m - mx);
  float s = 0;
#pragma unroll
  for (int c = 0; c < n; ++c) s += __shfl_sync(0xFFFFFFFFu, e, (row0 + c) & 31);
  m = e / s + eps;
  for (int it = 0; it < max(iters, 1); ++it) {  // the CPU twin always normalises columns once
    if (it > 0) {  // row normalise (the first round's rows came from the softmax)
      s = 0;
#pragma unroll
      for (int c = 0; c < n; ++c) s += __shfl_sync(0xFFFFFFFFu, m, (row0 + c) & 31);
      m /= (s + eps);
    }
    s = 0;
#pragma unroll
    for (int r = 0; r < n; ++r) s += __shfl_sync(0xFFFFFFFFu, m, (r * n + k) & 31);
    m /= (s + eps);
  }
  return m;
}

__device__ inline float sinkhorn_warp(float m, int n, int iters, float eps) {
  return n == 4 ? sinkhorn_warp_n<4>(m, n, iters, eps) : sinkhorn_warp_n<0>(m, n, iters, eps);
}

// The streams X as stored: fp32, or bf16 bits (Fast precision past 4 rows keeps them as bf16,
// as the official keeps its residual). A float4 column of them: float4, or 4 bf16 in a uint2.
__device__ __forceinline__ const float4* stream4(const float* X) { return reinterpret_cast<const float4*>(X); }
__device__ __forceinline__ const uint2* stream4(const uint16_t* X) { return reinterpret_cast<const uint2*>(X); }
__device__ __forceinline__ float4* stream4(float* X) { return reinterpret_cast<float4*>(X); }
__device__ __forceinline__ uint2* stream4(uint16_t* X) { return reinterpret_cast<uint2*>(X); }
__device__ __forceinline__ float4 widen4(float4 v) { return v; }
__device__ __forceinline__ float4 widen4(uint2 v) { return bf16x4_to_float4(v); }
// v as a stream of type T holds it: itself, or rounded to bf16 (nearest even).
template <typename T>
__device__ __forceinline__ float4 as_stored(float4 v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return make_float4(__bfloat162float(__float2bfloat16_rn(v.x)), __bfloat162float(__float2bfloat16_rn(v.y)),
                       __bfloat162float(__float2bfloat16_rn(v.z)), __bfloat162float(__float2bfloat16_rn(v.w)));
  }
}
__device__ __forceinline__ void put4(float4* p, float4 v) { *p = v; }
__device__ __forceinline__ void put4(uint2* p, float4 v) {  // v: already as_stored<uint16_t>
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  *p = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// Float4 column c of Σ_i coef[i] X[i] (coef in shared memory): the first MAXN streams' loads
// issued together before the sums (a loop bounded by the runtime n issued them one after
// another: ncu at 4096 rows, half of the stalls on the load scoreboard), any further ones after
// (kTail; without it n <= MAXN).
// Σ_{i < min(n, MAXN)} coef[i] x[i], in stream order.
template <int MAXN, typename N>
__device__ __forceinline__ float4 mix_values(const float4 (&x)[MAXN], const float* coef, N n) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < MAXN; ++i) {
    if (i >= n) break;
    const float p = coef[i];
    acc.x += p * x[i].x;
    acc.y += p * x[i].y;
    acc.z += p * x[i].z;
    acc.w += p * x[i].w;
  }
  return acc;
}

template <int MAXN, bool kTail = true, typename N, typename V>
__device__ __forceinline__ float4 mix_column(const V* X4, const float* coef, N n, int64_t d4, int64_t c) {
  float4 x[MAXN];
#pragma unroll
  for (int i = 0; i < MAXN; ++i) x[i] = i < n ? widen4(X4[i * d4 + c]) : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 acc = mix_values<MAXN>(x, coef, n);
  if constexpr (kTail) {
    for (int64_t i = MAXN; i < n; ++i) {  // the head's wider n (hc_head allows up to 24)
      const float4 xi = widen4(X4[i * d4 + c]);
      const float p = coef[i];
      acc.x += p * xi.x;
      acc.y += p * xi.y;
      acc.z += p * xi.z;
      acc.w += p * xi.w;
    }
  }
  return acc;
}

// hc_post's sub-layer output at float4 column c of row r: F, plus F2 (the routed experts' sum
// beside the shared expert's output), or that sum made from the routed rows (combine_kernel<4>'s
// loop in moe.cu: the same floats).
// Float4 column c of routed row `slot` (fp32 or bf16 rows).
__device__ __forceinline__ float4 routed_row4(const RoutedRows& rt, int64_t slot, int64_t d4, int64_t c) {
  if (rt.Y16) return bf16x4_to_float4(reinterpret_cast<const uint2*>(rt.Y16 + slot * 4 * d4)[c]);
  return reinterpret_cast<const float4*>(rt.Y + slot * 4 * d4)[c];
}

// g += w y: one routed row's term of the weighted sum (post_input and post_sum: the same floats).
__device__ __forceinline__ void add_weighted(float (&g)[4], float w, float4 y) {
  g[0] += w * y.x;
  g[1] += w * y.y;
  g[2] += w * y.z;
  g[3] += w * y.w;
}

__device__ __forceinline__ float4 post_input(const float* F, const float* F2, const RoutedRows& rt, int64_t r,
                                             int64_t d4, int64_t c) {
  float4 f = reinterpret_cast<const float4*>(F)[r * d4 + c];
  if (F2) {
    const float4 g = reinterpret_cast<const float4*>(F2)[r * d4 + c];
    f = make_float4(f.x + g.x, f.y + g.y, f.z + g.z, f.w + g.w);
  } else if (rt.any()) {
    float g[4] = {};
    for (int k = 0; k < rt.K; ++k) {
      const int e = rt.experts[r * rt.K + k];
      if (e < 0 || e >= rt.E) continue;
      const float w = rt.weights[r * rt.K + k];
      add_weighted(g, w, routed_row4(rt, r * rt.K + k, d4, c));
    }
    f = make_float4(f.x + g[0], f.y + g[1], f.z + g[2], f.w + g[3]);
  }
  return f;
}

// post_input in two halves, for kernels that issue one step's loads before they use the last
// one's (ops_mhc_post_project_tiled.cu): the loads of float4 column c, then post_input's sum of
// them (the same floats, in its order). The routed slots of a row (a valid mask, the weights into
// w[0, K) when w is given) are read once per row; up to kMaxRoutedK of them.
constexpr int kMaxRoutedK = 6;  // every DeepSeek-V4 config routes 6 a token
// kY16: the routed rows are bf16 (RoutedRows::Y16), held as loaded and widened in post_sum.
template <bool kY16>
struct PostLoads {
  float4 f;
  std::conditional_t<kY16, uint2, float4> y[kMaxRoutedK];  // !kY16: y[0] is F2's column when there is an F2
};

__device__ __forceinline__ uint32_t post_row(const RoutedRows& rt, int64_t r, float* w) {
  uint32_t valid = 0;
  if (!rt.any()) return valid;
#pragma unroll
  for (int k = 0; k < kMaxRoutedK; ++k) {
    if (k >= rt.K) break;
    const int e = rt.experts[r * rt.K + k];
    const bool ok = e >= 0 && e < rt.E;
    valid |= ok ? 1u << k : 0u;
    if (w) w[k] = ok ? rt.weights[r * rt.K + k] : 0.f;
  }
  return valid;
}

template <bool kY16>
__device__ __forceinline__ void post_load(PostLoads<kY16>& l, const float* F, const float* F2, const RoutedRows& rt,
                                          uint32_t valid, int64_t r, int64_t d4, int64_t c) {
  l.f = reinterpret_cast<const float4*>(F)[r * d4 + c];
  if constexpr (!kY16)
    if (F2) l.y[0] = reinterpret_cast<const float4*>(F2)[r * d4 + c];
#pragma unroll
  for (int k = 0; k < kMaxRoutedK; ++k) {
    if (!(valid >> k & 1u)) continue;
    const int64_t row = (r * rt.K + k) * 4 * d4;
    if constexpr (kY16)
      l.y[k] = reinterpret_cast<const uint2*>(rt.Y16 + row)[c];
    else
      l.y[k] = reinterpret_cast<const float4*>(rt.Y + row)[c];
  }
}

template <bool kY16>
__device__ __forceinline__ float4 post_sum(const PostLoads<kY16>& l, uint32_t valid, const float* w, bool has_f2,
                                           bool routed) {
  float4 f = l.f;
  if constexpr (!kY16)
    if (has_f2) return make_float4(f.x + l.y[0].x, f.y + l.y[0].y, f.z + l.y[0].z, f.w + l.y[0].w);
  if (routed) {
    float g[4] = {};
#pragma unroll
    for (int k = 0; k < kMaxRoutedK; ++k) {
      if (!(valid >> k & 1u)) continue;
      if constexpr (kY16)
        add_weighted(g, w[k], bf16x4_to_float4(l.y[k]));
      else
        add_weighted(g, w[k], l.y[k]);
    }
    f = make_float4(f.x + g[0], f.y + g[1], f.z + g[2], f.w + g[3]);
  }
  return f;
}

// Stream k of hc_post's new row at one float4 column: post_k f + Σ_j comb[j][k] old_j (P: the
// row's comb, old: the n old streams at the column). The rounding is spelled out (a product,
// then one fma a stream) so that every kernel that makes the streams gives the same bits: left
// to contraction, pk f + c0 old0 may become fma(pk, f, c0 old0) in one kernel and not another.
template <int MAXN>
__device__ __forceinline__ float4 post_stream(float4 f, float pk, const float* P, int k, int n,
                                              const float4 (&old)[MAXN]) {
  float4 acc = make_float4(__fmul_rn(pk, f.x), __fmul_rn(pk, f.y), __fmul_rn(pk, f.z), __fmul_rn(pk, f.w));
#pragma unroll
  for (int j = 0; j < MAXN; ++j) {
    if (j < n) {
      const float cj = P[j * n + k];
      acc.x = __fmaf_rn(cj, old[j].x, acc.x);
      acc.y = __fmaf_rn(cj, old[j].y, acc.y);
      acc.z = __fmaf_rn(cj, old[j].z, acc.z);
      acc.w = __fmaf_rn(cj, old[j].w, acc.w);
    }
  }
  return acc;
}

// out[c] = mix_column(c) for the float4 columns [c0, c1) of one row.
template <int MAXN, typename XT>
__device__ inline void mix_slice(const XT* X, const float* coef, int64_t n, int64_t d, int64_t c0, int64_t c1,
                                 float* out) {
  const auto* X4 = stream4(X);
  float4* O4 = reinterpret_cast<float4*>(out);
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) O4[c] = mix_column<MAXN>(X4, coef, n, d / 4, c);
}

}  // namespace dsv4::cuda::mhc
