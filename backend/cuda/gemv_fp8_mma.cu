// FP8 linears at decode sizes (<= 32 activation rows) on tensor cores: the SIMT GEMV spends ~60
// instructions per 16 weight bytes (e4m3 -> f32 converts, 16 FMAs, 4 activation loads) and
// is instruction-bound near the byte floor; mma.m16n8k32 on e4m3 operands takes the weight bytes
// and the activation codes of act_quant_fp8 as they are stored (the earlier f16 form of this
// kernel spent 6 converts per mma). A warp owns 16 output rows (inside one 128-row scale block)
// and a slice of K in 128-blocks; a CTA holds RT such row tiles x KS K slices, picked per shape
// (fp8_mma_gemv): more warps for small matrices, several 128-blocks per warp for large ones.
// Measured (bench/NOTES.md, step 3): kernel time unchanged against one tile of 8 slices for
// every shape — small matrices pay a fixed ~8 us per launch (ramp, one dependent round of
// loads, the reduction) and wq_b streams at ~2.2 TB/s either way; the time that was won at
// decode came from starting the kernel early (pdl.cuh). Step 18: what remained was grids of
// 1.3-1.9 waves of resident CTAs (wider CTAs make them one, launch()) and an L2 prefetch of each
// CTA's rows that then cost more than it hid (now off). Each 32-long mma result is added to an
// fp32 block sum, scaled by the weight's block scale and the activation's 1x128 scale; a tile's
// K-slice partials are summed in slice order (deterministic).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/check.h"
#include "backend/cuda/gemv_fp8_mma.h"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::detail {
namespace {

// One CTA's tiles of output o (CTA bx of that output). Inlined twice by the kernel below, once
// per output, so that each copy reads its output's fields from the kernel's parameters: one
// copy on a runtime-selected GemvOut held them in registers (1-row kernels 70 -> 104 registers,
// 3 -> 2 CTAs per SM).
template <int RT, int KS, int NB>
__device__ __forceinline__ void gemv_tiles(const GemvOut& o, int64_t bx, float (&red)[RT][KS][NB * 4][32],
                                           const uint8_t* __restrict__ xq, int64_t ldq, const float* __restrict__ xs,
                                           int64_t ldxs, int rows, bool prefetch) {
  const DevWeight& w = o.w;
  float* __restrict__ y = o.y;
  const int64_t row_begin = o.row_begin, n = o.n, ldy = o.ldy, grp_rows = o.grp_rows, grp_x = o.grp_x;
  pdl_trigger();  // a GEMV on the same activations right after this one may start its prefetch
  if (prefetch) {  // the CTA's weight rows into L2 while the activations are still being quantised (pdl.cuh)
    const int64_t first = bx * RT * 16, count = min(int64_t(RT * 16), n - first);
    prefetch_l2(w.data + (row_begin + first) * w.in, count * w.in);
  }
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = warp / KS, ks = warp % KS;
  const int64_t t0 = (bx * RT + tile) * 16, o0 = row_begin + t0;
  const int64_t xoff = (t0 / grp_rows) * grp_x, K = w.in, nkb = t0 < n ? K / 128 : 0;  // past n: no work
  const int64_t kb0 = ks * nkb / KS, kb1 = (ks + 1) * nkb / KS;
  const uint8_t* pa = w.data + (o0 + g) * K + 16 * q;
  const uint8_t* pb = pa + 8 * K;
  // Activation block j holds rows 8j .. 8j+7 (the mma's n = 8 columns); every block reuses the
  // weight fragments, so the weight is read once for up to 8 * NB rows.
  const uint8_t* xr[NB];
  int c0[NB], c1[NB];
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    xr[j] = 8 * j + g < rows ? xq + (8 * j + g) * ldq + xoff + 16 * q : nullptr;
    c0[j] = 8 * j + 2 * q;
    c1[j] = c0[j] + 1;
  }
  const float* sx = xs + (xoff / 128) * ldxs;
  float acc[NB][4] = {};
#pragma unroll 2
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    uint4 wa[2], wb[2], xv[NB][2];
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {
      const int64_t k = kb * 128 + sp * 64;
      wa[sp] = __ldg(reinterpret_cast<const uint4*>(pa + k));
      wb[sp] = __ldg(reinterpret_cast<const uint4*>(pb + k));
#pragma unroll
      for (int j = 0; j < NB; ++j)
        xv[j][sp] = xr[j] ? __ldg(reinterpret_cast<const uint4*>(xr[j] + k)) : make_uint4(0u, 0u, 0u, 0u);
    }
    const float sw = scale_at(w, o0 / 128, kb);
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      const float s0 = c0[j] < rows ? __ldg(sx + kb * ldxs + c0[j]) : 0.f;
      const float s1 = c1[j] < rows ? __ldg(sx + kb * ldxs + c1[j]) : 0.f;
      float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int sp = 0; sp < 2; ++sp) {
        float c[4], e[4];
        mma_e4m3(c, wa[sp].x, wb[sp].x, wa[sp].y, wb[sp].y, xv[j][sp].x, xv[j][sp].y);
        mma_e4m3(e, wa[sp].z, wb[sp].z, wa[sp].w, wb[sp].w, xv[j][sp].z, xv[j][sp].w);
#pragma unroll
        for (int i = 0; i < 4; ++i) blk[i] += c[i] + e[i];
      }
      acc[j][0] += blk[0] * (sw * s0);
      acc[j][1] += blk[1] * (sw * s1);
      acc[j][2] += blk[2] * (sw * s0);
      acc[j][3] += blk[3] * (sw * s1);
    }
  }
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[tile][ks][4 * j + i][lane] = acc[j][i];
  __syncthreads();
  if (ks != 0) return;
#pragma unroll
  for (int j = 0; j < NB; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = red[tile][0][4 * j + i][lane];
      for (int p = 1; p < KS; ++p) v += red[tile][p][4 * j + i][lane];
      const int col = 8 * j + 2 * q + (i & 1);
      const int64_t row = t0 + g + (i >= 2 ? 8 : 0);
      if (col < rows && row < n) y[col * ldy + row] = v;
    }
}

// Blocks [0, ctas0) compute output a, the rest output b (one launch for two weights on the same
// activations: wq_a / wkv, the shared expert's gate / up). MINB > 1 caps the registers at 64 per
// thread so that MINB CTAs fit an SM (launch()).
// MINB 0 leaves the bound open (an explicit 1 let ptxas take 104 registers, not 70).
template <int RT, int KS, int NB, int MINB>
__global__ void __launch_bounds__(RT * KS * 32, MINB)
    fp8_mma_gemv_kernel(GemvOut a, GemvOut b, unsigned ctas0, const uint8_t* __restrict__ xq, int64_t ldq,
                        const float* __restrict__ xs, int64_t ldxs, int rows, bool prefetch) {
  __shared__ float red[RT][KS][NB * 4][32];
  if (blockIdx.x < ctas0)
    gemv_tiles<RT, KS, NB>(a, blockIdx.x, red, xq, ldq, xs, ldxs, rows, prefetch);
  else
    gemv_tiles<RT, KS, NB>(b, blockIdx.x - ctas0, red, xq, ldq, xs, ldxs, rows, prefetch);
}

// K slices per tile: enough warps over the whole matrix to cover ~half the GPU's warp slots,
// each with at least two 128-blocks (one unrolled iteration of loads in flight), at most 16.
int k_slices(int64_t tiles, int64_t nkb) {
  const int64_t want_warps = 32ll * sm_count();
  const int64_t per_warp = std::max<int64_t>(2, ceil_div(tiles * nkb, want_warps));
  int ks = 16;
  while (ks > 2 && ks * per_warp > nkb) ks /= 2;
  return ks;
}

template <int RT, int KS, int NB>
void launch(const GemvOut& a, const GemvOut* b, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs, int rows,
            cudaStream_t s) {
  // DSV4_GEMV_PREFETCH=1: each CTA asks L2 for its rows before its PDL wait. Off by default since
  // step 18: with the grids in one wave of resident CTAs (by the register cap, below), a batch-1
  // step was 50 us faster without
  // it (1.887-1.899 vs 1.941-1.952 ms); the expert kernels' row prefetch had already outrun L2
  // (read 1.4x their bytes from DRAM, bench/NOTES.md step 10).
  static const bool prefetch = [] {
    const char* env = std::getenv("DSV4_GEMV_PREFETCH");
    return env && env[0] == '1';
  }();
  // DSV4_GEMV_REGCAP=1: the 1-row kernels capped at 64 registers (48-128 bytes of spills) so that
  // 4 CTAs of 8 warps or 2 of 16 fit an SM instead of 3 or 1 (at 70). It put wq_b / wo_a / wo_b
  // in one wave (b1 -15..24 us) but the wave rule below does so without spills and gained 50 us
  // more (bench/NOTES.md step 18), so it is off by default.
  static const bool regcap = [] {
    const char* env = std::getenv("DSV4_GEMV_REGCAP");
    return env && env[0] == '1';
  }();
  constexpr int kCapBlocks = 32 / (RT * KS);  // 64 registers x 32 warps = the SM's 64K
  auto kernel = fp8_mma_gemv_kernel<RT, KS, NB, 0>;
  if constexpr (NB == 1)
    if (regcap) kernel = fp8_mma_gemv_kernel<RT, KS, NB, kCapBlocks>;
  const int threads = RT * KS * 32;
  static const int64_t resident = [&] {  // CTAs of this kernel the GPU holds at once
    int per_sm = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    return int64_t(std::max(per_sm, 1)) * sm_count();
  }();
  const unsigned ctas0 = static_cast<unsigned>(ceil_div(a.n / 16, int64_t(RT)));
  const unsigned ctas1 = b ? static_cast<unsigned>(ceil_div(b->n / 16, int64_t(RT))) : 0u;
  if constexpr (NB <= 2 && KS > 1 && RT * 2 <= 8) {
    // A grid past one wave of resident CTAs takes twice the tiles per CTA and half the K slices
    // per tile (other sums, the same for every call) until it fits: at 1 row wq_b / wo_a (512
    // CTAs at 3 per SM) and wo_b (256 at 1), at 16 rows the same at 2 / 2 / 1 per SM. The last
    // partial wave left most SMs idle at the end of each 32 MB GEMV: b1 1.880-1.888 -> 1.832-1.834
    // ms (step 18, against the register cap). DSV4_GEMV_WAVEFIT=0 keeps the first shape.
    static const bool wavefit = [] {
      const char* env = std::getenv("DSV4_GEMV_WAVEFIT");
      return !(env && env[0] == '0');
    }();
    if (wavefit && ctas0 + ctas1 > resident) return launch<RT * 2, KS / 2, NB>(a, b, xq, ldq, xs, ldxs, rows, s);
  }
  if (b && ctas0 + ctas1 > resident && ctas0 <= resident) {
    // Together the pair would take another wave (the shared expert's gate / up at 16 rows: 256
    // CTAs at 1 per SM): one launch each, the same sums.
    launch_dependent(kernel, dim3(ctas0), dim3(threads), 0, s, a, a, ctas0, xq, ldq, xs, ldxs, rows, prefetch);
    launch_dependent(kernel, dim3(ctas1), dim3(threads), 0, s, *b, *b, ctas1, xq, ldq, xs, ldxs, rows, prefetch);
    return;
  }
  launch_dependent(kernel, dim3(ctas0 + ctas1), dim3(threads), 0, s, a, b ? *b : a, ctas0, xq, ldq, xs, ldxs, rows,
                   prefetch);
}

// The kernel shape for an output: RT x KS = 8 or 16 warps (16 slices of one tile for small
// matrices, 4 tiles of 2 for wq_b) and NB 8-row activation blocks per warp (four need 176
// registers, so at most 8 warps, 256 threads). As ks * 8 + nb.
int shape_of(const GemvOut& o, int rows) {
  const int nb = rows <= 8 ? 1 : rows <= 16 ? 2 : 4;
  const int ks = std::min(k_slices(o.n / 16, o.w.in / 128), nb == 4 ? 8 : 16);
  return ks * 8 + nb;
}

void check_out(const GemvOut& o, int64_t ldq) {
  DSV4_CHECK(fp8_mma_gemv_ok(o.w, o.row_begin, o.n, o.grp_rows) && ldq % 16 == 0 && o.grp_x % 128 == 0,
             "fp8_mma_gemv: unsupported shape");
}

// One launch of a (and b, when given: the same shape) on the codes xq / scales xs.
void dispatch(const GemvOut& a, const GemvOut* b, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs,
              int rows, cudaStream_t s) {
  DSV4_CHECK(rows >= 1 && rows <= kMmaGemvMaxRows, "fp8_mma_gemv: 1..", kMmaGemvMaxRows, " rows");
  switch (shape_of(a, rows)) {
#define DSV4_GEMV_CASE(KS_, RT_, NB_) \
  case KS_ * 8 + NB_: launch<RT_, KS_, NB_>(a, b, xq, ldq, xs, ldxs, rows, s); break;
#define DSV4_GEMV_CASES(NB_) \
  DSV4_GEMV_CASE(16, 1, NB_) DSV4_GEMV_CASE(8, 1, NB_) DSV4_GEMV_CASE(4, 2, NB_) DSV4_GEMV_CASE(2, 4, NB_)
    DSV4_GEMV_CASES(1)
    DSV4_GEMV_CASES(2)
    DSV4_GEMV_CASE(8, 1, 4) DSV4_GEMV_CASE(4, 2, 4) DSV4_GEMV_CASE(2, 4, 4)
#undef DSV4_GEMV_CASES
#undef DSV4_GEMV_CASE
    default: DSV4_CHECK(false, "fp8_mma_gemv: no kernel for ", rows, " rows");
  }
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool fp8_mma_gemv_ok(const DevWeight& w, int64_t row_begin, int64_t n, int64_t grp_rows) {
  return w.fmt == kFP8 && w.in % 128 == 0 && n % 16 == 0 && row_begin % 16 == 0 && grp_rows % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void fp8_mma_gemv(const DevWeight& w, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs, int rows, float* y,
                  int64_t row_begin, int64_t n, int64_t ldy, int64_t grp_rows, int64_t grp_x, cudaStream_t s) {
  const GemvOut o{w, y, row_begin, n, ldy, grp_rows, grp_x};
  check_out(o, ldq);
  dispatch(o, nullptr, xq, ldq, xs, ldxs, rows, s);
}

void fp8_mma_gemv_pair(const GemvOut& a, const GemvOut& b, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs,
                       int rows, cudaStream_t s) {
  check_out(a, ldq);
  check_out(b, ldq);
  if (shape_of(a, rows) == shape_of(b, rows) && a.w.in == b.w.in) return dispatch(a, &b, xq, ldq, xs, ldxs, rows, s);
  dispatch(a, nullptr, xq, ldq, xs, ldxs, rows, s);  // another shape: other sums, so two launches
  dispatch(b, nullptr, xq, ldq, xs, ldxs, rows, s);
}

}  // namespace dsv4::cuda::detail
