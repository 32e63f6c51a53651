// Routed experts at prefill sizes on FP8 warpgroup MMA (sm_90a): the design of bench/NOTES.md
// step 9. The bf16 wgmma kernels (moe_wgmma.cu) convert every e2m1 weight to bf16 with its
// scale (byte lookups and a bf16 multiply per pair) and run at ~45% of the bf16 rate, bound by
// those conversions. Here the weights become e4m3 bytes (7 integer instructions per 8 values,
// exact; mma_e4m3.cuh) as the A operand from registers, the activation codes are the B operand
// as act_quant_fp8_wgmma_b wrote them (16-byte chunks are core-matrix rows: staged by cp.async
// without any shuffle), and wgmma.m64n64k32.e4m3 gives one 32-group's products per call into a
// fresh accumulator, promoted into the fp32 sum with the group's E8M0 scale times the column's
// activation scale — the per-group structure of the other Fast kernels; the tensor core's sum of
// a group's 32 products is not bitwise theirs. The codes sit in the stages as 128-byte rows in
// the 128-byte swizzle (wgmma_desc_sw128; core matrices without swizzle ran the FP8 grouped GEMM
// of gemm_fp8_grouped.cu 1.6x slower).
//
// CTA: two warpgroups of 64 weight rows, one tile of <= 64 tokens, all of K; 4 stages of one
// 128-block (the tile's codes and scales, the CTA's weight pieces), copied by cp.async three
// blocks ahead (weights one block ahead in registers ran at half the bf16 kernels' speed). The grid's x is the tile, so the tiles of one
// expert (adjacent in the tile list) run together and share its rows in L2.
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kTok = kMoeFp8WideTokens;  // tile tokens: the wgmma's N
constexpr int kWarpgroups = 2;
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kCtaRows = 64 * kWarpgroups;
constexpr int kStages = 4;
// B operand of one 128-block: token t's 128 code bytes at 128 t, their 16-byte chunk c (group c /
// 2, half c % 2) at chunk c ^ (t % 8); group j's k-step starts 32 j into the tile.
constexpr int kChunks = kTok * 8;   // 16-byte chunks of a block
constexpr int kCopies = kChunks / kThreads;
static_assert(kChunks % kThreads == 0 && kTok <= kThreads, "whole chunks per thread");

// One 128-block: the tile's codes and scales, the CTA's NM x 128 rows of packed FP4 (the two
// 64-row tiles' 4 KB pieces) and their E8M0 words.
template <int NM>
struct alignas(1024) Stage {  // act first: swizzle atoms 1024-aligned in every stage
  uint8_t act[kTok * 128];
  float xs[kTok];
  uint8_t w[NM][kCtaRows][64];
  uint32_t e[NM][kCtaRows];
};
template <int NM>
constexpr size_t kSmem = 1024 + kStages * sizeof(Stage<NM>) + kTok * sizeof(int32_t);  // + alignment

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Block kb into a stage (every thread; one cp.async group): the tile's codes (off[n]: element
// offset of this thread's chunk n, its token's row x ld + 16 c) and scales (rows: the tile's
// activation rows), the weights' two 4 KB pieces (w: the CTA's first tile) and E8M0 words.
template <int NM>
__device__ __forceinline__ void stage_block(Stage<NM>& st, const uint8_t* xq, const uint32_t (&off)[kCopies],
                                            const float* xs, int64_t ldxs, const int32_t* rows,
                                            const uint8_t* const (&w)[NM], const uint8_t* const (&e)[NM], int64_t rb,
                                            int64_t sc, int64_t kb) {
#pragma unroll
  for (int n = 0; n < kCopies; ++n) {
    const int i = threadIdx.x + kThreads * n, t = i >> 3, c = i & 7;
    cp_async16(st.act + t * 128 + ((c ^ (t & 7)) << 4), xq + kb * 128 + off[n]);
  }
  if (threadIdx.x < kTok) cp_async4(&st.xs[threadIdx.x], xs + kb * ldxs + rows[threadIdx.x]);
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int n = 0; n < kCtaRows * 4 / kThreads; ++n) {
      const int i = threadIdx.x + kThreads * n, tile = i >> 8, o = (i & 255) * 16;
      cp_async16(&st.w[m][64 * tile + (o >> 6)][o & 63], w[m] + tile * kPackTileRows * rb + kb * kPackedBlockStride + o);
    }
    if (threadIdx.x < kCtaRows) cp_async4(&st.e[m][threadIdx.x], e[m] + threadIdx.x * sc + kb * 4);
  }
  cp_async_commit();
}

// This warp's rows 16w + g, + 8 of a stage.
template <int NM>
__device__ __forceinline__ void read_block(WBlock<NM>& o, const Stage<NM>& st) {
  const int lr = 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2), q = threadIdx.x & 3;
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    o.a[m] = *reinterpret_cast<const uint4*>(&st.w[m][lr][16 * q]);
    o.b[m] = *reinterpret_cast<const uint4*>(&st.w[m][lr + 8][16 * q]);
    o.ea[m] = st.e[m][lr];
    o.eb[m] = st.e[m][lr + 8];
  }
}

// acc[m] (unscaled by 2^6) += this block's products of the warp's rows (cur) and the stage.
template <int NM>
__device__ __forceinline__ void block_fp8(const WBlock<NM>& cur, const Stage<NM>& st, float (&c)[NM][32],
                                          float (&acc)[NM][32]) {
  const int q = threadIdx.x & 3;
  float xv[16];  // the activation scales of the thread's columns 8 (i / 4) + 2q + i % 2
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const float2 v = *reinterpret_cast<const float2*>(&st.xs[8 * u + 2 * q]);
    xv[2 * u] = v.x;
    xv[2 * u + 1] = v.y;
  }
  uint32_t special = 0;
#pragma unroll
  for (int m = 0; m < NM; ++m) special |= e8m0_special_bytes(cur.ea[m]) | e8m0_special_bytes(cur.eb[m]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[NM][4];
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      e2m1x8_e4m3(word_of(cur.a[m], j), a[m][0], a[m][2]);
      e2m1x8_e4m3(word_of(cur.b[m], j), a[m][1], a[m][3]);
    }
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < NM; ++m) wgmma_m64n64k32_e4m3_rs(c[m], a[m], wgmma_desc_sw128(st.act + 32 * j), false);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      wgmma_pin(c[m]);
      const float s_a = group_scale(cur.ea[m], j, special != 0), s_b = group_scale(cur.eb[m], j, special != 0);
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[m][i] += c[m][i] * ((i & 2 ? s_b : s_a) * xv[2 * (i >> 2) + (i & 1)]);
    }
  }
}

// acc[m] = W_m[this thread's rows of the CTA's 128 from r0] · tile over all nkb blocks of K = in
// (unscaled by 2^6). rows[t]: the activation row of tile column t (columns past count repeat
// column 0; their outputs are not stored).
template <int NM>
__device__ __forceinline__ void rows_times_tile(unsigned char* smem, const DevWeight* const (&w)[NM], int64_t r0,
                                                const int32_t* rows, const uint8_t* xq, const float* xs, int64_t ldxs,
                                                int64_t in, float (&acc)[NM][32]) {
  Stage<NM>* st = reinterpret_cast<Stage<NM>*>(smem);
  const int64_t rb = in / 2, sc = w[0]->scale_cols, nkb = in / 128;
  const uint8_t* wp[NM];
  const uint8_t* ep[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    wp[m] = w[m]->data + packed_row_offset(r0, rb);
    ep[m] = w[m]->scale + r0 * sc;
  }
  uint32_t off[kCopies];
#pragma unroll
  for (int n = 0; n < kCopies; ++n) {
    const int i = threadIdx.x + kThreads * n;
    off[n] = static_cast<uint32_t>(rows[i >> 3] * in + 16 * (i & 7));
  }
  pdl_wait();
  for (int b = 0; b < kStages - 1; ++b) {
    if (b < nkb)
      stage_block(st[b], xq, off, xs, ldxs, rows, wp, ep, rb, sc, b);
    else
      cp_async_commit();
  }
  float c[NM][32];
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[m][i] = c[m][i] = 0.f;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    cp_async_wait<kStages - 2>();
    // Block kb is staged for every warp, and every warp is done with block kb - 1's stage (its
    // wgmmas were waited for), which block kb + kStages - 1 takes.
    __syncthreads();
    const int64_t nb = kb + kStages - 1;
    if (nb < nkb)
      stage_block(st[nb % kStages], xq, off, xs, ldxs, rows, wp, ep, rb, sc, nb);
    else
      cp_async_commit();
    WBlock<NM> cur;
    read_block(cur, st[kb % kStages]);
    block_fp8<NM>(cur, st[kb % kStages], c, acc);
  }
}

// Row (from the CTA's first) and column of this thread's accumulator i (wgmma.cuh).
__device__ __forceinline__ int acc_row(int i) { return 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2) + (i & 2) * 4; }
__device__ __forceinline__ int acc_col(int i) { return 8 * (i >> 2) + 2 * (threadIdx.x & 3) + (i & 1); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

__global__ void __launch_bounds__(kThreads, 1)
    gateup_fp8_wide_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                           const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                           const uint8_t* __restrict__ xq, const float* __restrict__ xs, int64_t ldxs, int64_t d,
                           int64_t I, float limit, float* __restrict__ H) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.x) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.x];
  int32_t* rows = reinterpret_cast<int32_t*>(smem + kStages * sizeof(Stage<2>));
  if (threadIdx.x < kTok) rows[threadIdx.x] = slot_pair[t.start + (threadIdx.x < t.count ? threadIdx.x : 0)] / K;
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCtaRows;
  const DevWeight* const ws[2] = {tab + 3 * t.expert, tab + 3 * t.expert + 2};  // W1, W3
  float acc[2][32];
  rows_times_tile<2>(smem, ws, r0, rows, xq, xs, ldxs, d, acc);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int col = acc_col(i);
    if (col < t.count)
      H[static_cast<int64_t>(t.start + col) * I + r0 + acc_row(i)] =
          swiglu_clamped(acc[0][i] * kE2m1E4m3Unscale, acc[1][i] * kE2m1E4m3Unscale, limit);
  }
#endif
}

__global__ void __launch_bounds__(kThreads, 1)
    down_fp8_wide_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                         const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                         const uint8_t* __restrict__ hq, const float* __restrict__ hs, int64_t ldhs, int64_t d,
                         int64_t I, float* __restrict__ Y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.x) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.x];
  int32_t* rows = reinterpret_cast<int32_t*>(smem + kStages * sizeof(Stage<1>));
  if (threadIdx.x < kTok) rows[threadIdx.x] = t.start + (threadIdx.x < t.count ? threadIdx.x : 0);
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCtaRows;
  const DevWeight* const ws[1] = {tab + 3 * t.expert + 1};  // W2
  float acc[1][32];
  rows_times_tile<1>(smem, ws, r0, rows, hq, hs, ldhs, I, acc);
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    const int col = acc_col(i);
    if (col < t.count)
      Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + r0 + acc_row(i)] = acc[0][i] * kE2m1E4m3Unscale;
  }
#endif
}

}  // namespace

void fp8_wide_gateup(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                     const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t x_rows,
                     int64_t d, int64_t I, float limit, float* H, cudaStream_t s) {
  DSV4_CHECK(wgmma_available() && I % kCtaRows == 0 && d % 128 == 0,
             "fp8_wide_gateup: needs an sm_90a device and build, I a multiple of 128");
  DSV4_CHECK(x_rows * d < int64_t{UINT32_MAX}, "fp8_wide_gateup: activations beyond 32-bit offsets");
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(gateup_fp8_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem<2>)));
  launch_dependent(gateup_fp8_wide_kernel, dim3(max_tiles, static_cast<unsigned>(I / kCtaRows)), dim3(kThreads),
                   kSmem<2>, s, tab, tiles, n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
}

void fp8_wide_down(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                   const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t h_rows, int64_t d,
                   int64_t I, float* Y, cudaStream_t s) {
  DSV4_CHECK(wgmma_available() && d % kCtaRows == 0 && I % 128 == 0,
             "fp8_wide_down: needs an sm_90a device and build, d a multiple of 128");
  DSV4_CHECK(h_rows * I < int64_t{UINT32_MAX}, "fp8_wide_down: activations beyond 32-bit offsets");
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(down_fp8_wide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSmem<1>)));
  launch_dependent(down_fp8_wide_kernel, dim3(max_tiles, static_cast<unsigned>(d / kCtaRows)), dim3(kThreads), kSmem<1>, s,
                   tab, tiles, n_tiles, slot_pair, hq, hs, ldhs, d, I, Y);
}

}  // namespace dsv4::cuda::detail
