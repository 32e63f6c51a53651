// Routed experts on tensor cores at decode sizes (see moe_tiles.cuh). A CTA of 8 warps owns 16
// output rows of one expert tile; the warps split K and reduce in shared memory in warp order
// (deterministic). mma.m16n8k32 on e4m3 operands: the activation codes feed it as stored and the
// e2m1 weights become e4m3 bytes in 7 integer instructions per 8 values (mma_e4m3.cuh). The f16
// form of this kernel (two m16n8k16 per group, ~4x the conversion work) issued ~2.6 bytes of
// weight per warp instruction and streamed at ~1 TB/s. Fragment mapping (g = lane / 4,
// q = lane % 4): rows g and g+8 of the weight tile, token column g; thread q takes the 8 elements
// [8q, 8q + 8) of each 32-group (4 bytes of FP4, 8 activation codes), so one mma covers exactly
// one group, whose scale is applied to the fresh accumulator.
#include <cuda_fp8.h>

#include <cstdlib>

#include "backend/cuda/check.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_mma_block.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kSplitWarps = kMmaKSlices;  // K slices per CTA: 1-token tiles need the parallelism

__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

// acc[m][i] += Σ_k W_m[row_i, k] x[col_i, k] over 128-blocks [kb0, kb1) (unscaled by 2^6) for
// the NM weights of one expert that share x (gate and up: their loads are in flight together).
template <int NM, bool PACKED, int UNROLL>
__device__ __forceinline__ void rows_times_tile(const DevWeight* const (&w)[NM], int64_t r0, const TokenOperand& x,
                                                int64_t kb0, int64_t kb1, float (&acc)[NM][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t rb = w[0]->in / 2, sc = w[0]->scale_cols;
  const uint8_t* pa[NM];
  const uint8_t* sa[NM];
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    pa[m] = w[m]->data + (PACKED ? packed_row_offset(r0 + g, rb) + 16 * q : (r0 + g) * rb + 4 * q);
    sa[m] = w[m]->scale + (r0 + g) * sc;
  }
#pragma unroll UNROLL
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    BlockOperands<NM> o;
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      if constexpr (PACKED) {  // the thread's four words of the block are adjacent (pack_fp4_for_mma)
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(pa[m] + kb * kPackedBlockStride));
        const uint4 b = __ldg(reinterpret_cast<const uint4*>(pa[m] + kPackedPlus8Rows + kb * kPackedBlockStride));
        o.wa[m][0] = a.x, o.wa[m][1] = a.y, o.wa[m][2] = a.z, o.wa[m][3] = a.w;
        o.wb[m][0] = b.x, o.wb[m][1] = b.y, o.wb[m][2] = b.z, o.wb[m][3] = b.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          o.wa[m][j] = ld32(pa[m] + (kb * 4 + j) * 16);
          o.wb[m][j] = ld32(pa[m] + 8 * rb + (kb * 4 + j) * 16);
        }
      }
      o.ea[m] = ld32(sa[m] + kb * 4);  // E8M0 of the block's 4 groups, rows g and g+8
      o.eb[m] = ld32(sa[m] + 8 * sc + kb * 4);
    }
    if constexpr (PACKED) {  // act_quant_fp8's mma-packed order: the thread's 32 codes are adjacent
      load_packed_tokens<NM>(x, kb, o);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        o.xc[j] = x.codes ? __ldg(reinterpret_cast<const uint2*>(x.codes + (kb * 4 + j) * 32)) : make_uint2(0u, 0u);
      o.x0 = __ldg(x.s0 + kb * x.ld_s), o.x1 = __ldg(x.s1 + kb * x.ld_s);
    }
    block_product<NM>(o, acc);
  }
}

// Each warp's partials go to shared memory as soon as a row block is done (holding all RB
// blocks in registers spilled at RB = 4); after the barrier warp w < RB sums block w's NM
// entries over the warps in warp order (deterministic).
template <int NM, int RB>
__device__ __forceinline__ void stash_partial(const float (&part)[NM][4], int rb, float (*red)[RB][NM][4][32]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][rb][m][i][lane] = part[m][i];
}
template <int NM, int RB>
__device__ __forceinline__ void sum_partials(float (*red)[RB][NM][4][32], int rb, float (&acc)[NM][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = red[0][rb][m][i][lane];
      for (int w = 1; w < kSplitWarps; ++w) v += red[w][rb][m][i][lane];
      acc[m][i] = v;
    }
}

// MINB CTAs per SM: 2 with two 128-blocks of loads in flight per warp (128 registers), or 3
// with one (<= 85 registers: more warps to hide the dependent mma / conversion chains; ncu at
// 1 token showed 3.6 active warps per scheduler issuing every 6.5 cycles).
constexpr int unroll_for(int minb) { return minb >= 3 ? 1 : 2; }

// RB consecutive 16-row blocks per CTA: the tile, slot list and activation scales are read once
// for RB blocks of weights (a CTA of one block paid that dependent-load chain for 4 (gate/up)
// or 2 (down) 128-blocks per warp), and the grid shrinks by RB.
template <int RB, bool PACKED, int MINB>
__global__ void __launch_bounds__(kSplitWarps * 32, MINB)
    gateup_mma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                      const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair, int K,
                      const uint8_t* __restrict__ xq, const float* __restrict__ xs, int64_t ldxs, int64_t d, int64_t I,
                      float limit, float* __restrict__ H) {
  __shared__ float red[kSplitWarps][RB][2][4][32];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16 * RB;
  auto row_of = [&](int col) { return static_cast<int64_t>(slot_pair[t.start + (col < t.count ? col : 0)] / K); };
  const TokenOperand x{g < t.count ? xq + row_of(g) * d + (PACKED ? 32 : 8) * q : nullptr, xs + row_of(2 * q), xs + row_of(2 * q + 1),
                       ldxs};
  const int64_t nkb = d / 128, kb0 = warp * nkb / kSplitWarps, kb1 = (warp + 1) * nkb / kSplitWarps;
  const DevWeight* const ws[2] = {tab + 3 * t.expert, tab + 3 * t.expert + 2};  // W1, W3
  pdl_wait();  // x is being quantised by the kernel before this one (pdl.cuh)
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    float part[2][4] = {};
    rows_times_tile<2, PACKED, unroll_for(MINB)>(ws, r0 + 16 * rb, x, kb0, kb1, part);
    stash_partial<2, RB>(part, rb, red);
  }
  __syncthreads();
  if (warp >= RB) return;
  float acc[2][4];
  sum_partials<2, RB>(red, warp, acc);
  store_swiglu(H, I, t.start, t.count, r0 + 16 * warp + g, q, acc, limit);
}

template <int RB, bool PACKED, int MINB>
__global__ void __launch_bounds__(kSplitWarps * 32, MINB)
    down_mma_kernel(const DevWeight* __restrict__ tab, const MoeTile* __restrict__ tiles,
                    const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                    const uint8_t* __restrict__ hq, const float* __restrict__ hs, int64_t ldhs, int64_t d, int64_t I,
                    float* __restrict__ Y) {
  __shared__ float red[kSplitWarps][RB][1][4][32];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const MoeTile t = tiles[blockIdx.y];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16 * RB;
  auto slot_of = [&](int col) { return static_cast<int64_t>(t.start + (col < t.count ? col : 0)); };
  const TokenOperand x{g < t.count ? hq + slot_of(g) * I + (PACKED ? 32 : 8) * q : nullptr, hs + slot_of(2 * q),
                       hs + slot_of(2 * q + 1), ldhs};
  const int64_t nkb = I / 128, kb0 = warp * nkb / kSplitWarps, kb1 = (warp + 1) * nkb / kSplitWarps;
  const DevWeight* const ws[1] = {tab + 3 * t.expert + 1};  // W2
  pdl_wait();  // h is being quantised by the kernel before this one
#pragma unroll
  for (int rb = 0; rb < RB; ++rb) {
    float part[1][4] = {};
    rows_times_tile<1, PACKED, unroll_for(MINB)>(ws, r0 + 16 * rb, x, kb0, kb1, part);
    stash_partial<1, RB>(part, rb, red);
  }
  __syncthreads();
  if (warp >= RB) return;
  float acc[1][4];
  sum_partials<1, RB>(red, warp, acc);
  const int64_t row = r0 + 16 * warp + g;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 2 * q + (i & 1);
    if (col < t.count)
      Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + row + (i >= 2 ? 8 : 0)] = acc[0][i] * kE2m1E4m3Unscale;
  }
}

// One thread per 64-byte block (128 values of a row): word q of group j moves to word j of
// thread q's 16 bytes (a 4x4 transpose of 4-byte words), written to the block's tiled place.
__global__ void pack_fp4_kernel(const uint4* __restrict__ src, uint8_t* __restrict__ dst, int64_t rows,
                                int64_t row_bytes) {
  const int64_t nkb = row_bytes / 64, b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= rows * nkb) return;
  const int64_t row = b / nkb, kb = b % nkb;
  uint4 g[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) g[j] = src[b * 4 + j];
  uint4* out = reinterpret_cast<uint4*>(dst + packed_row_offset(row, row_bytes) + kb * kPackedBlockStride);
  out[0] = make_uint4(g[0].x, g[1].x, g[2].x, g[3].x);
  out[1] = make_uint4(g[0].y, g[1].y, g[2].y, g[3].y);
  out[2] = make_uint4(g[0].z, g[1].z, g[2].z, g[3].z);
  out[3] = make_uint4(g[0].w, g[1].w, g[2].w, g[3].w);
}

}  // namespace

void pack_fp4_for_mma(uint8_t* data, int64_t rows, int64_t row_bytes, uint8_t* scratch, cudaStream_t s) {
  DSV4_CHECK(row_bytes % 64 == 0 && rows % kPackTileRows == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0,
             "pack_fp4_for_mma: needs 16-byte aligned rows of 128-value blocks, rows a multiple of 64");
  const int64_t blocks = rows * row_bytes / 64;
  pack_fp4_kernel<<<static_cast<unsigned>((blocks + 255) / 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(data),
                                                                              scratch, rows, row_bytes);
  DSV4_CUDA_LAUNCH_CHECK();
  DSV4_CUDA_CHECK(cudaMemcpyAsync(data, scratch, static_cast<size_t>(rows * row_bytes), cudaMemcpyDeviceToDevice, s));
}

bool mma_experts_ok(const DevWeight* host_tab, int n, int64_t d, int64_t I) {
  if (d % 128 != 0 || I % 128 != 0) return false;
  for (int i = 0; i < n; ++i) {
    const DevWeight& w = host_tab[i];
    if (w.fmt != kFP4 || w.scale_f32 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(w.scale) % 4 != 0)
      return false;
  }
  return true;
}

namespace {

// 0: the default (row_blocks_for); set by set_moe_mma_variant, starting from DSV4_MOE_ROW_BLOCKS
// (1 / 2 / 4: A/B runs of whole models, e.g. the H100 favoured 1 where the H200 sweep chose 2).
int g_row_blocks = [] {
  const char* env = std::getenv("DSV4_MOE_ROW_BLOCKS");
  const int rb = env ? std::atoi(env) : 0;
  return rb == 1 || rb == 2 || rb == 4 ? rb : 0;
}();
int g_occupancy = 3;   // CTAs per SM the packed kernels are built for (2 or 3)

// 2 row blocks per CTA where they divide the rows, 3 CTAs per SM: in bench_linear (runs 2 and 3
// of 2026-12-03) 2 row blocks were the fastest or within 1% at 1 / 8 / 64 / 256 tokens (1 token:
// 73.7 us vs 76.7 for 1 and 89.2 for 4), and the 3-CTA build took 5-7% off that (1 / 8 / 64 /
// 256 tokens 75.0 / 331 / 1364 / 2000 -> 70.7 / 315 / 1284 / 1856 us).
int row_blocks_for(int64_t rows) {
  const int64_t blocks = rows / 16;
  const int rb = g_row_blocks > 0 ? g_row_blocks : 2;
  return blocks % rb == 0 ? rb : 1;
}

template <template <int, bool, int> class KernelOf, typename... Args>
void launch_rb(int rb, bool packed, dim3 grid, cudaStream_t s, Args... args) {
  if (!packed) rb = 1;  // the stored layout (DSV4_MOE_PACK=0 only) keeps one row block: it spills beyond
  grid.x /= rb;
  auto go = [&](auto kernel) { launch_dependent(kernel, grid, dim3(kSplitWarps * 32), 0, s, args...); };
  const bool occ3 = packed && g_occupancy == 3;
  switch (rb * 4 + (packed ? 2 : 0) + (occ3 ? 1 : 0)) {
    case 19: go(KernelOf<4, true, 3>::fn); break;
    case 18: go(KernelOf<4, true, 2>::fn); break;
    case 11: go(KernelOf<2, true, 3>::fn); break;
    case 10: go(KernelOf<2, true, 2>::fn); break;
    case 7: go(KernelOf<1, true, 3>::fn); break;
    case 6: go(KernelOf<1, true, 2>::fn); break;
    default: go(KernelOf<1, false, 2>::fn); break;
  }
}

template <int RB, bool PACKED, int MINB>
struct GateUpKernel {
  static constexpr auto fn = gateup_mma_kernel<RB, PACKED, MINB>;
};
template <int RB, bool PACKED, int MINB>
struct DownKernel {
  static constexpr auto fn = down_mma_kernel<RB, PACKED, MINB>;
};

}  // namespace

void mma_gateup(const DevWeight* tab, bool packed, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                int64_t I, float limit, float* H, cudaStream_t s) {
  launch_rb<GateUpKernel>(row_blocks_for(I), packed, dim3(static_cast<unsigned>(I / 16), max_tiles), s, tab,
                          tiles, n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H);
}

void mma_down(const DevWeight* tab, bool packed, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
              const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
              float* Y, cudaStream_t s) {
  launch_rb<DownKernel>(row_blocks_for(d), packed, dim3(static_cast<unsigned>(d / 16), max_tiles), s, tab,
                        tiles, n_tiles, slot_pair, hq, hs, ldhs, d, I, Y);
}

}  // namespace dsv4::cuda::detail

namespace dsv4::cuda {

void set_moe_mma_variant(int row_blocks, int ctas_per_sm) {
  DSV4_CHECK(row_blocks == 0 || row_blocks == 1 || row_blocks == 2 || row_blocks == 4,
             "set_moe_mma_variant: row blocks 0 (default), 1, 2 or 4");
  DSV4_CHECK(ctas_per_sm == 2 || ctas_per_sm == 3, "set_moe_mma_variant: 2 or 3 CTAs per SM");
  detail::g_row_blocks = row_blocks;
  detail::g_occupancy = ctas_per_sm;
}

}  // namespace dsv4::cuda
