// Routed experts at prefill sizes on Hopper's warpgroup MMA (wgmma, sm_90a) with bf16 operands.
// The 64-token mma.sync tiles (moe_mma_wide.cu) ran at ~100 TFLOP/s: sm_90 emulates the e4m3
// mma.sync (f16 conversion of both operands per mma), so they are instruction-bound. Here
// each e2m1 weight is converted once per tile into bf16 with its E8M0 group scale folded in
// (exact: e2m1 x 2^k has 2 significant bits), the activations arrive as bf16 values of their
// FP8 quantisation (act_quant_bf16_wgmma: e4m3 code x power-of-two scale, also exact), and
// wgmma multiplies them with fp32 accumulation. The products are the FP8/FP4 formula's
// products; only the order of the fp32 sums differs from the other Fast kernels.
//
// CTA: two warpgroups, 64 weight rows each (128 rows), one tile of <= TOK tokens. A stage holds
// one 128-block of K: the tile's activations (bf16, core-matrix order for the B descriptor), the
// CTA's packed FP4 rows and their E8M0 bytes, all copied by cp.async kStages - 2 blocks ahead. A
// warp converts its 16 rows' weights (registers, the A fragments) a commit group at a time while
// the previous group's wgmmas run. The conversion is the kernel's main cost (ncu: issue-bound at
// 1.8 instructions per cycle with 2 warps per scheduler), so large calls take TOK = 128 tiles
// (m64n128k16, m64n64k16 for a tile of <= 64; groups of 32 K to fit the registers): half the
// conversions per product. Smaller calls, whose tiles hold few tokens anyway, keep TOK = 64
// (groups of 64 K, the down kernel at two CTAs per SM), which measured faster there. (A form that
// converted into shared memory once per CTA for both warpgroups, SS wgmma, ran 1.7-2.8x slower:
// two barriers and a proxy fence per half block.)
#include <cuda_bf16.h>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarpgroups = 2;
constexpr int kCtaRows = 64 * kWarpgroups;
// Stages: TOK 128: gate/up (two weights) 4 x 49 KB, down 5 x 41 KB, one CTA per SM; TOK 64:
// gate/up 6 x 33 KB (one CTA per SM by its registers), down 4 x 25 KB (two).
template <int NM, int TOK>
constexpr int kStages = TOK == 128 ? (NM == 2 ? 4 : 5) : (NM == 2 ? 6 : 4);
// 32-groups of K per wgmma commit group.
template <int TOK>
constexpr int kGroupsPerCommit = TOK == 128 ? 1 : 2;
// B operand of one 128-block in the 128-byte swizzle (wgmma_desc_sw128): K half h (64 values,
// 16-byte chunks 8h .. 8h + 7 of a token's 256 bytes) is a region of TOK rows of 128 bytes,
// token t's row at 128 t, its chunk c at chunk c ^ (t % 8); k16 step k starts at region k / 4,
// 32 (k % 4) bytes in. (Unswizzled core matrices ran the FP8 wgmma kernels 1.1-1.6x slower:
// bench/NOTES.md step 11.)
template <int TOK>
__device__ __forceinline__ uint32_t act_offset(int t, int c) {
  return (c >> 3) * TOK * 128 + t * 128 + (((c & 7) ^ (t & 7)) << 4);
}

template <int NM, int TOK>
struct alignas(1024) Stage {        // act first: the swizzle atoms 1024-aligned in every stage
  uint8_t act[TOK * 256];           // bf16 activations, two swizzled K halves
  uint8_t w[NM][kCtaRows][64];      // packed FP4 (pack_fp4_for_mma) 128 values per row
  uint32_t e[NM][kCtaRows];         // E8M0 bytes of the block's 4 groups per row
};

template <int NM, int TOK>
constexpr size_t wgmma_smem() {  // + 1024: the stages start at the first 1024-aligned byte
  return 1024 + kStages<NM, TOK> * sizeof(Stage<NM, TOK>) + sizeof(int32_t) * TOK;
}

// Activation chunks per thread and block: chunk i = threadIdx.x + 256 n of the tile is token
// 8 (i / 128) + i % 8, chunk i / 8 % 16 (act_offset).
template <int TOK>
constexpr int kActCopies = TOK * 16 / (kWarpgroups * 128);

// Element offsets (row of the chunk's token x ld + its column) of this thread's activation
// chunks, once per tile: the staging loop then issues its cp.async without shared-memory
// lookups or 64-bit multiplies (they were ~1/5 of a block's instructions). ~0u: beyond the tile.
template <int TOK>
__device__ __forceinline__ void act_offsets(const int32_t* col_row, int groups, int64_t ld,
                                            uint32_t (&off)[kActCopies<TOK>]) {
#pragma unroll
  for (int n = 0; n < kActCopies<TOK>; ++n) {
    const int i = threadIdx.x + kWarpgroups * 128 * n, t = (i >> 7) * 8 + (i & 7), c = (i >> 3) & 15;
    off[n] = i < groups * 128 ? static_cast<uint32_t>(col_row[t] * ld + 8 * c) : ~0u;
  }
}

// Copies block kb into a stage (every thread of the CTA; one cp.async group).
template <int NM, int TOK>
__device__ __forceinline__ void stage_block(Stage<NM, TOK>& st, const __nv_bfloat16* x,
                                            const uint32_t (&off)[kActCopies<TOK>], const uint8_t* const (&w)[NM],
                                            const uint8_t* const (&e)[NM], int64_t rb, int64_t sc, int64_t kb) {
  const __nv_bfloat16* xb = x + kb * 128;
#pragma unroll
  for (int n = 0; n < kActCopies<TOK>; ++n)
    if (off[n] != ~0u) {
      const int i = threadIdx.x + kWarpgroups * 128 * n;
      cp_async16(st.act + act_offset<TOK>((i >> 7) * 8 + (i & 7), (i >> 3) & 15), xb + off[n]);
    }
  constexpr int kThreads = kWarpgroups * 128, kWeightCopies = kCtaRows * 4 / kThreads;  // 16-byte chunks per weight
  static_assert(kCtaRows <= kThreads && kCtaRows * 4 % kThreads == 0, "whole weight chunks per thread");
#pragma unroll
  for (int m = 0; m < NM; ++m) {
#pragma unroll
    for (int n = 0; n < kWeightCopies; ++n) {
      const int i = threadIdx.x + kThreads * n;
      const int r = i >> 2;  // row of the CTA: tile r / 64 of the CTA's two (packed_row_offset)
      cp_async16(&st.w[m][r][16 * (i & 3)],
                 w[m] + (r >> 6) * kPackTileRows * rb + (r & 63) * 64 + kb * kPackedBlockStride + 16 * (i & 3));
    }
    if (threadIdx.x < kCtaRows) cp_async4(&st.e[m][threadIdx.x], e[m] + threadIdx.x * sc + kb * 4);
  }
  cp_async_commit();
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// 2^(E - 127) as bf16 in both halves for byte j of the E8M0 word `e` (E = 0: the subnormal
// 2^-127, which the 16-bit max gives, as E << 7 >= 0x80 for every other E): three instructions
// where extracting the byte, testing it and duplicating it took seven.
__device__ __forceinline__ uint32_t e8m0_bf16x2(uint32_t e, int j) {  // j: a constant after unrolling
  return __vmaxu2(__byte_perm(e, 0u, 0x4040u + 0x101u * j) << 7, 0x00400040u);
}

// Eight e2m1 (element 2i in the low nibble of byte i) x scale -> four bf16 pairs (elements 2i,
// 2i + 1 in r[i]). Magnitudes through byte lookups (prmt): high and low bytes of the bf16 of
// 0, 0.5, 1, 1.5, 2, 3, 4, 6; the sign bits moved to bit 7 of the high bytes.
__device__ __forceinline__ void e2m1x8_bf16(uint32_t w, uint32_t scale, uint32_t (&r)[4]) {
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u, kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  const uint32_t m = w & 0x77777777u, m2 = m >> 16;
  const uint32_t ev = w << 4;  // even elements' signs at bit 7 of their byte; odd ones are there in w
  const uint32_t h03 = __byte_perm(kHi0, kHi1, m) | (__byte_perm(ev, w, 0x5140) & 0x80808080u);
  const uint32_t h47 = __byte_perm(kHi0, kHi1, m2) | (__byte_perm(ev, w, 0x7362) & 0x80808080u);
  const uint32_t l03 = __byte_perm(kLo0, kLo1, m), l47 = __byte_perm(kLo0, kLo1, m2);
  r[0] = bf16x2_mul(__byte_perm(l03, h03, 0x5140), scale);
  r[1] = bf16x2_mul(__byte_perm(l03, h03, 0x7362), scale);
  r[2] = bf16x2_mul(__byte_perm(l47, h47, 0x5140), scale);
  r[3] = bf16x2_mul(__byte_perm(l47, h47, 0x7362), scale);
}

// Groups j0 .. j0 + G - 1 (32 K each: k16 steps 2j, 2j + 1) of a stage's block: the A fragments
// for this warp's rows (lr, lr + 8 local to the CTA) and NM weights, then their wgmmas as one
// commit group (N = 128 when WIDE, else 64 into the first 32 accumulators). Thread q's word j of
// a row holds values 32j + 8q .. + 7 (pack_fp4_for_mma); as the A fragments of steps 2j, 2j + 1
// they are positions 16h + 2q + {0, 1, 8, 9} (h = 0, 1), and the activations are laid in that
// order (act_quant_bf16_wgmma).
template <int NM, int TOK, int G, bool WIDE, int ACC>
__device__ __forceinline__ void group_step(const Stage<NM, TOK>& st, int lr, int j0, bool first,
                                           float (&acc)[NM][ACC]) {
  const int q = threadIdx.x & 3;
  uint32_t a[2 * G][NM][4];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const int j = j0 + g;
      const uint32_t wa = *reinterpret_cast<const uint32_t*>(&st.w[m][lr][16 * q + 4 * j]);
      const uint32_t wb = *reinterpret_cast<const uint32_t*>(&st.w[m][lr + 8][16 * q + 4 * j]);
      uint32_t ra[4], rb[4];
      e2m1x8_bf16(wa, e8m0_bf16x2(st.e[m][lr], j), ra);
      e2m1x8_bf16(wb, e8m0_bf16x2(st.e[m][lr + 8], j), rb);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[2 * g + h][m][0] = ra[2 * h];
        a[2 * g + h][m][1] = rb[2 * h];
        a[2 * g + h][m][2] = ra[2 * h + 1];
        a[2 * g + h][m][3] = rb[2 * h + 1];
      }
    }
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 2 * G; ++k)
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const int ks = 2 * j0 + k;  // k16 step of the block
      const uint64_t desc = wgmma_desc_sw128(st.act + (ks >> 2) * TOK * 128 + 32 * (ks & 3));
      if constexpr (WIDE)
        wgmma_m64n128k16_bf16_rs(acc[m], a[k][m], desc, !(first && k == 0));
      else
        wgmma_m64n64k16_bf16_rs(*reinterpret_cast<float(*)[32]>(acc[m]), a[k][m], desc, !(first && k == 0));
    }
  wgmma_commit();
}

// acc[m] = W_m[rows of this warp] · x[tile columns] over all nkb >= 1 128-blocks (every thread of
// the CTA calls it). w/e: the CTA's first row of each weight and of its scales. The first wgmma
// starts the accumulators from zero (registers set by other instructions inside the wgmma
// pipeline make ptxas serialise it).
template <int NM, int TOK, bool WIDE, int ACC>
__device__ __forceinline__ void wgmma_rows_times_tile(unsigned char* smem, const uint8_t* const (&w)[NM],
                                                      const uint8_t* const (&e)[NM], int64_t rb, int64_t sc,
                                                      const __nv_bfloat16* x, int64_t ld, const int32_t* col_row,
                                                      int count, int64_t nkb, float (&acc)[NM][ACC]) {
  constexpr int S = kStages<NM, TOK>, G = kGroupsPerCommit<TOK>;
  Stage<NM, TOK>* st = reinterpret_cast<Stage<NM, TOK>*>(smem);
  const int groups = (count + 7) / 8;
  const int lr = (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2);  // warp w of the CTA: rows 16w..
  uint32_t off[kActCopies<TOK>];
  act_offsets<TOK>(col_row, groups, ld, off);
  for (int b = 0; b < S - 2; ++b) {
    if (b < nkb)
      stage_block(st[b], x, off, w, e, rb, sc, b);
    else
      cp_async_commit();
  }
  int slot = 0;  // kb % kStages
  for (int64_t kb = 0; kb < nkb; ++kb) {
    wgmma_wait<1>();  // this warpgroup's wgmmas but the last commit group of block kb - 1 are done
    cp_async_wait<S - 3>();
    fence_proxy_async_smem();
    __syncthreads();  // block kb is in shared memory; both warpgroups are done with block kb - 2
    const int64_t nb = kb + S - 2;
    const int nslot = slot >= 2 ? slot - 2 : slot + S - 2;
    if (nb < nkb)
      stage_block(st[nslot], x, off, w, e, rb, sc, nb);
    else
      cp_async_commit();
    const Stage<NM, TOK>& cur = st[slot];
#pragma unroll
    for (int c = 0; c < 4 / G; ++c) {
      if (c > 0) wgmma_wait<1>();  // commit group c - 2 is done: its fragment registers are free
      group_step<NM, TOK, G, WIDE>(cur, lr, c * G, kb == 0 && c == 0, acc);
    }
    slot = slot + 1 == S ? 0 : slot + 1;
  }
  wgmma_wait<0>();
#pragma unroll
  for (int m = 0; m < NM; ++m) wgmma_pin(acc[m]);
}

// wgmma_rows_times_tile at the tile's width: one instantiation per width (a branch inside made
// ptxas fence every wgmma); 128-token kernels take m64n64k16 for a tile of <= 64 tokens.
template <int NM, int TOK, int ACC>
__device__ __forceinline__ void rows_times_tile_at_width(unsigned char* smem, const uint8_t* const (&w)[NM],
                                                         const uint8_t* const (&e)[NM], int64_t rb, int64_t sc,
                                                         const __nv_bfloat16* x, int64_t ld, const int32_t* col_row,
                                                         int count, int64_t nkb, float (&acc)[NM][ACC]) {
  if constexpr (TOK == 128) {
    if (count > 64) {
      wgmma_rows_times_tile<NM, TOK, true>(smem, w, e, rb, sc, x, ld, col_row, count, nkb, acc);
      return;
    }
  }
  wgmma_rows_times_tile<NM, TOK, false>(smem, w, e, rb, sc, x, ld, col_row, count, nkb, acc);
}

// Row (local to the CTA) and column of this thread's accumulator i (wgmma.cuh).
__device__ __forceinline__ int acc_row(int i) {
  return (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2) + ((i >> 1) & 1) * 8;
}
__device__ __forceinline__ int acc_col(int i) { return 8 * (i >> 2) + 2 * (threadIdx.x & 3) + (i & 1); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int TOK>
__global__ void __launch_bounds__(kWarpgroups * 128, 1)
    gateup_wgmma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                        const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                        const __nv_bfloat16* __restrict__ xb, int64_t d, int64_t I, float limit,
                        float* __restrict__ H) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  int32_t* col_row = reinterpret_cast<int32_t*>(smem + kStages<2, TOK> * sizeof(Stage<2, TOK>));
  for (int c = threadIdx.x; c < TOK; c += blockDim.x) col_row[c] = slot_pair[t.start + (c < t.count ? c : 0)] / K;
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kCtaRows;
  const DevWeight &w1 = tab[3 * t.expert], &w3 = tab[3 * t.expert + 2];
  const int64_t rb = d / 2, sc = w1.scale_cols;
  const uint8_t* const w[2] = {w1.data + packed_row_offset(r0, rb), w3.data + packed_row_offset(r0, rb)};
  const uint8_t* const e[2] = {w1.scale + r0 * sc, w3.scale + r0 * sc};
  constexpr int ACC = TOK / 2;
  float acc[2][ACC];
  rows_times_tile_at_width<2, TOK>(smem, w, e, rb, sc, xb, d, col_row, t.count, d / 128, acc);
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    const int col = acc_col(i);
    if (col < t.count)
      H[static_cast<int64_t>(t.start + col) * I + r0 + acc_row(i)] = swiglu_clamped(acc[0][i], acc[1][i], limit);
  }
#endif
}

template <int TOK>
__global__ void __launch_bounds__(kWarpgroups * 128, TOK == 64 ? 2 : 1)
    down_wgmma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                      const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                      const __nv_bfloat16* __restrict__ hb, int64_t d, int64_t I, float* __restrict__ Y) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  int32_t* col_row = reinterpret_cast<int32_t*>(smem + kStages<1, TOK> * sizeof(Stage<1, TOK>));
  for (int c = threadIdx.x; c < TOK; c += blockDim.x) col_row[c] = t.start + (c < t.count ? c : 0);
  __syncthreads();
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kCtaRows;
  const DevWeight& w2 = tab[3 * t.expert + 1];
  const int64_t rb = I / 2, sc = w2.scale_cols;
  const uint8_t* const w[1] = {w2.data + packed_row_offset(r0, rb)};
  const uint8_t* const e[1] = {w2.scale + r0 * sc};
  constexpr int ACC = TOK / 2;
  float acc[1][ACC];
  rows_times_tile_at_width<1, TOK>(smem, w, e, rb, sc, hb, I, col_row, t.count, I / 128, acc);
#pragma unroll
  for (int i = 0; i < ACC; ++i) {
    const int col = acc_col(i);
    if (col < t.count) Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + r0 + acc_row(i)] = acc[0][i];
  }
#endif
}

template <typename Kernel>
void set_smem(Kernel k, size_t bytes) {
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

}  // namespace dsv4::cuda::detail

namespace dsv4::cuda {
bool moe_wgmma_available() { return wgmma_available(); }
}  // namespace dsv4::cuda

namespace dsv4::cuda::detail {

template <int TOK, typename... Args>
void launch_gateup(unsigned rows, unsigned max_tiles, cudaStream_t s, Args... args) {
  constexpr size_t smem = wgmma_smem<2, TOK>();
  set_smem(gateup_wgmma_kernel<TOK>, smem);
  gateup_wgmma_kernel<TOK><<<dim3(rows / kCtaRows, max_tiles), kWarpgroups * 128, smem, s>>>(args...);
  DSV4_CUDA_LAUNCH_CHECK();
}

template <int TOK, typename... Args>
void launch_down(unsigned rows, unsigned max_tiles, cudaStream_t s, Args... args) {
  constexpr size_t smem = wgmma_smem<1, TOK>();
  set_smem(down_wgmma_kernel<TOK>, smem);
  down_wgmma_kernel<TOK><<<dim3(rows / kCtaRows, max_tiles), kWarpgroups * 128, smem, s>>>(args...);
  DSV4_CUDA_LAUNCH_CHECK();
}

void wgmma_gateup(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                  unsigned max_tiles, const int32_t* slot_pair, int K, const __nv_bfloat16* xb, int64_t x_rows, int64_t d,
                  int64_t I, float limit, float* H, cudaStream_t s) {
  DSV4_CHECK(wgmma_available(), "wgmma_gateup: needs an sm_90 device and a build for arch 90a");
  DSV4_CHECK(I % kCtaRows == 0 && d % 128 == 0, "wgmma_gateup: d and I must be multiples of 128");
  DSV4_CHECK(tile_tokens == 64 || tile_tokens == 128, "wgmma_gateup: tiles of 64 or 128 tokens");
  DSV4_CHECK(x_rows * d < int64_t{UINT32_MAX}, "wgmma_gateup: activations beyond 32-bit element offsets");
  const unsigned rows = static_cast<unsigned>(I);
  if (tile_tokens == 128)
    launch_gateup<128>(rows, max_tiles, s, tab, tiles, n_tiles, slot_pair, K, xb, d, I, limit, H);
  else
    launch_gateup<64>(rows, max_tiles, s, tab, tiles, n_tiles, slot_pair, K, xb, d, I, limit, H);
}

void wgmma_down(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                unsigned max_tiles, const int32_t* slot_pair, const __nv_bfloat16* hb, int64_t h_rows, int64_t d,
                int64_t I, float* Y, cudaStream_t s) {
  DSV4_CHECK(wgmma_available(), "wgmma_down: needs an sm_90 device and a build for arch 90a");
  DSV4_CHECK(d % kCtaRows == 0 && I % 128 == 0, "wgmma_down: d and I must be multiples of 128");
  DSV4_CHECK(tile_tokens == 64 || tile_tokens == 128, "wgmma_down: tiles of 64 or 128 tokens");
  DSV4_CHECK(h_rows * I < int64_t{UINT32_MAX}, "wgmma_down: activations beyond 32-bit element offsets");
  const unsigned rows = static_cast<unsigned>(d);
  if (tile_tokens == 128)
    launch_down<128>(rows, max_tiles, s, tab, tiles, n_tiles, slot_pair, hb, d, I, Y);
  else
    launch_down<64>(rows, max_tiles, s, tab, tiles, n_tiles, slot_pair, hb, d, I, Y);
}

}  // namespace dsv4::cuda::detail
