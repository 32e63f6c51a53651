// mHC kernels (twin: model/mhc.cpp). The projection mu = fn · X_r of every row is a skinny GEMM
// ([R, n·d] × [n·d, (2+n)n]); it is split over K so that decode batches still fill the GPU:
// kernel 1 writes per-slice partial sums (and Σx² for the RMS factor) into a stash; kernel 2
// reduces the slices in a fixed order and, over a grid of (row, channel slice) blocks, writes the
// mixed row, while one extra block per row runs the gates and Sinkhorn (a serial ~3 µs chain that
// one block per row used to run before mixing all 4 streams alone: ~19 µs per decode hc_pre).
// Up to 4 rows, ops_mhc_decode.cu runs the projection, mixing and the sub-layer norm in one
// launch instead (the gates: in it, or this file's finish kernel on the gates stream).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_tf32.cuh"
#include "backend/cuda/ops_mhc_decode.h"
#include "backend/cuda/pdl.cuh"
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

using mhc::gather_mu;
using mhc::kMaxN;
using mhc::kProjThreads;
using mhc::mix_column;
using mhc::mix_slice;
using mhc::post_input;
using mhc::post_stream;
using mhc::rms_factor;
using mhc::sinkhorn_warp;

template <int MAXO, int kProjRows>
__global__ void __launch_bounds__(kProjThreads)
    hc_project_kernel(const float* fn, const float* X, int64_t R, int64_t nd, int n_out, int64_t slice4, float* stash,
                      int64_t ld) {
  // A dependent of hc_post (pdl.cuh): until the wait, only fn (its first row block asks L2 for it).
  if (blockIdx.x == 0) mhc::prefetch_fn_slice(fn, nd, n_out, slice4, static_cast<int>(blockIdx.y));
  detail::pdl_wait();
  mhc::project_slice<MAXO, kProjRows>(fn, X, R, nd, n_out, slice4, stash, ld, blockIdx.x * int64_t(kProjRows),
                                      static_cast<int>(blockIdx.y));
}

// hc_project_kernel's stash for batches (R >= kTileMinRows): a block takes kTileRows rows and one
// K slice and stages both operands through shared memory, so that every fn value read from L2
// serves 128 rows (the per-row kernel re-read all of fn from L2 for every 4 rows: 1.6 GB per
// 4096-row call, which bounded it). Thread (row r, output group og) holds rows r + 32 i (i < 4)
// of outputs og * TO .. + TO; group 0 also sums x². kTileStages cp.async stages of kTileK columns,
// kTileStages - 1 in flight: a 256-row call's blocks hold 4 tiles each, and with two stages every
// tile waited for its own DRAM round trip (~18 us at 256 rows, 1 TB/s).
constexpr int kTileRows = 128, kTileK = 32, kTilePitch = kTileK + 4, kTileMinRows = 256, kTileStages = 4;
constexpr int kTileGroups = 8, kTileRowThreads = kTileRows / 4;
static_assert(kTileRowThreads * kTileGroups == 256, "one thread per (row thread, output group)");

template <int TO>
struct TileSmem {
  float x[kTileStages][kTileRows][kTilePitch];  // rows 16 B apart in banks: a load's 4 rows do not conflict
  float f[kTileStages][kTileGroups * TO][kTilePitch];
};

// The TF32 form (kTF32, TO = 3: 24 outputs): the same tiles on the tensor cores, mma.m16n8k8
// on split-TF32 operands (mma_tf32.cuh). Warp w takes rows 16w..16w+15 and all 24 outputs (three
// n8 tiles). The FMA form issues ~80 warp instructions per 4 columns of 16 rows (ncu at 256 rows:
// SM 50%, DRAM 31%), this ~30; different fp32 sum order, so not the FMA form's bits.
template <int TO, bool kTF32>
__global__ void __launch_bounds__(256, 2)  // 3 per SM spills at TO = 3 (and 4 stages fit 2)
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
  };
  static_assert(!kTF32 || TO == 3, "the TF32 form takes all 24 outputs");
  const int og = tid & (kTileGroups - 1), rt = tid / kTileGroups;  // a warp: 4 row threads x 8 groups
  float acc[4][TO] = {}, ss[4] = {};
  // TF32 form: lane (g, q) = (lane / 4, lane % 4) holds rows ra and ra + 8 of the warp's 16, output
  // columns 8 nb + 2q, 8 nb + 2q + 1 of n tile nb (the m16n8 C fragment); ss2: its rows' partial Σ x².
  const int g = (tid & 31) >> 2, q = tid & 3, ra = (tid >> 5) * 16 + g;
  float cacc[3][4] = {}, ss2[2] = {};
  // One commit group per tile (empty past the end), so that tile t is complete once at most
  // kTileStages - 2 newer groups are pending.
#pragma unroll
  for (int t = 0; t < kTileStages - 1; ++t) {
    if (t < nt) load(t, kb + t * int64_t(kTileK));
    cp_async_commit();
  }
  for (int t = 0; t < nt; ++t) {
    cp_async_wait<kTileStages - 2>();
    __syncthreads();  // tile t visible to all; every thread is past tile t - 1, whose buffer is refilled next
    const int tn = t + kTileStages - 1;
    if (tn < nt) load(tn % kTileStages, kb + tn * int64_t(kTileK));
    cp_async_commit();
    const int b = t % kTileStages;
    if constexpr (kTF32) {
#pragma unroll
      for (int k = 0; k < kTileK; k += 8) {
        // A fragment: (ra, k+q), (ra+8, k+q), (ra, k+q+4), (ra+8, k+q+4); rows 36 floats apart
        // put the 32 lanes on 32 banks (and the same for B's outputs).
        const float x[4] = {S.x[b][ra][k + q], S.x[b][ra + 8][k + q], S.x[b][ra][k + q + 4], S.x[b][ra + 8][k + q + 4]};
        ss2[0] += x[0] * x[0] + x[2] * x[2];
        ss2[1] += x[1] * x[1] + x[3] * x[3];
        const float fb[3][2] = {{S.f[b][g][k + q], S.f[b][g][k + q + 4]},
                                {S.f[b][8 + g][k + q], S.f[b][8 + g][k + q + 4]},
                                {S.f[b][16 + g][k + q], S.f[b][16 + g][k + q + 4]}};
        mhc::mma_tf32_split_step(cacc, x, fb);
      }
    } else {
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
    }
  }
  if constexpr (kTF32) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // The row's Σ x² over the four lanes of its quad (each summed a quarter of the columns).
      ss2[e] += __shfl_xor_sync(0xFFFFFFFFu, ss2[e], 1);
      ss2[e] += __shfl_xor_sync(0xFFFFFFFFu, ss2[e], 2);
      const int64_t r = r0 + ra + 8 * e;
      if (r >= R) continue;
      float* dst = stash + r * ld;
#pragma unroll
      for (int nb = 0; nb < 3; ++nb)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int o = 8 * nb + 2 * q + h;
          if (o < n_out) dst[ks * (n_out + 1) + o] = cacc[nb][2 * e + h];
        }
      if (q == 0) dst[ks * (n_out + 1) + n_out] = ss2[e];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = r0 + rt + kTileRowThreads * i;
      if (r >= R) continue;
      float* dst = stash + r * ld;
#pragma unroll
      for (int o = 0; o < TO; ++o)
        if (og * TO + o < n_out) dst[ks * (n_out + 1) + og * TO + o] = acc[i][o];
      if (og == 0) dst[ks * (n_out + 1) + n_out] = ss[i];
    }
  }
}


// Columns of float4 that block y of `slices` mixes.
__device__ void slice_range(int64_t d, int slices, int64_t& c0, int64_t& c1) {
  const int64_t d4 = d / 4, per = (d4 + slices - 1) / slices;
  c0 = min(d4, static_cast<int64_t>(blockIdx.y) * per);
  c1 = min(d4, c0 + per);
}


// The whole row's mix, then the sub-layer RMS norm of it in place: rms_norm_kernel's loop and
// sums at 256 threads (same bits as the two launches it replaces); each thread rescales the
// columns it wrote itself.
template <typename XT>
__device__ void mix_norm_row(const XT* X, const float* coef, int n, int64_t d, float* out, const float* w,
                             float eps) {
  __shared__ double red[32];
  const auto* X4 = mhc::stream4(X);
  float4* O4 = reinterpret_cast<float4*>(out);
  const int64_t d4 = d / 4;
  double ss = 0.0;
  for (int64_t c = threadIdx.x; c < d4; c += blockDim.x) {
    const float4 v = mix_column<kMaxN>(X4, coef, n, d4, c);
    O4[c] = v;
    ss += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
  }
  ss = detail::block_sum(ss, red);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / d) + eps);
  for (int64_t c = threadIdx.x; c < d4; c += blockDim.x) {
    float4 v = O4[c];
    const float4 g = reinterpret_cast<const float4*>(w)[c];
    v.x = g.x * (v.x * inv);
    v.y = g.y * (v.y * inv);
    v.z = g.z * (v.z * inv);
    v.w = g.w * (v.w * inv);
    O4[c] = v;
  }
}

// Grid (R, slices + 1): blocks y < slices mix their column slice with the pre gates (which need
// only mu); block y == slices writes pre / post and runs Sinkhorn for comb. norm_w (slices == 1
// only): the mixing block also applies the sub-layer norm to its row.
// XT: the streams as stored (float, or uint16_t bf16 bits).
template <typename XT>
__global__ void hc_pre_finish_kernel(const XT* X, const float* stash, int64_t ld_stash, HcParams p, int n, int64_t d,
                                     int ksplit, int iters, float hc_eps, float rms_eps, int slices, float* pre,
                                     float* post, float* comb, float* u, const float* norm_w = nullptr,
                                     float norm_eps = 0.f) {
  __shared__ float mu[(2 + kMaxN) * kMaxN + 1];
  __shared__ float s_pre[kMaxN];
  const int64_t r = blockIdx.x;
  const int n_out = (2 + n) * n;
  // A whole row's mixer (prefill sizes): its streams start their way from DRAM into L2 while the
  // gates' partials are gathered (the mix needs those first).
  if (slices == 1 && blockIdx.y == 0) detail::prefetch_l2(X + r * n * d, n * d * static_cast<int64_t>(sizeof(XT)));
  gather_mu(stash + r * ld_stash, n_out, ksplit, mu);
  __syncthreads();
  const float rho = rms_factor(mu[n_out], n * d, rms_eps);
  if (static_cast<int>(blockIdx.y) < slices) {
    if (threadIdx.x < n)
      s_pre[threadIdx.x] = sigmoidf_(p.scale[0] * (mu[threadIdx.x] * rho) + p.base[threadIdx.x]) + hc_eps;
    __syncthreads();
    if (norm_w) return mix_norm_row(X + r * n * d, s_pre, n, d, u + r * d, norm_w, norm_eps);
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

// XIn / XOut: the old / new streams as stored (float, or uint16_t bf16 bits; the same buffer
// unless fp32 streams become bf16 ones).
template <int MAXN, typename XIn = float, typename XOut = float>
__global__ void hc_post_kernel(const float* post, const float* comb, const float* F, const float* F2, RoutedRows rt,
                               const XIn* Xin, XOut* Xout, int n, int64_t d4) {
  detail::pdl_trigger();  // the decode hc_pre after it may start its weight prefetch (pdl.cuh)
  const int64_t r = blockIdx.y, c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= d4) return;
  const auto* I4 = mhc::stream4(Xin) + r * n * d4;
  auto* O4 = mhc::stream4(Xout) + r * n * d4;
  const float4 f = post_input(F, F2, rt, r, d4, c);
  float4 old[MAXN];
#pragma unroll
  for (int j = 0; j < MAXN; ++j)
    if (j < n) old[j] = mhc::widen4(I4[j * d4 + c]);
  for (int k = 0; k < n; ++k)
    mhc::put4(O4 + k * d4 + c,
              mhc::as_stored<XOut>(post_stream<MAXN>(f, post[r * n + k], comb + r * n * n, k, n, old)));
}

// The tiled projection over (row block, K slice); slices are whole kTileK columns, as many as
// fill one wave of resident blocks (a second, mostly empty wave doubled the time), and fit the
// stash row (ks x (n_out + 1) <= d). Returns the slice count.
template <int TO, bool kTF32 = false>
int project_tiled(const float* fn, const float* X, int64_t R, int64_t nd, int64_t d, int n_out, float* stash,
                  cudaStream_t s) {
  const size_t smem = sizeof(TileSmem<TO>);
  auto* kernel = hc_project_tiled_kernel<TO, kTF32>;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  static const int per_sm = [&] {
    int n = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 256, smem));
    return std::max(n, 1);
  }();
  const int64_t row_blocks = ceil_div(R, kTileRows), tiles = nd / kTileK;
  int64_t ks = std::max<int64_t>(1, int64_t{per_sm} * sm_count() / row_blocks);
  ks = std::min<int64_t>({ks, std::max<int64_t>(1, tiles / 4), std::max<int64_t>(1, d / (n_out + 1))});
  const int64_t slice = ceil_div(tiles, ks) * kTileK;
  ks = ceil_div(nd, slice);
  kernel<<<dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks)), 256, smem, s>>>(fn, X, R, nd, n_out,
                                                                                               slice, stash, d);
  DSV4_CUDA_LAUNCH_CHECK();
  return static_cast<int>(ks);
}

// The tiled projection's TF32 form for (2+n)n > 8 outputs: on by default, DSV4_HC_TF32=0 starts
// with the FMA form (A/B), set_hc_project_tf32 switches it.
bool g_project_tf32 = [] {
  const char* v = std::getenv("DSV4_HC_TF32");
  return !(v && v[0] == '0');
}();

// Launches the split-K projection; returns the number of slices written per row.
int project(const float* fn, const float* X, int64_t R, int64_t n, int64_t d, int n_out, float* stash,
            cudaStream_t s) {
  DSV4_CHECK(d % 4 == 0, "cuda mHC: d must be a multiple of 4");
  DSV4_CHECK(d >= n_out + 1, "cuda mHC: d too small for the projection stash");
  if (R >= kTileMinRows && (n * d) % kTileK == 0 && n_out <= kTileGroups * 3) {
    if (n_out <= kTileGroups) return project_tiled<1>(fn, X, R, n * d, d, n_out, stash, s);
    if (g_project_tf32) return project_tiled<3, true>(fn, X, R, n * d, d, n_out, stash, s);
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
    auto go = [&](auto kernel) {
      detail::launch_dependent(kernel, grid, dim3(kProjThreads), 0, s, fn, X, R, n * d, n_out, slice4, stash, d);
    };
    if (n_out <= 4)
      go(hc_project_kernel<4, RB>);
    else if (n_out <= 8)
      go(hc_project_kernel<8, RB>);
    else
      go(hc_project_kernel<24, RB>);
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
            cudaEvent_t projected, const float* norm_w, float norm_eps, bool from_post, const uint16_t* X16) {
  DSV4_CHECK(n >= 1 && n <= kMaxN, "cuda::hc_pre: n must be in [1, 4]");
  DSV4_CHECK(!gates_s || projected, "cuda::hc_pre: a gates stream needs its event");
  DSV4_CHECK(!X16 || (from_post && R > 4), "cuda::hc_pre: bf16 streams only past 4 rows, after hc_post_project");
  if (R == 0) return;
  const int n_out = static_cast<int>((2 + n) * n);
  float* st = stash(R, d);
  if (from_post && R <= 4) {  // hc_post_project wrote the partials: the gates beside (or inside) the mix
    if (gates_s) {
      DSV4_CUDA_CHECK(cudaEventRecord(projected, s));
      DSV4_CUDA_CHECK(cudaStreamWaitEvent(gates_s, projected, 0));
      detail::hc_pre_from_post(p, X, R, n, d, iters, hc_eps, rms_eps, norm_w, norm_eps, pre, post, comb, u, st, true,
                               false, gates_s);
    }
    return detail::hc_pre_from_post(p, X, R, n, d, iters, hc_eps, rms_eps, norm_w, norm_eps, pre, post, comb, u, st,
                                    gates_s == nullptr, true, s);
  }
  // Up to 4 rows: one launch for the projection, mixing and norm; the gates (Sinkhorn, a serial
  // ~40-step chain) inside it, or with gates_s after it from the stash, beside what follows.
  if (!from_post && detail::hc_pre_decode(p, X, R, n, d, iters, hc_eps, rms_eps, norm_w, norm_eps, pre, post, comb,
                                          u, st, gates_s == nullptr, s)) {
    if (gates_s) {
      DSV4_CUDA_CHECK(cudaEventRecord(projected, s));
      DSV4_CUDA_CHECK(cudaStreamWaitEvent(gates_s, projected, 0));
      hc_pre_finish_kernel<<<dim3(static_cast<unsigned>(R), 1), 256, 0, gates_s>>>(
          X, st, d, p, static_cast<int>(n), d, detail::hc_pre_decode_slices(R, n, d), static_cast<int>(iters), hc_eps,
          rms_eps, 0, pre, post, comb, u);
      DSV4_CUDA_LAUNCH_CHECK();
    }
    return;
  }
  const int slices = mix_slices(R, d);
  // One mixing block per row (slices == 1) applies the norm itself; rms_norm_kernel's form (256
  // threads from d = 1024, float4 loads) is what makes the bits the same.
  const auto al = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  const bool norm_inside =
      norm_w && slices == 1 && d >= 1024 && al(X16 ? static_cast<const void*>(X16) : X) && al(u) && al(norm_w);
  if (norm_w && !norm_inside) {  // unfused: the mix, then the norm on s (the gates may still run beside it)
    hc_pre(p, X, R, n, d, iters, hc_eps, rms_eps, pre, post, comb, u, s, gates_s, projected, nullptr, 0.f, from_post,
           X16);
    return rms_norm(u, norm_w, u, R, d, norm_eps, s);
  }
  // From hc_post_project (more than 4 rows): the tiled projection's partials are in the stash.
  const int ks = from_post ? detail::hc_post_project_tiled_slices(R, n, d) : project(p.fn, X, R, n, d, n_out, st, s);
  DSV4_CHECK(ks > 0, "cuda::hc_pre: the stash holds no hc_post projection for this shape");
  const unsigned rows = static_cast<unsigned>(R);
  auto finish = [&](dim3 grid, int n_slices, cudaStream_t on) {
    const bool mixing = n_slices > 0;  // the gates-only launch never normalises
    const float* nw = mixing && norm_inside ? norm_w : nullptr;
    if (X16)
      hc_pre_finish_kernel<<<grid, 256, 0, on>>>(X16, st, d, p, static_cast<int>(n), d, ks, static_cast<int>(iters),
                                                 hc_eps, rms_eps, n_slices, pre, post, comb, u, nw, norm_eps);
    else
      hc_pre_finish_kernel<<<grid, 256, 0, on>>>(X, st, d, p, static_cast<int>(n), d, ks, static_cast<int>(iters),
                                                 hc_eps, rms_eps, n_slices, pre, post, comb, u, nw, norm_eps);
    DSV4_CUDA_LAUNCH_CHECK();
  };
  if (!gates_s) return finish(dim3(rows, slices + 1), slices, s);
  // Blocks y < slices mix; with no mixing slices every block is the gates block.
  DSV4_CUDA_CHECK(cudaEventRecord(projected, s));
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(gates_s, projected, 0));
  finish(dim3(rows, 1), 0, gates_s);
  finish(dim3(rows, slices), slices, s);
}

void set_hc_project_tf32(bool on) { g_project_tf32 = on; }

void hc_post(const float* post, const float* comb, const float* F, float* X, int64_t R, int64_t n, int64_t d,
             cudaStream_t s, const float* F2, const RoutedRows* routed, StreamStore store, uint16_t* X16) {
  DSV4_CHECK(d % 4 == 0 && n >= 1 && n <= 8, "cuda::hc_post: needs d % 4 == 0 and n <= 8");
  DSV4_CHECK(!(F2 && routed), "cuda::hc_post: F2 or the routed rows, not both");
  DSV4_CHECK(store == StreamStore::F32 || (X16 && n <= 4), "cuda::hc_post: bf16 streams need X16 and n <= 4");
  if (R == 0) return;
  const int64_t d4 = d / 4;
  detail::for_row_ranges(R, [&](int64_t r0, int64_t rows) {
    const dim3 grid(static_cast<unsigned>(ceil_div(d4, 256)), static_cast<unsigned>(rows));
    const float* f2 = F2 ? F2 + r0 * d : nullptr;
    RoutedRows rt{};
    if (routed) {  // this range's rows
      rt = *routed;
      if (rt.Y) rt.Y += r0 * rt.K * d;
      if (rt.Y16) rt.Y16 += r0 * rt.K * d;
      rt.experts += r0 * rt.K;
      rt.weights += r0 * rt.K;
    }
    const float *pr = post + r0 * n, *cb = comb + r0 * n * n, *fr = F + r0 * d;
    const int64_t x0 = r0 * n * d;
    const int nn = static_cast<int>(n);
    if (store == StreamStore::BF16)
      hc_post_kernel<4, uint16_t, uint16_t><<<grid, 256, 0, s>>>(pr, cb, fr, f2, rt, X16 + x0, X16 + x0, nn, d4);
    else if (store == StreamStore::F32ToBF16)
      hc_post_kernel<4, float, uint16_t><<<grid, 256, 0, s>>>(pr, cb, fr, f2, rt, X + x0, X16 + x0, nn, d4);
    else if (n <= 4)
      hc_post_kernel<4><<<grid, 256, 0, s>>>(pr, cb, fr, f2, rt, X + x0, X + x0, nn, d4);
    else
      hc_post_kernel<8><<<grid, 256, 0, s>>>(pr, cb, fr, f2, rt, X + x0, X + x0, nn, d4);
    DSV4_CUDA_LAUNCH_CHECK();
  });
}

bool hc_streams_bf16_ok(int64_t R, int64_t n, int64_t d) { return R > 4 && detail::hc_post_project_applies(R, n, d); }

bool hc_post_project(const float* post, const float* comb, const float* F, float* X, int64_t R, int64_t n, int64_t d,
                     const HcParams& next, cudaStream_t s, const float* F2, const RoutedRows* routed,
                     StreamStore store, uint16_t* X16) {
  DSV4_CHECK(!(F2 && routed), "cuda::hc_post_project: F2 or the routed rows, not both");
  DSV4_CHECK(store == StreamStore::F32 || (X16 && R > 4), "cuda::hc_post_project: bf16 streams need X16 and > 4 rows");
  if (R == 0 || !detail::hc_post_project_applies(R, n, d)) return false;
  if (store != StreamStore::F32) {  // past 4 rows: the tiled form
    detail::hc_post_project_tiled(post, comb, F, F2, routed, X, R, n, d, next.fn, stash(R, d), s, store, X16);
    return true;
  }
  return detail::hc_post_project(post, comb, F, F2, routed, X, R, n, d, next, stash(R, d), s);
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
