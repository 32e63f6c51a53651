// Routed experts at decode sizes (tiles of <= 8 or <= 16 tokens) on Hopper's FP8 warpgroup MMA (sm_90a).
// sm_90 has no e4m3 mma.sync: the mma.sync kernels (moe_mma.cu) convert both operands to f16 (cvt,
// a quarter of the integer rate) for two HMMAs per m16n8k32, ~36 instructions per 16 weights.
// Here the e2m1 weights become e4m3 bytes (7 integer instructions per 8, mma_e4m3.cuh) that feed
// wgmma.m64n8k32.e4m3 as the A operand from registers, and the activation codes (act_quant_fp8,
// mma-packed) sit in shared memory as the B operand: no cvt at all. Each wgmma covers one
// 32-group into a fresh accumulator that is scaled by the group's E8M0 and summed in fp32 — the
// per-group structure of moe_mma_block.cuh; only the tensor core's sum of a group's 32 products
// is not bitwise the HMMA's. Both read the tiled packed layout at ~75% of DRAM bandwidth; this
// one is 5-12% faster (H100, bench/NOTES.md step 10).
//
// CTA: kSlices warpgroups, 64 weight rows of NM weights (gate and up, or down), one tile.
// Warpgroup s takes K slice s of the 128-blocks; the slices' sums are added in slice order
// (deterministic). A thread owns rows g and g + 8 of its warp's 16, as in the mma.sync kernels,
// so the packed FP4 layout (pack_fp4_for_mma, 64-row tiles) serves both: one 16-byte load per
// row and block, a warp's 8 rows 512 contiguous bytes, held one block ahead in registers.
//
// Tiles of NT = 16 tokens (wgmma.m64n16k32) serve experts with 9-16 tokens in one pass over their
// weights, where two 8-token tiles read them twice (from ~8 tokens per expert on average).
//
// The B operand of block kb, group j: core matrices (K-major, no swizzle) of 8 tokens x 16 code
// bytes, token octet o and k-half h at act + (4 kb + j) 32 NT + 256 o + 128 h, token n at 16 (n %
// 8) in it (the N = 8 layout is octet 0). The A fragment
// of a thread takes k 4q .. 4q + 3 (a0 / a1) and 16 + 4q .. (a2 / a3); e2m1x8_e4m3 gives the
// even and odd values of the thread's 8 (group j, values 8q .. 8q + 7), so the codes are laid the
// same way: half 0 holds the even codes of each q's 8, half 1 the odd ones (split_even_odd).
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/moe_mma_block.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kSlices = 2;                 // warpgroups per CTA, one K slice each
constexpr int kThreads = 128 * kSlices;
constexpr int kRows = 64;                  // weight rows per CTA (one m64 per warpgroup)

// One 128-block of NT tokens' codes.
template <int NT>
constexpr int64_t block_bytes() {
  return NT * 128;
}
// Shared memory: the tile's codes (nkb blocks), their scales [kb][token], the slices' partials.
size_t smem_bytes(int nm, int64_t nkb, int nt) {
  return static_cast<size_t>(nkb) * nt * (128 + sizeof(float)) + (kSlices - 1) * nm * (nt / 2) * 128 * sizeof(float);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Weights per batch of wgmmas: both (gate and up) at 8 tokens; one at a time at 16, whose 4 x 8
// accumulators per weight would not fit beside both weights' fragments (ptxas: 128 registers
// and spills with both).
template <int NM, int NT>
constexpr int kBatchWeights = NT == 8 ? NM : 1;

// acc[m][i] += (Σ_j wgmma_j · group scale_j) · activation scale of block kb (unscaled by 2^6).
template <int NM, int NT>
__device__ __forceinline__ void block_product_fp8(const WBlock<NM>& w, const uint8_t* act, const float* xsc,
                                                  float (&c)[kBatchWeights<NM, NT>][4][NT / 2],
                                                  float (&acc)[NM][NT / 2]) {
  constexpr int MB = kBatchWeights<NM, NT>;
  const int q = threadIdx.x & 3;
  uint32_t special = 0;
#pragma unroll
  for (int m = 0; m < NM; ++m) special |= e8m0_special_bytes(w.ea[m]) | e8m0_special_bytes(w.eb[m]);
#pragma unroll
  for (int m0 = 0; m0 < NM; m0 += MB) {
    uint32_t a[MB][4][4];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        e2m1x8_e4m3(word_of(w.a[m0 + mb], j), a[mb][j][0], a[mb][j][2]);
        e2m1x8_e4m3(word_of(w.b[m0 + mb], j), a[mb][j][1], a[mb][j][3]);
      }
    wgmma_fence();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint64_t desc = wgmma_desc(act + 32 * NT * j, 128, 256);
        if constexpr (NT == 8)
          wgmma_m64n8k32_e4m3_rs(c[mb][j], a[mb][j], desc, false);
        else
          wgmma_m64n16k32_e4m3_rs(c[mb][j], a[mb][j], desc, false);
      }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_pin(c[mb][j]);
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      const int m = m0 + mb;
      float blk[NT / 2] = {};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float s_a = group_scale(w.ea[m], j, special != 0), s_b = group_scale(w.eb[m], j, special != 0);
#pragma unroll
        for (int i = 0; i < NT / 2; ++i) blk[i] += c[mb][j][i] * (i & 2 ? s_b : s_a);  // i & 2: row g + 8
      }
#pragma unroll
      for (int i = 0; i < NT / 2; ++i) acc[m][i] += blk[i] * xsc[8 * (i >> 2) + 2 * q + (i & 1)];
    }
  }
}

// The tile's codes (row_of(n): the activation row of token n < count) and scales into shared
// memory in the B operand's order; tokens past count are zeros.
template <int NT, typename RowOf>
__device__ __forceinline__ void stage_tile(unsigned char* smem, int64_t nkb, int count, RowOf row_of,
                                           const uint8_t* xq, const float* xs, int64_t ldxs, int64_t in) {
  float* xsc = reinterpret_cast<float*>(smem + nkb * block_bytes<NT>());
  for (int64_t i = threadIdx.x; i < nkb * NT * 4; i += kThreads) {
    const int64_t kb = i / (NT * 4);
    const int n = static_cast<int>(i >> 2) % NT, q = static_cast<int>(i) & 3;
    uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
    if (n < count) {
      const uint8_t* src = xq + row_of(n) * in + kb * 128 + 32 * q;
      lo = __ldg(reinterpret_cast<const uint4*>(src));
      hi = __ldg(reinterpret_cast<const uint4*>(src + 16));
    }
    const uint2 xc[4] = {make_uint2(lo.x, lo.y), make_uint2(lo.z, lo.w), make_uint2(hi.x, hi.y), make_uint2(hi.z, hi.w)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t even, odd;
      split_even_odd(xc[j], even, odd);
      unsigned char* chunk = smem + (kb * 4 + j) * 32 * NT + 256 * (n >> 3) + 16 * (n & 7) + 4 * q;
      *reinterpret_cast<uint32_t*>(chunk) = even;
      *reinterpret_cast<uint32_t*>(chunk + 128) = odd;
    }
  }
  for (int64_t i = threadIdx.x; i < nkb * NT; i += kThreads) {
    const int n = static_cast<int>(i % NT);
    xsc[i] = n < count ? __ldg(xs + (i / NT) * ldxs + row_of(n)) : 0.f;
  }
}

// acc = W_m[rows r0 + this thread's] · tile over all nkb 128-blocks of K = in, unscaled by 2^6;
// true for the threads of warpgroup 0, which hold the CTA's sums. (Measured slower on an H100:
// L2 prefetches of the slice, whole or in chunks, on the row-major layout, which outran L2 so
// that 1.4x the bytes came from DRAM; two blocks ahead in registers; a per-thread cp.async ring
// three or four blocks deep, also on the tiled layout: 8 / 64 tokens 292 / 1190 vs 253 / 1010 us.)
template <int NM, int NT, typename RowOf>
__device__ __forceinline__ bool rows_times_tile_fp8(unsigned char* smem, const DevWeight* const (&w)[NM], int64_t r0,
                                                    int count, RowOf row_of, const uint8_t* xq, const float* xs,
                                                    int64_t ldxs, int64_t in, float (&acc)[NM][NT / 2]) {
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t row = r0 + 16 * ((threadIdx.x >> 5) & 3) + g, sc = w[0]->scale_cols;
  const int64_t nkb = in / 128, kb0 = wg * nkb / kSlices, kb1 = (wg + 1) * nkb / kSlices;
  const uint8_t* pa[NM];
  const uint8_t* sa[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    pa[m] = w[m]->data + packed_row_offset(row, in / 2) + 16 * q;
    sa[m] = w[m]->scale + row * sc;
  }
  // Weights before pdl_wait: the codes are being written by the quantisation before this kernel.
  WBlock<NM> cur, nxt;
  if (kb0 < kb1) load_block(cur, pa, sa, sc, kb0);
  pdl_wait();
  stage_tile<NT>(smem, nkb, count, row_of, xq, xs, ldxs, in);
  fence_proxy_async_smem();
  __syncthreads();
  const float* xsc = reinterpret_cast<const float*>(smem + nkb * block_bytes<NT>());
  constexpr int NA = NT / 2;  // accumulators per thread and weight
  float c[kBatchWeights<NM, NT>][4][NA] = {};
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < NA; ++i) acc[m][i] = 0.f;
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    if (kb + 1 < kb1) load_block(nxt, pa, sa, sc, kb + 1);
    block_product_fp8<NM, NT>(cur, smem + kb * block_bytes<NT>(), xsc + kb * NT, c, acc);
    cur = nxt;
  }
  float* part = reinterpret_cast<float*>(smem + nkb * NT * (128 + sizeof(float)));
  const int t = threadIdx.x & 127;
  if (wg > 0)
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int i = 0; i < NA; ++i) part[(((wg - 1) * NM + m) * NA + i) * 128 + t] = acc[m][i];
  __syncthreads();
  if (wg > 0) return false;
  for (int s = 1; s < kSlices; ++s)
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
      for (int i = 0; i < NA; ++i) acc[m][i] += part[(((s - 1) * NM + m) * NA + i) * 128 + t];
  return true;
}

// One tile's gate/up (NT: its width, 8 or 16) into H.
template <int NT>
__device__ __forceinline__ void gateup_tile(unsigned char* smem, const DevWeight* tab, const MoeTile& t,
                                            const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs,
                                            int64_t ldxs, int64_t d, int64_t I, float limit, float* H) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const DevWeight* const ws[2] = {tab + 3 * t.expert, tab + 3 * t.expert + 2};  // W1, W3
  auto row_of = [&](int n) { return static_cast<int64_t>(slot_pair[t.start + n] / K); };
  float acc[2][NT / 2];
  if (!rows_times_tile_fp8<2, NT>(smem, ws, r0, t.count, row_of, xq, xs, ldxs, d, acc)) return;
  const int64_t row = r0 + 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int o = 0; o < NT / 8; ++o) {  // token octet o: accumulators 4o .. 4o + 3
    const float octet[2][4] = {{acc[0][4 * o], acc[0][4 * o + 1], acc[0][4 * o + 2], acc[0][4 * o + 3]},
                               {acc[1][4 * o], acc[1][4 * o + 1], acc[1][4 * o + 2], acc[1][4 * o + 3]}};
    store_swiglu(H, I, t.start + 8 * o, t.count - 8 * o, row, threadIdx.x & 3, octet, limit);
  }
}

// One tile's down projection into Y.
template <int NT>
__device__ __forceinline__ void down_tile(unsigned char* smem, const DevWeight* tab, const MoeTile& t,
                                          const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs,
                                          int64_t d, int64_t I, float* Y) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const DevWeight* const ws[1] = {tab + 3 * t.expert + 1};  // W2
  auto row_of = [&](int n) { return static_cast<int64_t>(t.start + n); };
  float acc[1][NT / 2];
  if (!rows_times_tile_fp8<1, NT>(smem, ws, r0, t.count, row_of, hq, hs, ldhs, I, acc)) return;
  const int q = threadIdx.x & 3;
  const int64_t row = r0 + 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    const int col = 8 * (i >> 2) + 2 * q + (i & 1);
    if (col < t.count)
      Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + row + (i & 2 ? 8 : 0)] = acc[0][i] * kE2m1E4m3Unscale;
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Tiles of at most TMAX tokens (the tile list's width); from 16, a tile of <= 8 still takes the
// 8-token body (the 16-token one is ~25% slower per tile: twice the staging, one weight per batch
// of wgmmas), so only experts with 9-16 tokens pay for it. 2 CTAs per SM for gate/up (two
// weights' fragments in flight), 3 for down.
template <int TMAX>
__global__ void __launch_bounds__(kThreads, 2)
    gateup_fp8_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                      const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                      const uint8_t* __restrict__ xq, const float* __restrict__ xs, int64_t ldxs, int64_t d, int64_t I,
                      float limit, float* __restrict__ H) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem[];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  if (TMAX == 16 && t.count > 8)
    gateup_tile<16>(smem, tab, t, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
  else
    gateup_tile<8>(smem, tab, t, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
#endif
}

template <int TMAX>
__global__ void __launch_bounds__(kThreads, 3)
    down_fp8_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                    const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                    const uint8_t* __restrict__ hq, const float* __restrict__ hs, int64_t ldhs, int64_t d, int64_t I,
                    float* __restrict__ Y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_trigger();  // a decode hc_post_project after this may load its projection weights
  extern __shared__ __align__(128) unsigned char smem[];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  if (TMAX == 16 && t.count > 8)
    down_tile<16>(smem, tab, t, slot_pair, hq, hs, ldhs, d, I, Y);
  else
    down_tile<8>(smem, tab, t, slot_pair, hq, hs, ldhs, d, I, Y);
#endif
}

// Dynamic shared memory past 48 KB needs the attribute (V4-Pro's d = 7168: 57 KB for gate/up);
// set at every such launch (it is per device).
template <typename Kernel>
void allow_smem(Kernel k, size_t bytes) {
  if (bytes > 48 * 1024)
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

bool fp8_decode_ok(int64_t d, int64_t I, int tile_tokens) {
  return wgmma_available() && (tile_tokens == 8 || tile_tokens == 16) && d % 128 == 0 && I % 128 == 0 &&
         d % kRows == 0 && I % kRows == 0 && smem_bytes(2, d / 128, tile_tokens) <= 200 * 1024 &&
         smem_bytes(1, I / 128, tile_tokens) <= 200 * 1024;
}

void fp8_decode_gateup(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                       unsigned max_tiles, const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs,
                       int64_t ldxs, int64_t d, int64_t I, float limit, float* H, cudaStream_t s) {
  DSV4_CHECK(fp8_decode_ok(d, I, tile_tokens),
             "fp8_decode_gateup: needs an sm_90a device and build, d and I multiples of 128, 8- or 16-token tiles");
  const size_t smem = smem_bytes(2, d / 128, tile_tokens);
  auto kernel = tile_tokens == 8 ? gateup_fp8_kernel<8> : gateup_fp8_kernel<16>;
  allow_smem(kernel, smem);
  launch_dependent(kernel, dim3(static_cast<unsigned>(I / kRows), max_tiles), dim3(kThreads), smem, s, tab, tiles,
                   n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
}

void fp8_decode_down(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                     unsigned max_tiles, const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs,
                     int64_t d, int64_t I, float* Y, cudaStream_t s) {
  DSV4_CHECK(fp8_decode_ok(d, I, tile_tokens),
             "fp8_decode_down: needs an sm_90a device and build, d and I multiples of 128, 8- or 16-token tiles");
  const size_t smem = smem_bytes(1, I / 128, tile_tokens);
  auto kernel = tile_tokens == 8 ? down_fp8_kernel<8> : down_fp8_kernel<16>;
  allow_smem(kernel, smem);
  launch_dependent(kernel, dim3(static_cast<unsigned>(d / kRows), max_tiles), dim3(kThreads), smem, s, tab, tiles,
                   n_tiles, slot_pair, hq, hs, ldhs, d, I, Y);
}

}  // namespace dsv4::cuda::detail
