// Routed experts on tensor cores at prefill sizes: tiles of up to kMmaWideTokens (64) tokens of
// one expert. The 8-token kernels (moe_mma.cu) re-read and re-convert an expert's weights for
// every 8 tokens: at 4096 tokens (~100 per expert) the experts were read ~12 times from L2 and
// the run took 15x its FLOP floor. Here each warp owns 16 weight rows over the whole K and
// converts each weight fragment once for up to 8 column groups of 8 tokens (8 mma per
// conversion instead of 1). The CTA's activation tile of the next 128-block is staged in shared
// memory by cp.async (read by all 8 warps) while the current one is multiplied, and each warp
// loads the next block's weights meanwhile: the first form, reading codes through L1 behind a
// shared-memory index per column group, ran no faster than the 8-token kernels (18.6 ms at
// 4096 tokens; staged: 11.9 ms, bench/NOTES.md step 4). On sm_90 the e4m3 mma is emulated (f16
// conversion of both operands per mma), so converting the weights once saves only the e2m1 step.
//
// Same bits as the 8-token kernels: those split K into kMmaKSlices slices (one per warp), each
// summed from zero, and add the slices in order. A warp here walks the same slices, starting
// each from zero, and folds it into a running total kept in shared memory (total = slice 0,
// then total += slice w), with the per-group and per-block scale products written exactly as
// in rows_times_tile. The CudaMoe test checks wide against narrow bitwise.
#include <cuda_fp8.h>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/moe_tiles.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = 8;                     // 16-row blocks per CTA
constexpr int kGroups = kMmaWideTokens / 8;   // 8-token column groups per tile

// Where column c of the tile takes its activation codes (row of the [*, K] code matrix) and its
// 128-block scales (column of the [K/128][ld_s] scale matrix): the same index for both.
struct WideOperand {
  const uint8_t* codes;
  const float* scales;
  int64_t ld, ld_s;
};

// The CTA's activation tile of one 128-block in shared memory: every column's 128 codes (rows
// padded to 144 bytes: the 16-byte reads of a quarter warp hit distinct banks) and its scale.
// Two of them: the next block is staged (cp.async) while the warps compute on this one.
constexpr int kCodePitch = 144;
struct ActStage {
  uint8_t codes[kMmaWideTokens][kCodePitch];
  float scales[kMmaWideTokens];
};

// Stages block kb of the tile's columns (only the 8-column groups that hold tokens); every
// thread of the CTA takes part and commits one cp.async group.
__device__ __forceinline__ void stage_block(ActStage& st, const WideOperand& x, const int32_t* col_row, int groups,
                                            int64_t kb) {
  const int chunks = groups * 8 * 8;  // 16-byte chunks: 8 per column
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const int col = c >> 3, part = c & 7;
    cp_async16(&st.codes[col][16 * part], x.codes + static_cast<int64_t>(col_row[col]) * x.ld + kb * 128 + 16 * part);
  }
  for (int col = threadIdx.x; col < groups * 8; col += blockDim.x)
    cp_async4(&st.scales[col], x.scales + kb * x.ld_s + col_row[col]);
  cp_async_commit();
}

// acc[m][n] += this 128-block's products for weight m and column group n (the arithmetic of
// rows_times_tile, term for term).
template <int NM>
__device__ __forceinline__ void block_products(const WBlock<NM>& w, const ActStage& st, int groups,
                                               float (&acc)[NM][kGroups][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  uint32_t ae[NM][4], ao[NM][4], be[NM][4], bo[NM][4];
  float s_a[NM][4], s_b[NM][4];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    const uint32_t wa[4] = {w.a[m].x, w.a[m].y, w.a[m].z, w.a[m].w}, wb[4] = {w.b[m].x, w.b[m].y, w.b[m].z, w.b[m].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      e2m1x8_e4m3(wa[j], ae[m][j], ao[m][j]);
      e2m1x8_e4m3(wb[j], be[m][j], bo[m][j]);
      s_a[m][j] = e8m0_dev(static_cast<uint8_t>(w.ea[m] >> (8 * j)));
      s_b[m][j] = e8m0_dev(static_cast<uint8_t>(w.eb[m] >> (8 * j)));
    }
  }
#pragma unroll
  for (int n = 0; n < kGroups; ++n) {
    if (n >= groups) break;
    // Columns past the tile's count hold column 0's codes: they only feed their own (unstored) outputs.
    const uint4 lo = *reinterpret_cast<const uint4*>(&st.codes[8 * n + g][32 * q]);
    const uint4 hi = *reinterpret_cast<const uint4*>(&st.codes[8 * n + g][32 * q + 16]);
    const float2 xs = *reinterpret_cast<const float2*>(&st.scales[8 * n + 2 * q]);
    const float x0 = xs.x, x1 = xs.y;
    const uint2 xc[4] = {make_uint2(lo.x, lo.y), make_uint2(lo.z, lo.w), make_uint2(hi.x, hi.y), make_uint2(hi.z, hi.w)};
    uint32_t xe[4], xo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) split_even_odd(xc[j], xe[j], xo[j]);
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float c[4];
        mma_e4m3(c, ae[m][j], be[m][j], ao[m][j], bo[m][j], xe[j], xo[j]);
        blk[0] += c[0] * s_a[m][j];
        blk[1] += c[1] * s_a[m][j];
        blk[2] += c[2] * s_b[m][j];
        blk[3] += c[3] * s_b[m][j];
      }
      acc[m][n][0] += blk[0] * x0;
      acc[m][n][1] += blk[1] * x1;
      acc[m][n][2] += blk[2] * x0;
      acc[m][n][3] += blk[3] * x1;
    }
  }
}

// total[m][n][i] (shared, this warp's, per lane) = Σ_k W_m[rows, k] x[cols of group n, k] for the
// NM weights that share x, over the warp's 16 rows [r0, r0 + 16); col_row[c] = the operand row of
// column c (count columns; the rest repeat column 0 and are never stored). Every thread of the
// CTA must call it (it stages the activation tiles for all warps).
template <int NM>
__device__ __forceinline__ void wide_rows_times_tile(const DevWeight* const (&w)[NM], int64_t r0, const WideOperand& x,
                                                     const int32_t* col_row, int count, int64_t nkb, ActStage* stages,
                                                     float (*total)[kGroups][4][32]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t rb = w[0]->in / 2, sc = w[0]->scale_cols;
  const uint8_t* pa[NM];
  const uint8_t* sa[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    pa[m] = w[m]->data + packed_row_offset(r0 + g, rb) + 16 * q;
    sa[m] = w[m]->scale + (r0 + g) * sc;
  }
  const int groups = (count + 7) / 8;  // CTA-uniform
  WBlock<NM> cur, next;
  if (nkb > 0) {
    stage_block(stages[0], x, col_row, groups, 0);
    load_block(cur, pa, sa, sc, 0);
  }
  int64_t kb = 0;
  for (int slice = 0; slice < kMmaKSlices; ++slice) {
    const int64_t kb1 = (slice + 1) * nkb / kMmaKSlices;
    float acc[NM][kGroups][4];
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int n = 0; n < kGroups; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
    for (; kb < kb1; ++kb) {
      // Block kb + 1 in flight (activations into the other stage, weights into registers) while
      // this one is multiplied.
      const bool more = kb + 1 < nkb;
      if (more) {
        stage_block(stages[(kb + 1) & 1], x, col_row, groups, kb + 1);
        load_block(next, pa, sa, sc, kb + 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // block kb's stage is complete for every warp
      block_products<NM>(cur, stages[kb & 1], groups, acc);
      __syncthreads();  // every warp is done with the stage block kb + 2 will overwrite
      if (more) cur = next;
    }
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int n = 0; n < kGroups; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float& t = total[m][n][i][lane];  // only this lane touches it: no barrier
          t = slice == 0 ? acc[m][n][i] : t + acc[m][n][i];
        }
  }
}

// Shared memory per CTA: each warp's running totals, the two activation stages, the tile's
// column rows.
template <int NM>
constexpr size_t totals_bytes() {
  return sizeof(float) * kWarps * NM * kGroups * 4 * 32;
}
template <int NM>
constexpr size_t wide_smem() {
  return totals_bytes<NM>() + 2 * sizeof(ActStage) + sizeof(int32_t) * kMmaWideTokens;
}

template <int NM>
__device__ __forceinline__ float (*warp_totals(unsigned char* smem))[kGroups][4][32] {
  float* base = reinterpret_cast<float*>(smem) + (threadIdx.x >> 5) * NM * kGroups * 4 * 32;
  return reinterpret_cast<float (*)[kGroups][4][32]>(base);
}
template <int NM>
__device__ __forceinline__ ActStage* stages_of(unsigned char* smem) {
  return reinterpret_cast<ActStage*>(smem + totals_bytes<NM>());
}
template <int NM>
__device__ __forceinline__ int32_t* col_rows_of(unsigned char* smem) {
  return reinterpret_cast<int32_t*>(smem + totals_bytes<NM>() + 2 * sizeof(ActStage));
}

__global__ void __launch_bounds__(kWarps * 32, 1)
    gateup_wide_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                       const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                       const uint8_t* __restrict__ xq, const float* __restrict__ xs, int64_t ldxs, int64_t d, int64_t I,
                       float limit, float* __restrict__ H) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  int32_t* col_row = col_rows_of<2>(smem);
  for (int c = threadIdx.x; c < kMmaWideTokens; c += blockDim.x)
    col_row[c] = slot_pair[t.start + (c < t.count ? c : 0)] / K;
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16;
  const DevWeight* const ws[2] = {tab + 3 * t.expert, tab + 3 * t.expert + 2};  // W1, W3
  auto total = warp_totals<2>(smem);
  wide_rows_times_tile<2>(ws, r0, WideOperand{xq, xs, d, ldxs}, col_row, t.count, d / 128, stages_of<2>(smem), total);
  for (int n = 0; n < kGroups; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * n + 2 * q + (i & 1);
      if (col < t.count)
        H[static_cast<int64_t>(t.start + col) * I + r0 + g + (i >= 2 ? 8 : 0)] =
            swiglu_clamped(total[0][n][i][lane] * kE2m1E4m3Unscale, total[1][n][i][lane] * kE2m1E4m3Unscale, limit);
    }
}

__global__ void __launch_bounds__(kWarps * 32, 1)
    down_wide_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                     const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                     const uint8_t* __restrict__ hq, const float* __restrict__ hs, int64_t ldhs, int64_t d, int64_t I,
                     float* __restrict__ Y) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  int32_t* col_row = col_rows_of<1>(smem);
  for (int c = threadIdx.x; c < kMmaWideTokens; c += blockDim.x) col_row[c] = t.start + (c < t.count ? c : 0);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16;
  const DevWeight* const ws[1] = {tab + 3 * t.expert + 1};  // W2
  auto total = warp_totals<1>(smem);
  wide_rows_times_tile<1>(ws, r0, WideOperand{hq, hs, I, ldhs}, col_row, t.count, I / 128, stages_of<1>(smem), total);
  for (int n = 0; n < kGroups; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 8 * n + 2 * q + (i & 1);
      if (col < t.count)
        Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + r0 + g + (i >= 2 ? 8 : 0)] =
            total[0][n][i][lane] * kE2m1E4m3Unscale;
    }
}

template <typename Kernel>
void set_smem(Kernel k, size_t bytes) {
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void mma_gateup_wide(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                     const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                     int64_t I, float limit, float* H, cudaStream_t s) {
  DSV4_CHECK(I % (16 * kWarps) == 0 && d % 128 == 0, "mma_gateup_wide: I must be a multiple of 128");
  const size_t smem = wide_smem<2>();
  set_smem(gateup_wide_kernel, smem);
  gateup_wide_kernel<<<dim3(static_cast<unsigned>(I / (16 * kWarps)), max_tiles), kWarps * 32, smem, s>>>(
      tab, tiles, n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
  DSV4_CUDA_LAUNCH_CHECK();
}

void mma_down_wide(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                   const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
                   float* Y, cudaStream_t s) {
  DSV4_CHECK(d % (16 * kWarps) == 0 && I % 128 == 0, "mma_down_wide: d must be a multiple of 128");
  const size_t smem = wide_smem<1>();
  set_smem(down_wide_kernel, smem);
  down_wide_kernel<<<dim3(static_cast<unsigned>(d / (16 * kWarps)), max_tiles), kWarps * 32, smem, s>>>(
      tab, tiles, n_tiles, slot_pair, hq, hs, ldhs, d, I, Y);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
