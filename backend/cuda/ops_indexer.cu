// Lightning-indexer scores and top-k (twin: indexer_select's scoring loop + topk_indices).
// Kernel 1: a block scores 64 entries of one row against all heads as a 64×64 register-tiled
// fp32 GEMM (Q [heads, hd] · K^T), then ReLU, ω-weighting and the head sum. Kernel 2: one block
// per row selects the top-k by 8-bit radix select over the scores (ties at the threshold taken
// in index order), then bitonic-sorts the picks by (score desc, index asc).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/radix_select.cuh"

namespace dsv4::cuda {

using detail::ceil_div;
using detail::float_key;

namespace {

constexpr int kTS = 64;   // entries per block
constexpr int kTH = 64;   // heads per pass
constexpr int kKC = 32;   // head-dim chunk staged in shared memory
constexpr int kScoreThreads = 256;

__global__ void __launch_bounds__(kScoreThreads)
    indexer_score_kernel(const float* q, const float* omega, const IndexerRow* rows, int64_t nh, int64_t hd,
                         float* scores, int64_t ld) {
  __shared__ __align__(16) float Qs[kKC][kTH];  // transposed: 4 consecutive heads = one float4
  __shared__ __align__(16) float Ks[kKC][kTS];
  __shared__ float red[16][kTS];
  const int64_t r = blockIdx.y;
  const IndexerRow row = rows[r];
  const int64_t s0 = blockIdx.x * int64_t(kTS);
  if (s0 >= row.n_visible) return;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;  // keys 4tx.., heads 4ty..
  float part[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t h0 = 0; h0 < nh; h0 += kTH) {
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < hd; k0 += kKC) {
      // Stage Q and K chunks transposed; lanes take consecutive heads / entries (conflict-free stores).
      for (int idx = tid; idx < kTH * (kKC / 4); idx += kScoreThreads) {
        const int e = idx % kTH, j = idx / kTH;
        const int64_t k = k0 + 4 * j;
        float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv = qv;
        if (h0 + e < nh && k < hd) qv = *reinterpret_cast<const float4*>(q + (r * nh + h0 + e) * hd + k);
        if (s0 + e < row.n_visible && k < hd) kv = *reinterpret_cast<const float4*>(row.keys + (s0 + e) * hd + k);
        Qs[4 * j][e] = qv.x, Qs[4 * j + 1][e] = qv.y, Qs[4 * j + 2][e] = qv.z, Qs[4 * j + 3][e] = qv.w;
        Ks[4 * j][e] = kv.x, Ks[4 * j + 1][e] = kv.y, Ks[4 * j + 2][e] = kv.z, Ks[4 * j + 3][e] = kv.w;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kKC; ++kk) {
        const float4 a = *reinterpret_cast<const float4*>(&Qs[kk][4 * ty]);
        const float4 b = *reinterpret_cast<const float4*>(&Ks[kk][4 * tx]);
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t h = h0 + 4 * ty + i;
      if (h >= nh) continue;
      const float om = omega[r * nh + h];
#pragma unroll
      for (int j = 0; j < 4; ++j) part[j] += om * fmaxf(acc[i][j], 0.f);
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) red[ty][4 * tx + j] = part[j];
  __syncthreads();
  if (tid < kTS && s0 + tid < row.n_visible) {
    float v = 0.f;
    for (int g = 0; g < 16; ++g) v += red[g][tid];
    scores[r * ld + s0 + tid] = v;
  }
}

constexpr int kSelThreads = 1024;
constexpr int kMaxTopk = 2048;

// Composite sort key: score key high, complemented index low, so that descending order is
// (score desc, index asc) and all keys are distinct.
__device__ __forceinline__ uint64_t pick_key(uint32_t k, int64_t i) {
  return (uint64_t(k) << 32) | uint32_t(~uint32_t(i));
}

__global__ void __launch_bounds__(kSelThreads)
    indexer_select_kernel(const float* scores, int64_t ld, const IndexerRow* rows, int64_t topk, int32_t* out) {
  __shared__ detail::RadixScratch<uint32_t> rs;
  __shared__ uint64_t cand[kMaxTopk];
  __shared__ uint32_t warp_ties[kSelThreads / 32];
  __shared__ uint32_t n_above;
  const int64_t r = blockIdx.x, n = rows[r].n_visible;
  const float* sc = scores + r * ld;
  const int64_t kk = std::min<int64_t>(topk, n);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int64_t P = 1;
  while (P < kk) P <<= 1;
  if (kk > 0) {
    auto key = [&](int64_t i) { return float_key(sc[i]); };
    auto one = [](int64_t) { return 1u; };
    const uint32_t thr = detail::block_radix_select<uint32_t>(key, one, n, static_cast<uint32_t>(kk), rs);
    const uint32_t need_ties = rs.remaining, n_gt = static_cast<uint32_t>(kk) - need_ties;
    if (tid == 0) n_above = 0;
    __syncthreads();
    // Keys above the threshold go anywhere in [0, n_gt) (the sort orders them); keys equal to it
    // are ranked in index order by a block scan, the first need_ties taken (lower index first).
    uint32_t ties_before = 0;
    for (int64_t base = 0; base < n; base += kSelThreads) {
      const int64_t i = base + tid;
      const uint32_t k = i < n ? key(i) : 0u;
      if (i < n && k > thr) cand[atomicAdd(&n_above, 1u)] = pick_key(k, i);
      const bool tie = i < n && k == thr;
      const unsigned ball = __ballot_sync(detail::kFull, tie);
      if (lane == 0) warp_ties[warp] = __popc(ball);
      __syncthreads();
      uint32_t before = 0, total = 0;
      for (int w = 0; w < kSelThreads / 32; ++w) {
        before += w < warp ? warp_ties[w] : 0u;
        total += warp_ties[w];
      }
      const uint32_t rank = ties_before + before + __popc(ball & ((1u << lane) - 1u));
      if (tie && rank < need_ties) cand[n_gt + rank] = pick_key(k, i);
      ties_before += total;
      __syncthreads();
    }
    for (int64_t i = kk + tid; i < P; i += kSelThreads) cand[i] = 0;  // pads sort last
    __syncthreads();
    // Bitonic sort, descending.
    for (int64_t k = 2; k <= P; k <<= 1) {
      for (int64_t j = k >> 1; j > 0; j >>= 1) {
        for (int64_t i = tid; i < P; i += kSelThreads) {
          const int64_t ixj = i ^ j;
          if (ixj > i) {
            const uint64_t a = cand[i], b = cand[ixj];
            if (((i & k) == 0) ? (a < b) : (a > b)) {
              cand[i] = b;
              cand[ixj] = a;
            }
          }
        }
        __syncthreads();
      }
    }
  }
  for (int64_t i = tid; i < topk; i += kSelThreads)
    out[r * topk + i] = i < kk ? static_cast<int32_t>(~static_cast<uint32_t>(cand[i])) : -1;
}

}  // namespace

void indexer_topk(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                  int64_t topk, int64_t max_visible, int32_t* out, cudaStream_t s) {
  DSV4_CHECK(hd % 4 == 0, "cuda::indexer_topk: head dim must be a multiple of 4");
  DSV4_CHECK(topk >= 1 && topk <= kMaxTopk, "cuda::indexer_topk: topk must be in [1, ", kMaxTopk, "]");
  DSV4_CHECK(max_visible >= 0 && max_visible < (int64_t(1) << 31), "cuda::indexer_topk: bad max_visible");
  if (R == 0) return;
  float* scores = nullptr;
  const int64_t ld = std::max<int64_t>(max_visible, 1);
  // Stream-ordered scratch: no host sync, and capturable into a CUDA graph.
  DSV4_CUDA_CHECK(cudaMallocAsync(&scores, R * ld * sizeof(float), s));
  if (max_visible > 0) {
    const dim3 grid(static_cast<unsigned>(ceil_div(max_visible, kTS)), static_cast<unsigned>(R));
    indexer_score_kernel<<<grid, kScoreThreads, 0, s>>>(q, omega, rows, nh, hd, scores, ld);
    DSV4_CUDA_LAUNCH_CHECK();
  }
  indexer_select_kernel<<<R, kSelThreads, 0, s>>>(scores, ld, rows, topk, out);
  DSV4_CUDA_LAUNCH_CHECK();
  DSV4_CUDA_CHECK(cudaFreeAsync(scores, s));
}

void indexer_topk(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                  int64_t topk, int32_t* out, cudaStream_t s) {
  // The score buffer's row stride needs max n_visible: read the row table back (synchronous).
  std::vector<IndexerRow> host(static_cast<size_t>(R));
  if (R) DSV4_CUDA_CHECK(cudaMemcpyAsync(host.data(), rows, R * sizeof(IndexerRow), cudaMemcpyDeviceToHost, s));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
  int64_t mx = 0;
  for (const auto& h : host) mx = std::max(mx, h.n_visible);
  indexer_topk(q, omega, rows, R, nh, hd, topk, mx, out, s);
}

}  // namespace dsv4::cuda
