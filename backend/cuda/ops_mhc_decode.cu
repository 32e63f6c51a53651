// hc_pre at decode sizes in one launch. The split-K projection, its reduction + mixing, and the
// sub-layer's RMS norm of the mixed row were three dependent launches of latency-bound kernels
// (~20 us per call at one row, 16 calls per 8-layer step: ~15% of a batch-1 step). Here one grid
// of R x (ks + 1) blocks, all resident at once (checked: at most one block per SM), runs them as
// phases separated by grid barriers:
//   1. blocks (r, j < ks): projection slice j of row r into the stash (mhc::project_slice, the
//      split-K kernel's own code and slices: the same bits);
//   2. every block gathers mu; block (r, ks) writes the gates and runs Sinkhorn (or, with a gates
//      stream, hc_pre's gates kernel does so there from the stash, beside what follows), blocks
//      j < ks (norm: sum the squares of the whole mixed row, each block alike, then) write
//      column slice j of u (= w * (u / rms) with the norm).
// The barrier is a counter + sense flag in device memory, reset by the last block to arrive, so
// a graph replays it as is. Trace of one call at one row (bench_ops, 1980 MHz): projection 3.8k
// cycles, barrier 3.8k, mu gather 3.8k, mixing 2.2k, second barrier (the norm's slice sums)
// 3.6k, norm 1.6k: hence the acq_rel barrier, the one-round gather and no second barrier.
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
// arriving, so it cannot flip before this block has seen it. acq_rel fences and a tight acquire
// spin: the sc fences (__threadfence) and a __nanosleep poll measured ~3800 cycles per barrier.
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ void grid_sync(GridBarrier* b, unsigned n) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned s0 = load_acquire(&b->sense);
    fence_acq_rel();
    if (atomicAdd(&b->count, 1u) == n - 1) {
      b->count = 0;  // ordered before the flip by the release below
      fence_acq_rel();
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&b->sense), "r"(s0 ^ 1u) : "memory");
    } else {
      while (load_acquire(&b->sense) == s0) {
      }
    }
    fence_acq_rel();
  }
  __syncthreads();
}

struct DecodeArgs {
  const float* X;
  HcParams p;
  int n, ks, iters;
  int64_t d, slice4, per4;  // per4: float4 columns of u per mixing block
  float hc_eps, rms_eps, norm_eps;
  const float* norm_w;  // nullptr: u is the plain mix
  float* stash;         // [R, d] projection partials
  GridBarrier* bar;
  float *pre, *post, *comb, *u;
  long long* trace;     // kTrace: [blocks][kTracePoints] clock64() of thread 0 at each phase end
};

constexpr int kTracePoints = 8;

// kGates: blocks (r, ks) write the gates (and run Sinkhorn); without them the caller runs the
// gates kernel on a side stream, off the critical path.
template <bool kGates, bool kTrace>
__global__ void __launch_bounds__(kProjThreads) hc_pre_decode_kernel(DecodeArgs a) {
  __shared__ float mu[(2 + kMaxN) * kMaxN + 1];
  __shared__ float s_pre[kMaxN];
  __shared__ double red[32];
  const int64_t r = blockIdx.x, R = gridDim.x;
  const int j = blockIdx.y, n = a.n, n_out = (2 + n) * n;
  const int64_t d = a.d, nd = n * d, d4 = d / 4;
  // Phase timestamps for tuning (bench_ops): 0 start, 1 projected, 2 barrier 1, 3 mu, 4 the
  // norm's square sum, 6 done.
  long long* tr = kTrace ? a.trace + (r * gridDim.y + j) * kTracePoints : nullptr;
  auto mark = [&](int point) {
    if constexpr (kTrace) {
      if (threadIdx.x == 0) tr[point] = clock64();
    }
  };
  mark(0);
  // Launched as a dependent of hc_post (pdl.cuh): until the wait, only weights. Blocks of row 0
  // ask L2 for their projection slice of every output (the slice's one DRAM round trip was most
  // of the projection phase), every mixing block for its slice of the norm weight.
  if (j < a.ks) {
    if (r == 0) mhc::prefetch_fn_slice(a.p.fn, nd, n_out, a.slice4, j);
    const int64_t m0 = std::min(d4, j * a.per4);
    if (a.norm_w && threadIdx.x == kProjThreads - 1 && m0 < d4)
      detail::prefetch_l2_span(a.norm_w + 4 * m0, static_cast<uint32_t>(16 * (std::min(d4, m0 + a.per4) - m0)));
  }
  detail::pdl_wait();
  if (j < a.ks) mhc::project_slice<(2 + kMaxN) * kMaxN, 1>(a.p.fn, a.X, R, nd, n_out, a.slice4, a.stash, d, r, j);
  mark(1);
  grid_sync(a.bar, static_cast<unsigned>(R * (a.ks + (kGates ? 1 : 0))));
  mark(2);
  mhc::gather_mu<8>(a.stash + r * d, n_out, a.ks, mu);
  __syncthreads();
  mark(3);
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
    mark(6);
    return;
  }
  if (threadIdx.x < n)
    s_pre[threadIdx.x] = detail::sigmoidf_(a.p.scale[0] * (mu[threadIdx.x] * rho) + a.p.base[threadIdx.x]) + a.hc_eps;
  __syncthreads();
  const float4* X4 = reinterpret_cast<const float4*>(a.X + r * nd);
  float4* U4 = reinterpret_cast<float4*>(a.u + r * d);
  const int64_t c0 = std::min(d4, j * a.per4), c1 = std::min(d4, c0 + a.per4);
  float inv = 1.f;
  if (a.norm_w) {
    // The norm's square sum over the whole row, by every block (the same code and order in
    // each, so they agree): ~64 KB of L2 reads per block instead of a second grid barrier and a
    // gather of per-slice sums (~2.6 us in the trace).
    double ss = 0.0;
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < d4; c += kProjThreads) {
      const float4 w = mhc::mix_column<kMaxN, false>(X4, s_pre, n, d4, c);
      ss += double(w.x) * w.x + double(w.y) * w.y + double(w.z) * w.z + double(w.w) * w.w;
    }
    ss = detail::block_sum(ss, red);
    inv = 1.0f / sqrtf(static_cast<float>(ss / d) + a.norm_eps);
    mark(4);
  }
  const float4* G4 = reinterpret_cast<const float4*>(a.norm_w);
  for (int64_t c = c0 + threadIdx.x; c < c1; c += kProjThreads) {
    const float4 v = mhc::mix_column<kMaxN, false>(X4, s_pre, n, d4, c);
    if (!a.norm_w) {
      U4[c] = v;
      continue;
    }
    const float4 g = G4[c];
    U4[c] = make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
  }
  mark(6);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool g_enabled = true;
long long* g_trace = nullptr;

}  // namespace

void set_hc_pre_decode_enabled(bool on) { g_enabled = on; }
void set_hc_pre_decode_trace(long long* buf) { g_trace = buf; }

int hc_pre_decode_slices(int64_t R, int64_t n, int64_t d) {
  const int64_t n_out = (2 + n) * n, nd4 = n * d / 4;
  // project()'s slice count for these rows (the split-K kernel's bits), then the residency bound.
  int64_t ks = ceil_div(2 * sm_count(), R);
  ks = std::min<int64_t>(ks, std::max<int64_t>(1, nd4 / kProjThreads));
  ks = std::max<int64_t>(1, std::min<int64_t>(ks, d / (n_out + 1)));
  if (!g_enabled || R < 1 || R > kMaxRows || n < 1 || n > kMaxN || d % 4 != 0 || R * (ks + 1) > sm_count()) return 0;
  return static_cast<int>(ks);
}

bool hc_pre_decode(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
                   float rms_eps, const float* norm_w, float norm_eps, float* pre, float* post, float* comb, float* u,
                   float* stash, bool gates, cudaStream_t s) {
  const int ks = hc_pre_decode_slices(R, n, d);
  if (ks == 0 || !aligned16(X) || !aligned16(u) || !aligned16(p.fn) || (norm_w && !aligned16(norm_w))) return false;
  static DeviceBuffer bar;
  if (!bar.get()) {  // once per process: a zero count and sense (the barrier resets itself after that)
    bar = DeviceBuffer(sizeof(GridBarrier));
    DSV4_CUDA_CHECK(cudaMemsetAsync(bar.get(), 0, bar.bytes(), s));
    note_scratch_alloc();
  }
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
  a.bar = bar.as<GridBarrier>();
  a.pre = pre;
  a.post = post;
  a.comb = comb;
  a.u = u;
  const dim3 grid(static_cast<unsigned>(R), static_cast<unsigned>(ks + (gates ? 1 : 0)));
  a.trace = g_trace;
  auto go = [&](auto kernel) { launch_dependent(kernel, grid, dim3(kProjThreads), 0, s, a); };
  if (g_trace)
    gates ? go(hc_pre_decode_kernel<true, true>) : go(hc_pre_decode_kernel<false, true>);
  else
    gates ? go(hc_pre_decode_kernel<true, false>) : go(hc_pre_decode_kernel<false, false>);
  DSV4_CUDA_LAUNCH_CHECK();
  return true;
}

}  // namespace dsv4::cuda::detail
