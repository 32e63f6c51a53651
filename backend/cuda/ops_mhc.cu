// mHC kernels (twin: model/mhc.cpp). The projection mu = fn · X_r of every row is a skinny GEMM
// ([R, n·d] × [n·d, (2+n)n]); it is split over K so that decode batches still fill the GPU:
// kernel 1 writes per-slice partial sums (and Σx² for the RMS factor) into a stash; kernel 2
// reduces the slices in a fixed order and, over a grid of (row, channel slice) blocks, writes the
// mixed row, while one extra block per row runs the gates and Sinkhorn (a serial ~3 µs chain that
// one block per row used to run before mixing all 4 streams alone: ~19 µs per decode hc_pre).
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

using detail::ceil_div;
using detail::cp_async16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::sm_count;
using detail::sigmoidf_;
using detail::warp_sum;

namespace {

constexpr int kProjThreads = 128;

// stash[r, ks*(n_out+1) + o] = Σ_{k in slice ks} fn[o, k] X[r, k]; slot n_out holds Σ X[r, k]².
// kProjRows rows per block reuse each fn float4 (4 for batches; 1 at R < 4, where padding rows
// would quadruple the block's reduction tail, which is what a decode step waits for).
template <int MAXO, int kProjRows>
__global__ void __launch_bounds__(kProjThreads)
    hc_project_kernel(const float* fn, const float* X, int64_t R, int64_t nd, int n_out, int64_t slice4, float* stash,
                      int64_t ld) {
  __shared__ float red[kProjThreads / 32][kProjRows][MAXO + 1];
  const int64_t r0 = blockIdx.x * int64_t(kProjRows);
  const int ks = blockIdx.y;
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

// hc_project_kernel's stash for batches (R >= kTileMinRows): a block takes kTileRows rows and one
// K slice and stages both operands through shared memory, so that every fn value read from L2
// serves 128 rows (the per-row kernel re-read all of fn from L2 for every 4 rows: 1.6 GB per
// 4096-row call, which bounded it). Thread (row r, output group og) holds rows r + 32 i (i < 4)
// of outputs og * TO .. + TO; group 0 also sums x². Two cp.async stages of kTileK columns.
constexpr int kTileRows = 128, kTileK = 32, kTilePitch = kTileK + 4, kTileMinRows = 256;
constexpr int kTileGroups = 8, kTileRowThreads = kTileRows / 4;
static_assert(kTileRowThreads * kTileGroups == 256, "one thread per (row thread, output group)");

template <int TO>
struct TileSmem {
  float x[2][kTileRows][kTilePitch];  // rows 16 B apart in banks: a load's 4 rows do not conflict
  float f[2][kTileGroups * TO][kTilePitch];
};

template <int TO>
__global__ void __launch_bounds__(256, 2)  // 3 per SM spills at TO = 3
    hc_project_tiled_kernel(const float* __restrict__ fn, const float* __restrict__ X, int64_t R, int64_t nd,
                            int n_out, int64_t slice, float* __restrict__ stash, int64_t ld) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  TileSmem<TO>& S = *reinterpret_cast<TileSmem<TO>*>(smem_raw);
  constexpr int NO = kTileGroups * TO;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int ks = blockIdx.y, tid = threadIdx.x;
  const int64_t kb = ks * slice, ke = std::min(nd, kb + slice);
  const int nt = static_cast<int>((ke - kb) / kTileK);
  auto load = [&](int buf, int64_t k0) {
#pragma unroll
    for (int j = 0; j < kTileRows * kTileK / 4 / 256; ++j) {
      const int c = tid + 256 * j, row = c / (kTileK / 4), c4 = c % (kTileK / 4);
      const int64_t gr = std::min(r0 + row, R - 1);  // rows past R re-read the last one (never stored)
      cp_async16(&S.x[buf][row][4 * c4], X + gr * nd + k0 + 4 * c4);
    }
    for (int c = tid; c < NO * (kTileK / 4); c += 256) {
      const int o = c / (kTileK / 4), c4 = c % (kTileK / 4);
      cp_async16(&S.f[buf][o][4 * c4], fn + std::min(o, n_out - 1) * nd + k0 + 4 * c4);
    }
    cp_async_commit();
  };
  const int og = tid & (kTileGroups - 1), rt = tid / kTileGroups;  // a warp: 4 row threads x 8 groups
  float acc[4][TO] = {}, ss[4] = {};
  if (nt > 0) load(0, kb);
  for (int t = 0; t < nt; ++t) {
    if (t + 1 < nt) {
      load((t + 1) & 1, kb + (t + 1) * int64_t(kTileK));
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int b = t & 1;
#pragma unroll
    for (int k = 0; k < kTileK; k += 4) {
      float4 xv[4], fv[TO];
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = *reinterpret_cast<const float4*>(&S.x[b][rt + kTileRowThreads * i][k]);
#pragma unroll
      for (int o = 0; o < TO; ++o) fv[o] = *reinterpret_cast<const float4*>(&S.f[b][og * TO + o][k]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (og == 0) ss[i] += xv[i].x * xv[i].x + xv[i].y * xv[i].y + xv[i].z * xv[i].z + xv[i].w * xv[i].w;
#pragma unroll
        for (int o = 0; o < TO; ++o)
          acc[i][o] += fv[o].x * xv[i].x + fv[o].y * xv[i].y + fv[o].z * xv[i].z + fv[o].w * xv[i].w;
      }
    }
    __syncthreads();  // the buffer is refilled by the next iteration's load
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + rt + kTileRowThreads * i;
    if (r >= R) continue;
    float* dst = stash + r * ld + ks * (n_out + 1);
#pragma unroll
    for (int o = 0; o < TO; ++o)
      if (og * TO + o < n_out) dst[og * TO + o] = acc[i][o];
    if (og == 0) dst[n_out] = ss[i];
  }
}

// Reduces the slices of the stash into mu[0..n_out]: warp w takes outputs w, w + 8, ..., its
// lanes the slices (a fixed shuffle tree: deterministic). One thread per output walking ~30
// slices serially was a chain of dependent L2 loads, ~15 us of every decode hc_pre. Must be
// followed by a barrier before mu is read or the stash (the output row) is overwritten.
__device__ void gather_mu(const float* stash, int n_out, int ksplit, float* mu) {
  constexpr int kPerWarp = 4;  // outputs per warp whose loads are in flight together (25 / 8 warps)
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
        part[i][j] = o <= n_out && ks < ksplit ? stash[ks * (n_out + 1) + o] : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < kPerWarp; ++i) {
      const int o = o0 + i * warps;
      float v = ((part[i][0] + part[i][1]) + part[i][2]) + part[i][3];
      if (o <= n_out)
        for (int ks = lane + 128; ks < ksplit; ks += 32) v += stash[ks * (n_out + 1) + o];
      v = warp_sum(v);
      if (lane == 0 && o <= n_out) mu[o] = v;
    }
  }
}

__device__ float rms_factor(float ss, int64_t nd, float eps) {
  return 1.0f / sqrtf(static_cast<float>(static_cast<double>(ss) / nd) + eps);
}

// Twin of dsv4::sinkhorn, one matrix element per lane (lane = j*n + k < n*n; the whole warp
// must call it). Every sum gathers its n terms by shuffles and adds them in the CPU's order,
// so the result has the same bits as the serial loop; the matrix never leaves registers (the
// former one-thread version kept it in local memory and took ~60 us at n = 4, 20 iterations).
__device__ float sinkhorn_warp(float m, int n, int iters, float eps) {
  const int lane = threadIdx.x & 31;
  const int j = lane / n, k = lane % n;
  const int row0 = (j * n) & 31;  // lanes past n*n compute garbage that is never stored
  float mx = __shfl_sync(0xFFFFFFFFu, m, row0);
  for (int c = 1; c < n; ++c) mx = fmaxf(mx, __shfl_sync(0xFFFFFFFFu, m, (row0 + c) & 31));
  const float e = expf(m - mx);
  float s = 0;
  for (int c = 0; c < n; ++c) s += __shfl_sync(0xFFFFFFFFu, e, (row0 + c) & 31);
  m = e / s + eps;
  for (int it = 0; it < max(iters, 1); ++it) {  // the CPU twin always normalises columns once
    if (it > 0) {  // row normalise (the first round's rows came from the softmax)
      s = 0;
      for (int c = 0; c < n; ++c) s += __shfl_sync(0xFFFFFFFFu, m, (row0 + c) & 31);
      m /= (s + eps);
    }
    s = 0;
    for (int r = 0; r < n; ++r) s += __shfl_sync(0xFFFFFFFFu, m, (r * n + k) & 31);
    m /= (s + eps);
  }
  return m;
}

// out[c] = Σ_i coef[i] X[i, c] for the float4 columns [c0, c1) of one row (coef in shared memory;
// the first MAXN streams' loads issued together, any further ones after).
template <int MAXN>
__device__ void mix_slice(const float* X, const float* coef, int64_t n, int64_t d, int64_t c0, int64_t c1,
                          float* out) {
  const float4* X4 = reinterpret_cast<const float4*>(X);
  float4* O4 = reinterpret_cast<float4*>(out);
  const int64_t d4 = d / 4;
  for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
    // All n streams' loads in flight before the sums (a loop bounded by the runtime n issued them
    // one after another: ncu at 4096 rows, half of the stalls on the load scoreboard).
    float4 x[MAXN];
#pragma unroll
    for (int i = 0; i < MAXN; ++i) x[i] = i < n ? X4[i * d4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
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
    for (int64_t i = MAXN; i < n; ++i) {  // the head's wider n (hc_head allows up to 24)
      const float4 xi = X4[i * d4 + c];
      const float p = coef[i];
      acc.x += p * xi.x;
      acc.y += p * xi.y;
      acc.z += p * xi.z;
      acc.w += p * xi.w;
    }
    O4[c] = acc;
  }
}

// Columns of float4 that block y of `slices` mixes.
__device__ void slice_range(int64_t d, int slices, int64_t& c0, int64_t& c1) {
  const int64_t d4 = d / 4, per = (d4 + slices - 1) / slices;
  c0 = min(d4, static_cast<int64_t>(blockIdx.y) * per);
  c1 = min(d4, c0 + per);
}

constexpr int kMaxN = 4;  // hc_pre: (2+n)n <= 24

// Grid (R, slices + 1): blocks y < slices mix their column slice with the pre gates (which need
// only mu); block y == slices writes pre / post and runs Sinkhorn for comb.
__global__ void hc_pre_finish_kernel(const float* X, const float* stash, int64_t ld_stash, HcParams p, int n, int64_t d,
                                     int ksplit, int iters, float hc_eps, float rms_eps, int slices, float* pre,
                                     float* post, float* comb, float* u) {
  __shared__ float mu[(2 + kMaxN) * kMaxN + 1];
  __shared__ float s_pre[kMaxN];
  const int64_t r = blockIdx.x;
  const int n_out = (2 + n) * n;
  gather_mu(stash + r * ld_stash, n_out, ksplit, mu);
  __syncthreads();
  const float rho = rms_factor(mu[n_out], n * d, rms_eps);
  if (static_cast<int>(blockIdx.y) < slices) {
    if (threadIdx.x < n)
      s_pre[threadIdx.x] = sigmoidf_(p.scale[0] * (mu[threadIdx.x] * rho) + p.base[threadIdx.x]) + hc_eps;
    __syncthreads();
    int64_t c0, c1;
    slice_range(d, slices, c0, c1);
    mix_slice<kMaxN>(X + r * n * d, s_pre, n, d, c0, c1, u + r * d);
    return;
  }
  if (threadIdx.x < 32) {  // warp 0: gates by lane, Sinkhorn one element per lane
    const int lane = threadIdx.x;
    if (lane < n) {
      pre[r * n + lane] = sigmoidf_(p.scale[0] * (mu[lane] * rho) + p.base[lane]) + hc_eps;
      post[r * n + lane] = 2.0f * sigmoidf_(p.scale[1] * (mu[n + lane] * rho) + p.base[n + lane]);
    }
    const int e = lane < n * n ? lane : 0;
    const float m0 = p.scale[2] * (mu[2 * n + e] * rho) + p.base[2 * n + e];
    const float m = sinkhorn_warp(m0, n, iters, hc_eps);
    if (lane < n * n) comb[r * n * n + lane] = m;
  }
}

constexpr int kMaxHeadN = 24;

__global__ void hc_head_finish_kernel(const float* X, const float* stash, int64_t ld_stash, HcParams p, int n,
                                      int64_t d, int ksplit, float hc_eps, float rms_eps, int slices, float* h) {
  __shared__ float mu[kMaxHeadN + 1];
  __shared__ float s_pre[kMaxHeadN];
  const int64_t r = blockIdx.x;
  gather_mu(stash + r * ld_stash, n, ksplit, mu);
  __syncthreads();
  if (threadIdx.x < n) {
    const float rho = rms_factor(mu[n], n * d, rms_eps);
    s_pre[threadIdx.x] = sigmoidf_(p.scale[0] * (mu[threadIdx.x] * rho) + p.base[threadIdx.x]) + hc_eps;
  }
  __syncthreads();
  int64_t c0, c1;
  slice_range(d, slices, c0, c1);
  mix_slice<kMaxN>(X + r * n * d, s_pre, n, d, c0, c1, h + r * d);
}

template <int MAXN>
__global__ void hc_post_kernel(const float* post, const float* comb, const float* F, const float* F2, float* X, int n,
                               int64_t d4) {
  const int64_t r = blockIdx.y, c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= d4) return;
  float4* X4 = reinterpret_cast<float4*>(X) + r * n * d4;
  float4 f = reinterpret_cast<const float4*>(F)[r * d4 + c];
  if (F2) {  // the same sum the routed experts' combine made when it added into F
    const float4 g = reinterpret_cast<const float4*>(F2)[r * d4 + c];
    f = make_float4(f.x + g.x, f.y + g.y, f.z + g.z, f.w + g.w);
  }
  float4 old[MAXN];
#pragma unroll
  for (int j = 0; j < MAXN; ++j)
    if (j < n) old[j] = X4[j * d4 + c];
  const float* P = comb + r * n * n;
  for (int k = 0; k < n; ++k) {
    const float pk = post[r * n + k];
    float4 acc = make_float4(pk * f.x, pk * f.y, pk * f.z, pk * f.w);
#pragma unroll
    for (int j = 0; j < MAXN; ++j) {
      if (j < n) {
        const float cj = P[j * n + k];
        acc.x += cj * old[j].x;
        acc.y += cj * old[j].y;
        acc.z += cj * old[j].z;
        acc.w += cj * old[j].w;
      }
    }
    X4[k * d4 + c] = acc;
  }
}

// The tiled projection over (row block, K slice); slices are whole kTileK columns, as many as
// fill one wave of resident blocks (a second, mostly empty wave doubled the time), and fit the
// stash row (ks x (n_out + 1) <= d). Returns the slice count.
template <int TO>
int project_tiled(const float* fn, const float* X, int64_t R, int64_t nd, int64_t d, int n_out, float* stash,
                  cudaStream_t s) {
  const size_t smem = sizeof(TileSmem<TO>);
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(hc_project_tiled_kernel<TO>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  static const int per_sm = [&] {
    int n = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, hc_project_tiled_kernel<TO>, 256, smem));
    return std::max(n, 1);
  }();
  const int64_t row_blocks = ceil_div(R, kTileRows), tiles = nd / kTileK;
  int64_t ks = std::max<int64_t>(1, int64_t{per_sm} * sm_count() / row_blocks);
  ks = std::min<int64_t>({ks, std::max<int64_t>(1, tiles / 4), std::max<int64_t>(1, d / (n_out + 1))});
  const int64_t slice = ceil_div(tiles, ks) * kTileK;
  ks = ceil_div(nd, slice);
  hc_project_tiled_kernel<TO><<<dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks)), 256, smem, s>>>(
      fn, X, R, nd, n_out, slice, stash, d);
  DSV4_CUDA_LAUNCH_CHECK();
  return static_cast<int>(ks);
}

// Launches the split-K projection; returns the number of slices written per row.
int project(const float* fn, const float* X, int64_t R, int64_t n, int64_t d, int n_out, float* stash,
            cudaStream_t s) {
  DSV4_CHECK(d % 4 == 0, "cuda mHC: d must be a multiple of 4");
  DSV4_CHECK(d >= n_out + 1, "cuda mHC: d too small for the projection stash");
  if (R >= kTileMinRows && (n * d) % kTileK == 0 && n_out <= kTileGroups * 3) {
    if (n_out <= kTileGroups) return project_tiled<1>(fn, X, R, n * d, d, n_out, stash, s);
    return project_tiled<3>(fn, X, R, n * d, d, n_out, stash, s);
  }
  const int rows_per_block = R < 4 ? 1 : 4;
  const int64_t nd4 = n * d / 4, row_blocks = ceil_div(R, rows_per_block);
  int64_t ks = ceil_div(2 * sm_count(), row_blocks);  // about two waves of blocks
  ks = std::min<int64_t>(ks, std::max<int64_t>(1, nd4 / kProjThreads));
  ks = std::max<int64_t>(1, std::min<int64_t>(ks, d / (n_out + 1)));
  const int64_t slice4 = ceil_div(nd4, ks);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks));
  auto launch = [&](auto rows_tag) {
    constexpr int RB = decltype(rows_tag)::value;
    if (n_out <= 4)
      hc_project_kernel<4, RB><<<grid, kProjThreads, 0, s>>>(fn, X, R, n * d, n_out, slice4, stash, d);
    else if (n_out <= 8)
      hc_project_kernel<8, RB><<<grid, kProjThreads, 0, s>>>(fn, X, R, n * d, n_out, slice4, stash, d);
    else
      hc_project_kernel<24, RB><<<grid, kProjThreads, 0, s>>>(fn, X, R, n * d, n_out, slice4, stash, d);
  };
  if (rows_per_block == 1)
    launch(std::integral_constant<int, 1>{});
  else
    launch(std::integral_constant<int, 4>{});
  DSV4_CUDA_LAUNCH_CHECK();
  return static_cast<int>(ks);
}

// Per-row projection partials ([R, d] floats; d >= slices x (n_out + 1), checked in project).
// One buffer for the process: the kernels of one stream use it in order; growing it bumps the
// scratch epoch, so captured graphs are rebuilt.
float* stash(int64_t R, int64_t d) {
  static DeviceBuffer buf;
  grow_scratch(buf, static_cast<size_t>(R * d) * sizeof(float));
  return buf.as<float>();
}

// Channel slices per row for the mixing: decode rows need several blocks each to stream X.
int mix_slices(int64_t R, int64_t d) {
  const int64_t by_width = ceil_div(d / 4, 256);
  return static_cast<int>(R >= sm_count() ? 1 : std::max<int64_t>(1, std::min<int64_t>(by_width, 8)));
}

}  // namespace

void hc_pre(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
            float rms_eps, float* pre, float* post, float* comb, float* u, cudaStream_t s, cudaStream_t gates_s,
            cudaEvent_t projected) {
  DSV4_CHECK(n >= 1 && n <= kMaxN, "cuda::hc_pre: n must be in [1, 4]");
  DSV4_CHECK(!gates_s || projected, "cuda::hc_pre: a gates stream needs its event");
  if (R == 0) return;
  const int n_out = static_cast<int>((2 + n) * n);
  float* st = stash(R, d);
  const int ks = project(p.fn, X, R, n, d, n_out, st, s);
  const int slices = mix_slices(R, d);
  const unsigned rows = static_cast<unsigned>(R);
  auto finish = [&](dim3 grid, int n_slices, cudaStream_t on) {
    hc_pre_finish_kernel<<<grid, 256, 0, on>>>(X, st, d, p, static_cast<int>(n), d, ks, static_cast<int>(iters), hc_eps,
                                               rms_eps, n_slices, pre, post, comb, u);
    DSV4_CUDA_LAUNCH_CHECK();
  };
  if (!gates_s) return finish(dim3(rows, slices + 1), slices, s);
  // Blocks y < slices mix; with no mixing slices every block is the gates block.
  DSV4_CUDA_CHECK(cudaEventRecord(projected, s));
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(gates_s, projected, 0));
  finish(dim3(rows, 1), 0, gates_s);
  finish(dim3(rows, slices), slices, s);
}

void hc_post(const float* post, const float* comb, const float* F, float* X, int64_t R, int64_t n, int64_t d,
             cudaStream_t s, const float* F2) {
  DSV4_CHECK(d % 4 == 0 && n >= 1 && n <= 8, "cuda::hc_post: needs d % 4 == 0 and n <= 8");
  if (R == 0) return;
  const int64_t d4 = d / 4;
  const dim3 grid(static_cast<unsigned>(ceil_div(d4, 256)), static_cast<unsigned>(R));
  if (n <= 4)
    hc_post_kernel<4><<<grid, 256, 0, s>>>(post, comb, F, F2, X, static_cast<int>(n), d4);
  else
    hc_post_kernel<8><<<grid, 256, 0, s>>>(post, comb, F, F2, X, static_cast<int>(n), d4);
  DSV4_CUDA_LAUNCH_CHECK();
}

void hc_head(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, float hc_eps, float rms_eps, float* h,
             cudaStream_t s) {
  DSV4_CHECK(n >= 1 && n <= kMaxHeadN, "cuda::hc_head: n must be in [1, 24]");
  if (R == 0) return;
  float* st = stash(R, d);
  const int ks = project(p.fn, X, R, n, d, static_cast<int>(n), st, s);
  const int slices = mix_slices(R, d);
  hc_head_finish_kernel<<<dim3(static_cast<unsigned>(R), slices), 256, 0, s>>>(X, st, d, p, static_cast<int>(n), d, ks,
                                                                              hc_eps, rms_eps, slices, h);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
