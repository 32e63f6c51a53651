// Grouped FP8 GEMM on wgmma (gemm_fp8_grouped.h). A CTA owns kM = 64 WG output rows of one group
// (inside one 128-row scale block: one weight scale per 128-block of K) and N activation rows;
// every 128-block of K streams through a ring of kStages shared-memory stages by cp.async (the
// weight tile and the activation tile, both K-major in the 128-byte swizzle, and the N activation
// scales). Each warpgroup runs 4 wgmma.m64nNk32 (SS) per block into a fresh accumulator, then
// adds it × weight scale × activation scale of its column into the fp32 sums (the promotion every
// 128 products that FP8 tensor-core sums need; DeepSeek-V3 report §3.3).
//
// A stage tile of R rows x 128 bytes of K: row r at 128 r, its 16-byte chunk c at chunk c ^ (r %
// 8) (wgmma_desc_sw128); wgmma k-step s (32 bytes) starts 32 s into the tile. (The same kernel on
// core matrices without swizzle ran at ~190 TFLOP/s at any size, H100.) A warp copies 8 rows x 4
// chunks (64 contiguous bytes of each row; the swizzle spreads a chunk column over all banks).
// The weight's scales of the CTA's 128-blocks are read into shared memory once.
#include "backend/cuda/gemm_fp8_grouped.h"

#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

template <int WG, int N, int S>
struct GroupedCfg {
  static constexpr int kN = N, kStages = S;
  static constexpr int kM = 64 * WG;  // output rows per CTA
  static constexpr int kThreads = 128 * WG;
  static constexpr int kABytes = kM * 128;
  static constexpr int kBBytes = N * 128;
  static constexpr int kStageBytes = kABytes + kBBytes;  // 1024-byte multiples: atoms stay aligned
  static constexpr int kSmem = 1024 + S * (kStageBytes + N * 4);  // + alignment, + activation scales
};
// Small batches (<= 128 rows): one warpgroup, 64 x 64 tiles (wo_a at 64 rows: 128 CTAs, 3 per
// SM); larger: two warpgroups sharing a 128-row activation tile (half the activation traffic).
using SmallCfg = GroupedCfg<1, 64, 4>;
using LargeCfg = GroupedCfg<2, 128, 5>;
// Measured against those two at 129-512 rows (set_grouped_gemm_cfg): 128 weight rows x 64
// tokens, and 64 x 128; both 24 KB stages, two CTAs per SM.
using TallCfg = GroupedCfg<2, 64, 4>;
using WideCfg = GroupedCfg<1, 128, 4>;
// (Two accumulator sets, block kb's wgmmas running while block kb - 1 is promoted, compiled to
// serialised wgmmas: ptxas C7514, the promotion reads accumulators inside a pipeline stage.)

int g_forced_cfg = 0;  // set_grouped_gemm_cfg

__device__ __forceinline__ int chunk_offset(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Chunk i (< rows * 8) of a stage tile -> (row, chunk): warp-sized runs of 8 rows x 4 chunks.
__device__ __forceinline__ void chunk_of(int i, int& r, int& c) {
  const int w = i >> 5, l = i & 31;
  r = (w >> 1) * 8 + (l & 7);
  c = (w & 1) * 4 + (l >> 3);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int N>
__device__ __forceinline__ void wgmma_block(float (&d)[N / 2], uint64_t a, uint64_t b, bool acc) {
  if constexpr (N == 64)
    wgmma_m64n64k32_e4m3_ss(d, a, b, acc);
  else
    wgmma_m64n128k32_e4m3_ss(d, a, b, acc);
}
#endif

template <class C>
__global__ void __launch_bounds__(C::kThreads)
    fp8_grouped_kernel(DevWeight w, int64_t ng, const uint8_t* __restrict__ xq, int64_t ldq,
                       const float* __restrict__ xs, int64_t ldxs, int rows, float* __restrict__ y, int64_t ldy) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int N = C::kN, S = C::kStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);                                       // swizzle atoms
  float* sxs = reinterpret_cast<float*>(smem + S * C::kStageBytes);                // [S][N] activation scales
  // wg through a shuffle: the compiler then knows it is warp-uniform (a branch on it is not a
  // divergent path that serialises the wgmmas: ptxas C7520).
  const int tid = threadIdx.x, wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0);
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * C::kM, K = w.in, nkb = K / 128;
  const int64_t xkb0 = o0 / ng * nkb;  // the group's first 128-block of x
  const int r0 = static_cast<int>(blockIdx.y) * N;

  auto load_stage = [&](int slot, int64_t kb) {
    unsigned char* st = smem + slot * C::kStageBytes;
    const uint8_t* wa = w.data + o0 * K + kb * 128;
    for (int i = tid; i < C::kM * 8; i += C::kThreads) {
      int r, c;
      chunk_of(i, r, c);
      cp_async16(st + chunk_offset(r, c), wa + r * K + c * 16);
    }
    unsigned char* sb = st + C::kABytes;
    const uint8_t* xa = xq + (xkb0 + kb) * 128;
    for (int i = tid; i < N * 8; i += C::kThreads) {  // rows past the batch repeat its last (not stored)
      int r, c;
      chunk_of(i, r, c);
      cp_async16(sb + chunk_offset(r, c), xa + std::min<int64_t>(r0 + r, rows - 1) * ldq + c * 16);
    }
    float* sx = sxs + slot * N;
    for (int i = tid; i < N; i += C::kThreads) cp_async4(sx + i, xs + (xkb0 + kb) * ldxs + std::min(r0 + i, rows - 1));
  };

  float* wscale = sxs + S * N;  // [nkb]
  const int64_t wrow = o0 / 128;  // the weight's scale block row
  for (int64_t kb = tid; kb < nkb; kb += C::kThreads) wscale[kb] = scale_at(w, wrow, kb);
  for (int st = 0; st < S - 1; ++st) {
    if (st < nkb) load_stage(st, st);
    cp_async_commit();
  }
  float acc[N / 2], part[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  const int q = tid & 3;
  for (int64_t kb = 0; kb < nkb; ++kb) {
    cp_async_wait<S - 2>();
    fence_proxy_async_smem();
    __syncthreads();  // block kb is in shared memory; every warpgroup is done with block kb - 1
    if (kb + S - 1 < nkb) load_stage(static_cast<int>((kb + S - 1) % S), kb + S - 1);
    cp_async_commit();
    const float sw = wscale[kb];
    const unsigned char* st = smem + (kb % S) * C::kStageBytes;
    wgmma_fence();
    // The warpgroup as a constant: the descriptors then come from uniform values (built once a
    // block, advanced by uniform adds of 2 = 32 bytes) instead of being rebuilt in ordinary
    // registers and moved over for every wgmma (as in attention and the experts: bench/NOTES.md
    // step 31).
    auto block = [&](auto wg_const) {
      constexpr int Wg = decltype(wg_const)::value;
      const uint64_t da0 = wgmma_desc_sw128(st + Wg * 64 * 128), db0 = wgmma_desc_sw128(st + C::kABytes);
#pragma unroll
      for (int s = 0; s < 4; ++s) wgmma_block<N>(part, da0 + 2 * s, db0 + 2 * s, s > 0);
    };
    if (C::kThreads == 128 || wg == 0) block(std::integral_constant<int, 0>{});
    else block(std::integral_constant<int, 1>{});
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(part);
    const float* sx = sxs + (kb % S) * N;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[i] += part[i] * (sw * sx[8 * (i >> 2) + 2 * q + (i & 1)]);
  }
  const int64_t row = o0 + 64 * wg + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int r = r0 + 8 * (i >> 2) + 2 * q + (i & 1);
    if (r < rows) y[static_cast<int64_t>(r) * ldy + row + (i & 2 ? 8 : 0)] = acc[i];
  }
#endif
}

template <class C>
void launch(const DevWeight& w, int64_t ng, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs, int64_t rows,
            float* y, int64_t ldy, cudaStream_t s) {
  auto kernel = fp8_grouped_kernel<C>;
  const int smem = C::kSmem + static_cast<int>(w.in / 128) * 4;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid(static_cast<unsigned>(w.out / C::kM), static_cast<unsigned>(ceil_div(rows, int64_t(C::kN))));
  kernel<<<grid, C::kThreads, smem, s>>>(w, ng, xq, ldq, xs, ldxs, static_cast<int>(rows), y, ldy);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool fp8_grouped_gemm_ok(const DevWeight& w, int64_t groups) {
  return wgmma_available() && w.fmt == kFP8 && groups >= 1 && w.out % groups == 0 && (w.out / groups) % 64 == 0 &&
         w.in % 128 == 0 && w.in <= 65536 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void fp8_grouped_gemm(const DevWeight& w, int64_t groups, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs,
                      int64_t rows, float* y, int64_t ldy, cudaStream_t s) {
  DSV4_CHECK(fp8_grouped_gemm_ok(w, groups) && ldq % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 16 == 0,
             "fp8_grouped_gemm: needs an sm_90a device and build, an FP8 weight, in % 128 == 0, groups of a "
             "multiple of 64 rows and 16-byte aligned activation rows");
  DSV4_CHECK(rows >= 1 && rows < (1ll << 31) && ldxs >= rows, "fp8_grouped_gemm: bad row count");
  const int64_t ng = w.out / groups;
  if (g_forced_cfg != 0) {
    const bool m128 = g_forced_cfg == 2 || g_forced_cfg == 3;
    DSV4_CHECK(!m128 || ng % 128 == 0, "fp8_grouped_gemm: the forced tile needs groups of 128-row multiples");
    switch (g_forced_cfg) {
      case 1: return launch<SmallCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
      case 2: return launch<LargeCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
      case 3: return launch<TallCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
      default: return launch<WideCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
    }
  }
  if (rows <= 128)
    launch<SmallCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
  else if (ng % 128 == 0)
    launch<LargeCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
  else
    launch<SmallCfg>(w, ng, xq, ldq, xs, ldxs, rows, y, ldy, s);
}

void set_grouped_gemm_cfg(int cfg) {
  DSV4_CHECK(cfg >= 0 && cfg <= 4, "set_grouped_gemm_cfg: 0 (by size) .. 4");
  g_forced_cfg = cfg;
}

}  // namespace dsv4::cuda::detail
