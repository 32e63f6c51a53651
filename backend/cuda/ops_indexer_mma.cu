// Lightning-indexer scores on bf16 tensor cores (Fast precision; the official demo scores in
// bf16 too): score(s) = Σ_h ω_h ReLU(q_h · K_s) with q and the keys rounded to bf16 and fp32
// accumulation. The fp32 register-tiled kernel (ops_indexer.cu, the Exact twin) ran at ~4
// TFLOP/s: 65536 entries took ~250 us of a decode step's indexer.
// A warp scores 16-entry tiles: entries are the M side of mma.m16n8k16 (keys loaded as fp32
// float4 straight into A fragments), heads the N side (q staged once per CTA in shared memory
// as bf16), so one key byte is read from DRAM once and every head's score of an entry ends in
// the registers of one lane quad, where ReLU, ω and the head sum are applied.
// Fragment mapping (g = lane / 4, q = lane % 4): rows g, g+8 are entries, column g of B is head
// 8j + g. Inside the 16-long k step s, logical k (2q, 2q+1, 2q+8, 2q+9) maps to the physical dims
// 16s + 4q + (0, 1, 2, 3) for A and B alike (the mma does not care which k is which as long as
// they agree), so a lane's four key values per step are one float4.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_mma.h"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kTilesPerWarp = 4;                       // 16-entry tiles per warp
constexpr int kEntriesPerCta = kWarps * kTilesPerWarp * 16;
constexpr int kMaxSteps = kIndexerMmaMaxDim / 16;      // k steps of 16 dims
constexpr int kMaxHeadTiles = kIndexerMmaMaxHeads / 8;  // n tiles of 8 heads
constexpr int kQPad = 8;                               // bf16 per q row of padding (bank spread)

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kWarps * 32)
    indexer_score_mma_kernel(const float* __restrict__ q, const float* __restrict__ omega, const IndexerRow* rows,
                             int nh, int hd, float* __restrict__ scores, int64_t ld) {
  __shared__ __align__(16) __nv_bfloat16 Qs[kIndexerMmaMaxHeads][kIndexerMmaMaxDim + kQPad];
  const int64_t r = blockIdx.y;
  const IndexerRow row = rows[r];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kEntriesPerCta;
  if (base >= row.n_visible) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int steps = hd / 16, head_tiles = nh / 8, hd4 = hd / 4;
  // q of this row as bf16: all loads first (one float4 per thread per round).
  for (int i = tid; i < nh * hd4; i += kWarps * 32) {
    const int h = i / hd4, c = 4 * (i % hd4);
    const float4 v = __ldg(reinterpret_cast<const float4*>(q + (r * nh + h) * hd + c));
    *reinterpret_cast<uint2*>(&Qs[h][c]) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
  }
  float om[kMaxHeadTiles][2];  // ω of heads 8j + 2qd, 8j + 2qd + 1: the C columns this lane holds
#pragma unroll
  for (int j = 0; j < kMaxHeadTiles; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) om[j][c] = j < head_tiles ? __ldg(omega + r * nh + 8 * j + 2 * qd + c) : 0.f;
  __syncthreads();

  for (int t = 0; t < kTilesPerWarp; ++t) {
    const int64_t e0 = base + (static_cast<int64_t>(warp) * kTilesPerWarp + t) * 16;
    if (e0 >= row.n_visible) break;
    const int64_t ea = e0 + g, eb = e0 + g + 8;
    const float* ka = ea < row.n_visible ? row.keys + ea * hd + 4 * qd : nullptr;
    const float* kb = eb < row.n_visible ? row.keys + eb * hd + 4 * qd : nullptr;
    float4 xa[kMaxSteps], xb[kMaxSteps];
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s) {  // the tile's key bytes are in flight together
      const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
      xa[s] = s < steps && ka ? __ldg(reinterpret_cast<const float4*>(ka + 16 * s)) : z;
      xb[s] = s < steps && kb ? __ldg(reinterpret_cast<const float4*>(kb + 16 * s)) : z;
    }
    float c[kMaxHeadTiles][4] = {};
#pragma unroll
    for (int s = 0; s < kMaxSteps; ++s) {
      if (s >= steps) break;
      const uint32_t a0 = pack_bf16(xa[s].x, xa[s].y), a1 = pack_bf16(xb[s].x, xb[s].y),
                     a2 = pack_bf16(xa[s].z, xa[s].w), a3 = pack_bf16(xb[s].z, xb[s].w);
#pragma unroll
      for (int j = 0; j < kMaxHeadTiles; ++j) {
        if (j >= head_tiles) break;
        const uint2 b = *reinterpret_cast<const uint2*>(&Qs[8 * j + g][16 * s + 4 * qd]);
        mma_bf16(c[j], a0, a1, a2, a3, b.x, b.y);
      }
    }
    float sa = 0.f, sb = 0.f;  // entries ea, eb: this lane's 2 heads per head tile
#pragma unroll
    for (int j = 0; j < kMaxHeadTiles; ++j) {
      sa += om[j][0] * fmaxf(c[j][0], 0.f) + om[j][1] * fmaxf(c[j][1], 0.f);
      sb += om[j][0] * fmaxf(c[j][2], 0.f) + om[j][1] * fmaxf(c[j][3], 0.f);
    }
    sa += __shfl_xor_sync(kFull, sa, 1);
    sa += __shfl_xor_sync(kFull, sa, 2);
    sb += __shfl_xor_sync(kFull, sb, 1);
    sb += __shfl_xor_sync(kFull, sb, 2);
    if (qd == 0) {
      if (ka) scores[r * ld + ea] = sa;
      if (kb) scores[r * ld + eb] = sb;
    }
  }
}

}  // namespace

bool indexer_mma_ok(int64_t nh, int64_t hd) {
  return nh >= 8 && nh % 8 == 0 && nh <= kIndexerMmaMaxHeads && hd >= 16 && hd % 16 == 0 && hd <= kIndexerMmaMaxDim;
}

void indexer_score_mma(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                       int64_t max_visible, float* scores, int64_t ld, cudaStream_t s) {
  DSV4_CHECK(indexer_mma_ok(nh, hd), "indexer_score_mma: needs heads a multiple of 8 (<= ", kIndexerMmaMaxHeads,
             ") and head dim a multiple of 16 (<= ", kIndexerMmaMaxDim, ")");
  if (R == 0 || max_visible == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(max_visible, kEntriesPerCta)), static_cast<unsigned>(R));
  indexer_score_mma_kernel<<<grid, kWarps * 32, 0, s>>>(q, omega, rows, static_cast<int>(nh), static_cast<int>(hd),
                                                        scores, ld);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
