// hc_pre at decode sizes in one launch. The split-K projection, its reduction + mixing, and the
// sub-layer's RMS norm of the mixed row were three dependent launches of latency-bound kernels
// (~20 us per call at one row, 16 calls per 8-layer step: ~15% of a batch-1 step). Here one grid
// of R x (ks + 1) blocks, all resident at once (checked: at most one block per SM), runs them as
// phases separated by grid barriers:
//   1. blocks (r, j < ks): projection slice j of row r into the stash (mhc::project_slice, the
//      split-K kernel's own code and slices: the same bits);
//   2. every block gathers mu; block (r, ks) writes the gates and runs Sinkhorn (or, with a gates
//      stream, hc_pre's gates kernel does so there from the stash, beside what follows), blocks
//      j < ks mix column slice j of u and (norm) sum its squares;
//   3. (norm) blocks j < ks gather the row's square sums and write u = w * (u / rms).
// The barrier is a counter + sense flag in device memory, reset by the last block to arrive, so
// a graph replays it as is.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/ops_mhc_decode.h"

namespace dsv4::cuda::detail {
namespace {

using mhc::kMaxN;
using mhc::kProjThreads;

constexpr int kMaxRows = 4;      // the fused form's batch bound (decode, MTP verification)
constexpr int kMixPerThread = 2; // float4 columns of u a thread holds between phases 2 and 3

struct GridBarrier {
  unsigned count, sense;
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// All `n` blocks that call it arrive before any leaves; their global writes before it are
// visible to all after it (read them with __ldcg: L1 is not coherent). The sense is read before
// arriving, so it cannot flip before this block has seen it.
__device__ void grid_sync(GridBarrier* b, unsigned n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned s0 = load_acquire(&b->sense);
    __threadfence();
    if (atomicAdd(&b->count, 1u) == n - 1) {
      atomicExch(&b->count, 0u);
      __threadfence();
      atomicExch(&b->sense, s0 ^ 1u);
    } else {
      while (load_acquire(&b->sense) == s0) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// One float4 column c of Σ_i coef[i] X[i]: mix_slice's arithmetic for n <= kMaxN.
__device__ __forceinline__ float4 mix_column(const float4* X4, const float* coef, int n, int64_t d4, int64_t c) {
  float4 x[kMaxN];
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) x[i] = i < n ? X4[i * d4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int i = 0; i < kMaxN; ++i) {
    if (i >= n) break;
    const float p = coef[i];
    acc.x += p * x[i].x;
    acc.y += p * x[i].y;
    acc.z += p * x[i].z;
    acc.w += p * x[i].w;
  }
  return acc;
}

struct DecodeArgs {
  const float* X;
  HcParams p;
  int n, ks, iters;
  int64_t d, slice4, per4;  // per4: float4 columns of u per mixing block
  float hc_eps, rms_eps, norm_eps;
  const float* norm_w;  // nullptr: u is the plain mix
  float* stash;         // [R, d] projection partials
  double* ss;           // [R, ks] square sums of u's slices
  GridBarrier* bar;     // [2]
  float *pre, *post, *comb, *u;
};

// kGates: blocks (r, ks) write the gates (and run Sinkhorn); without them the caller runs the
// gates kernel on a side stream, off the critical path.
template <bool kGates>
__global__ void __launch_bounds__(kProjThreads) hc_pre_decode_kernel(DecodeArgs a) {
  __shared__ float mu[(2 + kMaxN) * kMaxN + 1];
  __shared__ float s_pre[kMaxN];
  __shared__ double red[32];
  __shared__ float s_inv;
  const int64_t r = blockIdx.x, R = gridDim.x;
  const int j = blockIdx.y, n = a.n, n_out = (2 + n) * n;
  const int64_t d = a.d, nd = n * d, d4 = d / 4;
  if (j < a.ks) mhc::project_slice<(2 + kMaxN) * kMaxN, 1>(a.p.fn, a.X, R, nd, n_out, a.slice4, a.stash, d, r, j);
  grid_sync(&a.bar[0], static_cast<unsigned>(R * (a.ks + (kGates ? 1 : 0))));
  mhc::gather_mu(a.stash + r * d, n_out, a.ks, mu);
  __syncthreads();
  const float rho = mhc::rms_factor(mu[n_out], nd, a.rms_eps);
  if (kGates && j == a.ks) {  // the gates block: hc_pre_finish_kernel's gates, warp 0
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane < n) {
        a.pre[r * n + lane] = detail::sigmoidf_(a.p.scale[0] * (mu[lane] * rho) + a.p.base[lane]) + a.hc_eps;
        a.post[r * n + lane] = 2.0f * detail::sigmoidf_(a.p.scale[1] * (mu[n + lane] * rho) + a.p.base[n + lane]);
      }
      const int e = lane < n * n ? lane : 0;
      const float m0 = a.p.scale[2] * (mu[2 * n + e] * rho) + a.p.base[2 * n + e];
      const float m = mhc::sinkhorn_warp(m0, n, a.iters, a.hc_eps);
      if (lane < n * n) a.comb[r * n * n + lane] = m;
    }
    return;
  }
  if (threadIdx.x < n)
    s_pre[threadIdx.x] = detail::sigmoidf_(a.p.scale[0] * (mu[threadIdx.x] * rho) + a.p.base[threadIdx.x]) + a.hc_eps;
  __syncthreads();
  const float4* X4 = reinterpret_cast<const float4*>(a.X + r * nd);
  float4* U4 = reinterpret_cast<float4*>(a.u + r * d);
  const int64_t c0 = std::min(d4, j * a.per4), c1 = std::min(d4, c0 + a.per4);
  float4 v[kMixPerThread];
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < kMixPerThread; ++i) {
    const int64_t c = c0 + threadIdx.x + i * kProjThreads;
    if (c >= c1) continue;
    v[i] = mix_column(X4, s_pre, n, d4, c);
    if (!a.norm_w) {
      U4[c] = v[i];
      continue;
    }
    ss += double(v[i].x) * v[i].x + double(v[i].y) * v[i].y + double(v[i].z) * v[i].z + double(v[i].w) * v[i].w;
  }
  if (!a.norm_w) return;
  ss = detail::block_sum(ss, red);
  if (threadIdx.x == 0) a.ss[r * a.ks + j] = ss;
  grid_sync(&a.bar[1], static_cast<unsigned>(R * a.ks));
  if (threadIdx.x < 32) {  // the row's square sum in a fixed order: lanes stride the slices
    double t = 0.0;
    for (int k = threadIdx.x; k < a.ks; k += 32) t += __ldcg(a.ss + r * a.ks + k);
    t = detail::warp_sum(t);
    if (threadIdx.x == 0) s_inv = 1.0f / sqrtf(static_cast<float>(t / d) + a.norm_eps);
  }
  __syncthreads();
  const float inv = s_inv;
  const float4* G4 = reinterpret_cast<const float4*>(a.norm_w);
#pragma unroll
  for (int i = 0; i < kMixPerThread; ++i) {
    const int64_t c = c0 + threadIdx.x + i * kProjThreads;
    if (c >= c1) continue;
    const float4 g = G4[c];
    U4[c] = make_float4(g.x * (v[i].x * inv), g.y * (v[i].y * inv), g.z * (v[i].z * inv), g.w * (v[i].w * inv));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool g_enabled = true;

}  // namespace

void set_hc_pre_decode_enabled(bool on) { g_enabled = on; }

int hc_pre_decode_slices(int64_t R, int64_t n, int64_t d) {
  const int64_t n_out = (2 + n) * n, nd4 = n * d / 4;
  // project()'s slice count for these rows (the split-K kernel's bits), then the residency bound.
  int64_t ks = ceil_div(2 * sm_count(), R);
  ks = std::min<int64_t>(ks, std::max<int64_t>(1, nd4 / kProjThreads));
  ks = std::max<int64_t>(1, std::min<int64_t>(ks, d / (n_out + 1)));
  if (!g_enabled || R < 1 || R > kMaxRows || n < 1 || n > kMaxN || d % 4 != 0 || R * (ks + 1) > sm_count()) return 0;
  if (ceil_div(d / 4, ks) > int64_t(kMixPerThread) * kProjThreads) return 0;
  return static_cast<int>(ks);
}

bool hc_pre_decode(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
                   float rms_eps, const float* norm_w, float norm_eps, float* pre, float* post, float* comb, float* u,
                   float* stash, bool gates, cudaStream_t s) {
  const int ks = hc_pre_decode_slices(R, n, d);
  if (ks == 0 || !aligned16(X) || !aligned16(u) || !aligned16(p.fn) || (norm_w && !aligned16(norm_w))) return false;
  static DeviceBuffer ss, bar;
  grow_scratch(ss, static_cast<size_t>(kMaxRows * 256) * sizeof(double));
  if (!bar.get()) {  // once per process: a zero count and sense (the barrier resets itself after that)
    bar = DeviceBuffer(2 * sizeof(GridBarrier));
    DSV4_CUDA_CHECK(cudaMemsetAsync(bar.get(), 0, bar.bytes(), s));
    note_scratch_alloc();
  }
  DSV4_CHECK(R * ks <= kMaxRows * 256, "hc_pre_decode: square-sum buffer too small");
  DecodeArgs a{};
  a.X = X;
  a.p = p;
  a.n = static_cast<int>(n);
  a.ks = ks;
  a.iters = static_cast<int>(iters);
  a.d = d;
  a.slice4 = ceil_div(n * d / 4, int64_t(ks));
  a.per4 = ceil_div(d / 4, int64_t(ks));
  a.hc_eps = hc_eps;
  a.rms_eps = rms_eps;
  a.norm_eps = norm_eps;
  a.norm_w = norm_w;
  a.stash = stash;
  a.ss = ss.as<double>();
  a.bar = bar.as<GridBarrier>();
  a.pre = pre;
  a.post = post;
  a.comb = comb;
  a.u = u;
  const dim3 grid(static_cast<unsigned>(R), static_cast<unsigned>(ks + (gates ? 1 : 0)));
  if (gates)
    hc_pre_decode_kernel<true><<<grid, kProjThreads, 0, s>>>(a);
  else
    hc_pre_decode_kernel<false><<<grid, kProjThreads, 0, s>>>(a);
  DSV4_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace dsv4::cuda::detail
