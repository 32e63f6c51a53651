// Lightning-indexer scores on bf16 tensor cores (Fast precision; the official demo scores in
// bf16 too): score(s) = Σ_h ω_h ReLU(q_h · K_s) with q and the keys rounded to bf16 and fp32
// accumulation. The fp32 register-tiled kernel (ops_indexer.cu, the Exact twin) ran at ~4
// TFLOP/s: 65536 entries took ~250 us of a decode step's indexer.
// A warp scores 16-entry tiles: entries are the M side of mma.m16n8k16 (keys loaded straight
// into A fragments: fp32 rounded in registers, or bf16 pairs as a Fast cache stores them), heads
// the N side (q staged once per CTA in shared memory as bf16), so one key byte is read from DRAM
// once and every head's score of an entry ends in the registers of one lane quad, where ReLU, ω
// and the head sum are applied.
// Fragment mapping (g = lane / 4, q = lane % 4): rows g, g+8 are entries, column g of B is head
// 8j + g. In the pair of k steps 2p, 2p + 1, logical k (2q, 2q+1, 2q+8, 2q+9) of step 2p + t
// maps to the physical dims 32p + 8q + 4t + (0, 1, 2, 3) for A and B alike (the mma does not
// care which k is which as long as they agree): a lane's 8 bf16 keys of a step pair are one
// 16-byte load, 64 contiguous bytes per row and instruction (8-byte loads of 16s + 4q spread a
// tile over twice the L1 wavefronts; ncu: L1 70% busy).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/bf16_fragments.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_mma.h"
#include "backend/cuda/ops_indexer_select.h"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kCtasPerSm = 2;                          // at 124-128 registers per thread
constexpr int kMaxSteps = kIndexerMmaMaxDim / 16;      // k steps of 16 dims
constexpr int kMaxPairs = kMaxSteps / 2;                // pairs of them (one 16-byte bf16 load)
constexpr int kMaxHeadTiles = kIndexerMmaMaxHeads / 8;  // n tiles of 8 heads
constexpr int kQPad = 8;                               // bf16 per q row of padding (bank spread)

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One lane's key values of a 16-entry tile: per step pair p, the physical dims 32p + 8q .. + 7 of
// rows g and g + 8, as loaded (fp32: two float4 each, rounded to bf16 pairs at the mma; bf16:
// the stored pairs, 16 bytes each, the same bits as that rounding).
template <typename Key>
struct TileKeys;

template <>
struct TileKeys<float> {
  float4 a[kMaxPairs][2], b[kMaxPairs][2];
  __device__ __forceinline__ void load(const void* keys, int64_t ea, int64_t eb, int64_t n, int hd, int pairs, int qd) {
    const float* k = static_cast<const float*>(keys);
    const float* ka = ea < n ? k + ea * hd + 8 * qd : nullptr;
    const float* kb = eb < n ? k + eb * hd + 8 * qd : nullptr;
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p)  // the tile's key bytes are in flight together
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        a[p][t] = p < pairs && ka ? __ldg(reinterpret_cast<const float4*>(ka + 32 * p + 4 * t)) : z;
        b[p][t] = p < pairs && kb ? __ldg(reinterpret_cast<const float4*>(kb + 32 * p + 4 * t)) : z;
      }
  }
  // A fragment registers of step 2p + t: (row g, dims 0-1), (row g+8, 0-1), (row g, 2-3), (row g+8, 2-3).
  __device__ __forceinline__ void frag(int p, int t, uint32_t& a0, uint32_t& a1, uint32_t& a2, uint32_t& a3) const {
    a0 = pack_bf16(a[p][t].x, a[p][t].y), a1 = pack_bf16(b[p][t].x, b[p][t].y);
    a2 = pack_bf16(a[p][t].z, a[p][t].w), a3 = pack_bf16(b[p][t].z, b[p][t].w);
  }
};

template <>
struct TileKeys<__nv_bfloat16> {
  uint4 a[kMaxPairs], b[kMaxPairs];
  __device__ __forceinline__ void load(const void* keys, int64_t ea, int64_t eb, int64_t n, int hd, int pairs, int qd) {
    const __nv_bfloat16* k = static_cast<const __nv_bfloat16*>(keys);
    const __nv_bfloat16* ka = ea < n ? k + ea * hd + 8 * qd : nullptr;
    const __nv_bfloat16* kb = eb < n ? k + eb * hd + 8 * qd : nullptr;
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p) {
      a[p] = p < pairs && ka ? __ldg(reinterpret_cast<const uint4*>(ka + 32 * p)) : z;
      b[p] = p < pairs && kb ? __ldg(reinterpret_cast<const uint4*>(kb + 32 * p)) : z;
    }
  }
  __device__ __forceinline__ void frag(int p, int t, uint32_t& a0, uint32_t& a1, uint32_t& a2, uint32_t& a3) const {
    a0 = t ? a[p].z : a[p].x, a1 = t ? b[p].z : b[p].x;
    a2 = t ? a[p].w : a[p].y, a3 = t ? b[p].w : b[p].y;
  }
};

// The warps of a row's CTAs take its 16-entry tiles in turn (tile k of warp w of CTA c: k = (c *
// kWarps + w) + i * gridDim.x * kWarps), so that q is staged once per CTA however long the row
// (a grid of 512-entry CTAs staged it 512 times at 256k entries: the scores took 47 us where their
// bytes take 16) and every warp gets within one tile of the same count. bf16 keys hold half the
// registers of fp32 ones: the next tile's loads are issued before this tile's mmas.
// hist (optional, [rows, kSelectBins], zeroed): the scores' histogram for the multi-block top-k
// (ops_indexer_select.h), counted in shared memory and added once per CTA: the selection's own
// histogram pass re-read the scores (~8 us at 256k entries).
template <typename Key>
__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm)
    indexer_score_mma_kernel(const float* __restrict__ q, const float* __restrict__ omega, const IndexerRow* rows,
                             int nh, int hd, float* __restrict__ scores, int64_t ld, uint32_t* __restrict__ hist) {
  constexpr bool kAhead = sizeof(Key) == 2;
  constexpr int kQLoads = kIndexerMmaMaxHeads * kIndexerMmaMaxDim / 4 / (kWarps * 32);
  __shared__ __align__(16) __nv_bfloat16 Qs[kIndexerMmaMaxHeads][kIndexerMmaMaxDim + kQPad];
  __shared__ uint32_t bins[kSelectBins];
  const int64_t r = blockIdx.y;
  const IndexerRow row = rows[r];
  const int64_t n = row.n_visible, stride = static_cast<int64_t>(gridDim.x) * kWarps * 16;
  if (static_cast<int64_t>(blockIdx.x) * kWarps * 16 >= n) return;  // no tile for this CTA
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int pairs = hd / 32, head_tiles = nh / 8, hd4 = hd / 4;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16;  // this warp's first tile
  TileKeys<Key> cur, nxt;
  if constexpr (kAhead) cur.load(row.keys, first + g, first + g + 8, n, hd, pairs, qd);
  if (hist)
    for (int b = tid; b < kSelectBins; b += kWarps * 32) bins[b] = 0;
  {  // q of this row as bf16: every load in flight before the first store
    float4 v[kQLoads];
#pragma unroll
    for (int j = 0; j < kQLoads; ++j) {
      const int i = tid + j * kWarps * 32;
      v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i < nh * hd4) v[j] = __ldg(reinterpret_cast<const float4*>(q + r * nh * hd) + i);
    }
#pragma unroll
    for (int j = 0; j < kQLoads; ++j) {
      const int i = tid + j * kWarps * 32;
      if (i < nh * hd4)
        *reinterpret_cast<uint2*>(&Qs[i / hd4][4 * (i % hd4)]) =
            make_uint2(pack_bf16(v[j].x, v[j].y), pack_bf16(v[j].z, v[j].w));
    }
  }
  float om[kMaxHeadTiles][2];  // ω of heads 8j + 2qd, 8j + 2qd + 1: the C columns this lane holds
#pragma unroll
  for (int j = 0; j < kMaxHeadTiles; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) om[j][c] = j < head_tiles ? __ldg(omega + r * nh + 8 * j + 2 * qd + c) : 0.f;
  __syncthreads();

  for (int64_t e0 = first; e0 < n; e0 += stride) {
    const int64_t ea = e0 + g, eb = e0 + g + 8;
    if constexpr (kAhead) {
      if (e0 + stride < n) nxt.load(row.keys, ea + stride, eb + stride, n, hd, pairs, qd);
    } else {
      cur.load(row.keys, ea, eb, n, hd, pairs, qd);
    }
    float c[kMaxHeadTiles][4] = {};
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p) {
      if (p >= pairs) break;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        uint32_t a0, a1, a2, a3;
        cur.frag(p, t, a0, a1, a2, a3);
#pragma unroll
        for (int j = 0; j < kMaxHeadTiles; ++j) {
          if (j >= head_tiles) break;
          const uint2 b = *reinterpret_cast<const uint2*>(&Qs[8 * j + g][32 * p + 8 * qd + 4 * t]);
          mma_bf16(c[j], a0, a1, a2, a3, b.x, b.y);
        }
      }
    }
    if constexpr (kAhead) cur = nxt;
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
      if (ea < n) scores[r * ld + ea] = sa;
      if (eb < n) scores[r * ld + eb] = sb;
      if (hist && ea < n) atomicAdd(&bins[float_key(sa) >> kSelectBinShift], 1u);
      if (hist && eb < n) atomicAdd(&bins[float_key(sb) >> kSelectBinShift], 1u);
    }
  }
  if (!hist) return;
  __syncthreads();
  for (int b = tid; b < kSelectBins; b += kWarps * 32)
    if (bins[b]) atomicAdd(&hist[r * kSelectBins + b], bins[b]);
}

}  // namespace

bool indexer_mma_ok(int64_t nh, int64_t hd) {
  return nh >= 8 && nh % 8 == 0 && nh <= kIndexerMmaMaxHeads && hd >= 32 && hd % 32 == 0 && hd <= kIndexerMmaMaxDim;
}

void indexer_score_mma(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                       int64_t max_visible, float* scores, int64_t ld, cudaStream_t s, KeyFormat keys,
                       uint32_t* hist) {
  DSV4_CHECK(indexer_mma_ok(nh, hd), "indexer_score_mma: needs heads a multiple of 8 (<= ", kIndexerMmaMaxHeads,
             ") and head dim a multiple of 32 (<= ", kIndexerMmaMaxDim, ")");
  if (R == 0 || max_visible == 0) return;
  if (indexer_wgmma_ok(nh, hd)) return indexer_score_wgmma(q, omega, rows, R, max_visible, scores, ld, s, keys, hist);
  auto* kernel = keys == KeyFormat::BF16 ? indexer_score_mma_kernel<__nv_bfloat16> : indexer_score_mma_kernel<float>;
  // CTAs per row: enough for two per SM over the call (the kernel's occupancy), fewer where the
  // row has fewer tiles than CTAs x warps.
  const int64_t per_row =
      std::clamp<int64_t>(ceil_div(kCtasPerSm * sm_count(), R), 1, ceil_div(max_visible, kWarps * 16));
  for_row_ranges(R, [&](int64_t r0, int64_t n) {
    const dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(n));
    kernel<<<grid, kWarps * 32, 0, s>>>(q + r0 * nh * hd, omega + r0 * nh, rows + r0, static_cast<int>(nh),
                                        static_cast<int>(hd), scores + r0 * ld, ld,
                                        hist ? hist + r0 * kSelectBins : nullptr);
    DSV4_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace dsv4::cuda::detail

namespace dsv4::cuda {

bool indexer_bf16_keys_ok(int64_t nh, int64_t hd) { return detail::indexer_mma_ok(nh, hd); }

}  // namespace dsv4::cuda
