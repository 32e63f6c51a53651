// Lightning-indexer scores and top-k (twin: indexer_select's scoring loop + topk_indices).
// Exact: a block scores 64 entries of one row against all heads as a 64×64 register-tiled fp32
// GEMM (Q [heads, hd] · K^T), then ReLU, ω-weighting and the head sum; Fast: bf16 tensor cores
// (ops_indexer_mma.cu). The top-k over the score buffer is ops_indexer_select.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/async_scratch.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_mma.h"
#include "backend/cuda/ops_indexer_select.h"

namespace dsv4::cuda {

using detail::ceil_div;

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
  const float* keys = static_cast<const float*>(row.keys);
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
        if (s0 + e < row.n_visible && k < hd) kv = *reinterpret_cast<const float4*>(keys + (s0 + e) * hd + k);
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

}  // namespace

void indexer_topk(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                  int64_t topk, int64_t max_visible, int32_t* out, cudaStream_t s, bool fast, KeyFormat keys) {
  DSV4_CHECK(hd % 4 == 0, "cuda::indexer_topk: head dim must be a multiple of 4");
  DSV4_CHECK(topk >= 1 && topk <= detail::kMaxIndexerTopk, "cuda::indexer_topk: topk must be in [1, ",
             detail::kMaxIndexerTopk, "]");
  DSV4_CHECK(max_visible >= 0 && max_visible < (int64_t(1) << 31), "cuda::indexer_topk: bad max_visible");
  DSV4_CHECK(keys == KeyFormat::F32 || (fast && detail::indexer_mma_ok(nh, hd)),
             "cuda::indexer_topk: bf16 keys need Fast precision and the tensor-core scorer's shape (heads a multiple "
             "of 8 up to 64, head dim a multiple of 32 up to 128); got ", nh, " x ", hd,
             fast ? "" : " in Exact precision");
  if (R == 0) return;
  const int64_t ld = std::max<int64_t>(max_visible, 1);
  // Stream-ordered scratch: no host sync, and capturable into a CUDA graph.
  float* scores = async_scratch_of<float>(R * ld, s);
  uint32_t* hist = nullptr;    // built by the Fast scorer for the multi-block select
  uint32_t* counts = nullptr;  // the select's per-row counters, after hist: one memset for both
  if (max_visible > 0 && fast && detail::indexer_mma_ok(nh, hd)) {
    if (max_visible >= detail::kLargeRow) {
      hist = async_scratch_of<uint32_t>(R * (detail::kSelectBins + 2), s);
      counts = hist + R * detail::kSelectBins;
      DSV4_CUDA_CHECK(cudaMemsetAsync(hist, 0, R * (detail::kSelectBins + 2) * sizeof(uint32_t), s));
    }
    detail::indexer_score_mma(q, omega, rows, R, nh, hd, max_visible, scores, ld, s, keys, hist);
  } else if (max_visible > 0) {
    detail::for_row_ranges(R, [&](int64_t r0, int64_t n) {
      const dim3 grid(static_cast<unsigned>(ceil_div(max_visible, kTS)), static_cast<unsigned>(n));
      indexer_score_kernel<<<grid, kScoreThreads, 0, s>>>(q + r0 * nh * hd, omega + r0 * nh, rows + r0, nh, hd,
                                                          scores + r0 * ld, ld);
      DSV4_CUDA_LAUNCH_CHECK();
    });
  }
  detail::indexer_select(scores, ld, rows, R, topk, max_visible, out, s, hist, counts);
  if (hist) async_release(hist, s);
  async_release(scores, s);
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
