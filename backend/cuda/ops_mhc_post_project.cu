// hc_post that also does the next hc_pre's projection, at decode sizes (<= 4 rows, n <= 4; more
// rows: ops_mhc_post_project_tiled.cu, dispatched from here).
// The one-launch decode hc_pre (ops_mhc_decode.cu) spends most of its ~11 us on a chain of L2
// round trips after its wait: the projection of the new streams, a grid barrier, the gather of
// the slices, the norm's square sum over the whole row. hc_post has the new streams in registers
// as it makes them, so here its blocks also write, per block of 32 float4 columns:
//   - the next sub-layer's projection partials Σ fn[o, k] X'[k] (o < (2+n)n) over the block's
//     columns of every stream, with fn loaded into registers before the PDL wait (weights only);
//   - the streams' Gram matrix over those columns, G[j][k] = Σ X'_j X'_k (j <= k): the RMS of the
//     mixed row u = Σ pre_j X'_j is Σ_jk pre_j pre_k G[j][k], and X's own square sum is Σ G[j][j],
// into the mHC stash (row r, block b: slots b * P + [0, P), P = (2+n)n + n(n+1)/2). The next
// hc_pre (hc_pre_from_post) then gathers them (one L2 round trip, the streams' loads beside it),
// makes the gates and writes its column slice of u: no projection phase, no grid barrier and no
// second pass over the row.
// Precision: the projection partials and the square sum are the same sums in another order (as
// the split-K slices are); the norm's square sum via the Gram matrix is exact algebra but loses
// relative accuracy when the streams cancel each other in u (|u|² << Σ pre² |X_j|²), which the
// trained model's streams do not do (tests compare against the CPU at 1e-5).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/ops_mhc_decode.h"

namespace dsv4::cuda::detail {
namespace {

using mhc::kMaxN;

constexpr int kMaxOut = (2 + kMaxN) * kMaxN;             // 24 projection rows
constexpr int kMaxGram = kMaxN * (kMaxN + 1) / 2;         // 10 Gram entries
constexpr int kCols = 32;                                 // float4 columns per hc_post block
constexpr int kPostThreads = 32 * kMaxN;                  // warp k: stream k
constexpr int kMixThreads = 128;                          // hc_pre: one float4 column per thread
constexpr int kMaxBlocks = 64;                            // hc_post blocks a row (d <= 8192)
constexpr int kMaxSlots = kMaxBlocks * (kMaxOut + kMaxGram);

__host__ __device__ constexpr int gram_slots(int n) { return n * (n + 1) / 2; }
// Slot of G[j][k], j <= k, among the Gram entries (row-major upper triangle).
__host__ __device__ constexpr int gram_index(int j, int k, int n) { return j * n - j * (j - 1) / 2 + (k - j); }

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

struct PostProjectArgs {
  const float *post, *comb, *F, *F2;
  RoutedRows rt;
  float* X;
  const float* fn;  // the next hc_pre's [(2+n)n, n d]
  int n, n_out, slots;
  int64_t d4, ld;   // ld: the stash's row stride (floats)
  float* stash;
};

// Grid (ceil(d4 / 32), R), 128 threads: warp k makes stream k of the block's 32 columns.
__global__ void __launch_bounds__(kPostThreads) hc_post_project_kernel(PostProjectArgs a) {
  pdl_trigger();  // the hc_pre after this one may load its norm weights
  __shared__ float4 xs[kMaxN][kCols];
  __shared__ float red[kMaxN][kMaxOut + kMaxN];
  const int k = threadIdx.x >> 5, lane = threadIdx.x & 31, n = a.n, n_out = a.n_out;
  const int64_t r = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * kCols + lane, d4 = a.d4;
  const bool live = c < d4 && k < n;
  // Weights before the wait (pdl.cuh): stream k's column c of every projection row, all loads
  // in flight together.
  const float4* F4 = reinterpret_cast<const float4*>(a.fn) + k * d4 + c;
  float4 f[kMaxOut];
#pragma unroll
  for (int o = 0; o < kMaxOut; ++o) f[o] = live ? __ldg(F4 + min(o, n_out - 1) * n * d4) : make_float4(0, 0, 0, 0);
  pdl_wait();
  float4* X4 = reinterpret_cast<float4*>(a.X) + r * n * d4;
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
  if (live) {
    const float4 in = mhc::post_input(a.F, a.F2, a.rt, r, d4, c);
    float4 old[kMaxN];
#pragma unroll
    for (int j = 0; j < kMaxN; ++j)
      if (j < n) old[j] = X4[j * d4 + c];
    x = mhc::post_stream<kMaxN>(in, a.post[r * n + k], a.comb + r * n * n, k, n, old);
  }
  xs[k][lane] = x;
  __syncthreads();  // every warp has read the old streams of these columns
  if (live) X4[k * d4 + c] = x;
  float acc[kMaxOut + kMaxN];
#pragma unroll
  for (int o = 0; o < kMaxOut; ++o) acc[o] = dot4(f[o], x);
#pragma unroll
  for (int j = 0; j < kMaxN; ++j) acc[kMaxOut + j] = j >= k ? dot4(x, xs[j][lane]) : 0.f;  // G[k][j]
#pragma unroll
  for (int o = 0; o < kMaxOut + kMaxN; ++o) {
    const float v = warp_sum(acc[o]);
    if (lane == 0) red[k][o] = v;
  }
  __syncthreads();
  // Slot t: projection row t summed over the streams in order, or Gram entry (j, k) from warp j.
  const int t = threadIdx.x;
  if (t >= a.slots) return;
  float v = 0.f;
  if (t < n_out) {
    for (int s = 0; s < n; ++s) v += red[s][t];
  } else {
    int j = 0, g = t - n_out;
    while (g >= n - j) g -= n - j++;
    v = red[j][kMaxOut + j + g];
  }
  a.stash[r * a.ld + blockIdx.x * a.slots + t] = v;
}

struct FromPostArgs {
  const float* X;
  HcParams p;
  int n, n_out, slots, blocks, iters, mix_blocks;
  int64_t d4, ld;
  float hc_eps, rms_eps, norm_eps;
  const float* norm_w;  // nullptr: u is the plain mix
  const float* stash;
  float *pre, *post, *comb, *u;
};

// Grid (R, mix_blocks [+ 1]), 128 threads: blocks y < mix_blocks write float4 columns
// y * 128 + t of u; a block past them writes the gates (pre, post, Sinkhorn's comb).
__global__ void __launch_bounds__(kMixThreads) hc_pre_from_post_kernel(FromPostArgs a) {
  __shared__ float part[kMaxSlots];
  __shared__ float mu[kMaxOut + kMaxGram];
  __shared__ float s_pre[kMaxN];
  __shared__ float s_inv;
  const int64_t r = blockIdx.x, d4 = a.d4;
  const int n = a.n, n_out = a.n_out, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool mixing = static_cast<int>(blockIdx.y) < a.mix_blocks;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kMixThreads + threadIdx.x;
  const bool col = mixing && c < d4;
  float4 g = make_float4(1.f, 1.f, 1.f, 1.f);
  if (col && a.norm_w) g = __ldg(reinterpret_cast<const float4*>(a.norm_w) + c);  // a weight: before the wait
  pdl_wait();
  // The streams' loads and the partials' go out together: one round trip.
  const float4* X4 = reinterpret_cast<const float4*>(a.X) + r * n * d4;
  float4 x[kMaxN];
#pragma unroll
  for (int j = 0; j < kMaxN; ++j) x[j] = col && j < n ? __ldcg(X4 + j * d4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
  const float* st = a.stash + r * a.ld;
  const int total = a.blocks * a.slots;
  for (int i = threadIdx.x; i < total; i += kMixThreads) part[i] = __ldcg(st + i);
  __syncthreads();
  // Slot sums over the blocks, lanes over blocks then a fixed shuffle tree: deterministic.
  for (int o = warp; o < a.slots; o += kMixThreads / 32) {
    float v = 0.f;
    for (int b = lane; b < a.blocks; b += 32) v += part[b * a.slots + o];
    v = warp_sum(v);
    if (lane == 0) mu[o] = v;
  }
  __syncthreads();
  const float* G = mu + n_out;
  float ss = 0.f;  // Σ X², every thread alike
  for (int j = 0; j < n; ++j) ss += G[gram_index(j, j, n)];
  const float rho = mhc::rms_factor(ss, n * d4 * 4, a.rms_eps);
  if (!mixing) {  // the gates block: hc_pre_finish_kernel's gates, warp 0
    if (warp == 0) {
      if (lane < n) {
        a.pre[r * n + lane] = sigmoidf_(a.p.scale[0] * (mu[lane] * rho) + a.p.base[lane]) + a.hc_eps;
        a.post[r * n + lane] = 2.0f * sigmoidf_(a.p.scale[1] * (mu[n + lane] * rho) + a.p.base[n + lane]);
      }
      const int e = lane < n * n ? lane : 0;
      const float m0 = a.p.scale[2] * (mu[2 * n + e] * rho) + a.p.base[2 * n + e];
      const float m = mhc::sinkhorn_warp(m0, n, a.iters, a.hc_eps);
      if (lane < n * n) a.comb[r * n * n + lane] = m;
    }
    return;
  }
  if (threadIdx.x < n)
    s_pre[threadIdx.x] = sigmoidf_(a.p.scale[0] * (mu[threadIdx.x] * rho) + a.p.base[threadIdx.x]) + a.hc_eps;
  __syncthreads();
  if (threadIdx.x == 0) {
    float inv = 1.f;
    if (a.norm_w) {  // |u|² = Σ_jk pre_j pre_k G[j][k]
      double q = 0.0;
      for (int j = 0; j < n; ++j)
        for (int k = j; k < n; ++k)
          q += (j == k ? 1.0 : 2.0) * double(s_pre[j]) * double(s_pre[k]) * double(G[gram_index(j, k, n)]);
      inv = 1.0f / sqrtf(static_cast<float>(q / (4 * d4)) + a.norm_eps);
    }
    s_inv = inv;
  }
  __syncthreads();
  if (!col) return;
  float4 v = mhc::mix_values<kMaxN>(x, s_pre, n);
  float4* U4 = reinterpret_cast<float4*>(a.u) + r * d4;
  if (a.norm_w) {
    const float inv = s_inv;
    v = make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
  }
  U4[c] = v;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool g_enabled = [] {
  const char* e = std::getenv("DSV4_HC_PROJECT_IN_POST");
  return !(e && e[0] == '0');
}();

int post_blocks(int64_t d) { return static_cast<int>(ceil_div(d / 4, kCols)); }
int slots_of(int64_t n) { return static_cast<int>((2 + n) * n + gram_slots(static_cast<int>(n))); }

}  // namespace

void set_hc_project_in_post(bool on) { g_enabled = on; }

bool hc_post_project_applies(int64_t R, int64_t n, int64_t d) {
  if (!g_enabled || R < 1) return false;
  if (R > 4) return hc_post_project_tiled_slices(R, n, d) > 0;
  return n >= 1 && n <= kMaxN && d % 4 == 0 && post_blocks(d) <= kMaxBlocks &&
         post_blocks(d) * slots_of(n) <= d;  // the stash row holds them
}

bool hc_post_project(const float* post, const float* comb, const float* F, const float* F2, const RoutedRows* routed,
                     float* X, int64_t R, int64_t n, int64_t d, const HcParams& next, float* stash, cudaStream_t s) {
  if (!hc_post_project_applies(R, n, d) || !aligned16(X) || !aligned16(F) || (F2 && !aligned16(F2)) ||
      !aligned16(next.fn))
    return false;
  if (R > 4) {
    if (routed && routed->K > mhc::kMaxRoutedK) return false;  // the tiled form holds up to kMaxRoutedK a row
    hc_post_project_tiled(post, comb, F, F2, routed, X, R, n, d, next.fn, stash, s);
    return true;
  }
  PostProjectArgs a{};
  a.post = post;
  a.comb = comb;
  a.F = F;
  a.F2 = F2;
  if (routed) a.rt = *routed;
  a.X = X;
  a.fn = next.fn;
  a.n = static_cast<int>(n);
  a.n_out = static_cast<int>((2 + n) * n);
  a.slots = slots_of(n);
  a.d4 = d / 4;
  a.ld = d;
  a.stash = stash;
  const dim3 grid(static_cast<unsigned>(post_blocks(d)), static_cast<unsigned>(R));
  launch_dependent(hc_post_project_kernel, grid, dim3(kPostThreads), 0, s, a);
  DSV4_CUDA_LAUNCH_CHECK();
  return true;
}

void hc_pre_from_post(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
                      float rms_eps, const float* norm_w, float norm_eps, float* pre, float* post, float* comb,
                      float* u, const float* stash, bool gates, bool mix, cudaStream_t s) {
  DSV4_CHECK(R <= 4 && hc_post_project_applies(R, n, d) && aligned16(X) && aligned16(u) &&
                 (!norm_w || aligned16(norm_w)),
             "cuda::hc_pre: the stash holds no hc_post projection for this shape");
  FromPostArgs a{};
  a.X = X;
  a.p = p;
  a.n = static_cast<int>(n);
  a.n_out = static_cast<int>((2 + n) * n);
  a.slots = slots_of(n);
  a.blocks = post_blocks(d);
  a.iters = static_cast<int>(iters);
  a.mix_blocks = mix ? static_cast<int>(ceil_div(d / 4, kMixThreads)) : 0;
  a.d4 = d / 4;
  a.ld = d;
  a.hc_eps = hc_eps;
  a.rms_eps = rms_eps;
  a.norm_eps = norm_eps;
  a.norm_w = norm_w;
  a.stash = stash;
  a.pre = pre;
  a.post = post;
  a.comb = comb;
  a.u = u;
  const dim3 grid(static_cast<unsigned>(R), static_cast<unsigned>(a.mix_blocks + (gates ? 1 : 0)));
  if (grid.y == 0) return;
  if (mix)  // after hc_post_project on s
    launch_dependent(hc_pre_from_post_kernel, grid, dim3(kMixThreads), 0, s, a);
  else  // the gates alone, on a side stream that waited for it
    hc_pre_from_post_kernel<<<grid, kMixThreads, 0, s>>>(a);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
