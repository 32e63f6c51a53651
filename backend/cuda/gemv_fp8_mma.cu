// FP8 linears at decode sizes (<= 8 activation rows) on tensor cores: the SIMT GEMV spends ~60
// instructions per 16 weight bytes (e4m3 -> f32 converts, 16 FMAs, 4 activation loads) and
// is instruction-bound near the byte floor; mma.m16n8k32 on e4m3 operands takes the weight bytes
// and the activation codes of act_quant_fp8 as they are stored (the earlier f16 form of this
// kernel spent 6 converts per mma). A CTA owns 16 output rows (inside one 128-row scale block)
// and its 8 warps split K by 128-blocks; each 32-long mma result is added to an fp32 block sum,
// which is scaled by the weight's block scale and the activation's 1x128 scale; the warps'
// partials are summed in warp order (deterministic).
// Fragment mapping (g = lane / 4, q = lane % 4): weight rows g, g+8, token column g; thread q
// holds bytes [16q, 16q + 16) of each 64-k span, words (0, 1) feeding one mma and (2, 3) the next
// (the k order inside one mma is free as long as A and B agree).
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/gemv_fp8_mma.h"
#include "backend/cuda/mma_e4m3.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = 8;
using detail::pow2_scale;
using detail::to_e4m3;

// Lane (g, q) quantises its own operand from fp32 x (QUANT): the 32 values of row g it feeds
// to the mma in 128-block kb, the block's amax over the quad (lanes 4g..4g+3 hold the block),
// then act_quant_fp8's scale and codes exactly (same bits as the separate quantisation pass).
// s0 / s1: the scales of token columns 2q / 2q+1, from the quads of those rows.
__device__ __forceinline__ void quantise_operand(const float* xr, int64_t kb, int q, uint4 (&xv)[2], float& s0,
                                                 float& s1) {
  float v[2][16];
  float amax = 0.f;
#pragma unroll
  for (int sp = 0; sp < 2; ++sp)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 f = xr ? __ldg(reinterpret_cast<const float4*>(xr + kb * 128 + sp * 64 + 16 * q + 4 * i))
                          : make_float4(0.f, 0.f, 0.f, 0.f);
      v[sp][4 * i] = f.x, v[sp][4 * i + 1] = f.y, v[sp][4 * i + 2] = f.z, v[sp][4 * i + 3] = f.w;
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  const float s = pow2_scale(amax);
  uint32_t word[2][4];
#pragma unroll
  for (int sp = 0; sp < 2; ++sp)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      word[sp][i] = static_cast<uint32_t>(to_e4m3(v[sp][4 * i] / s)) |
                    static_cast<uint32_t>(to_e4m3(v[sp][4 * i + 1] / s)) << 8 |
                    static_cast<uint32_t>(to_e4m3(v[sp][4 * i + 2] / s)) << 16 |
                    static_cast<uint32_t>(to_e4m3(v[sp][4 * i + 3] / s)) << 24;
  xv[0] = make_uint4(word[0][0], word[0][1], word[0][2], word[0][3]);
  xv[1] = make_uint4(word[1][0], word[1][1], word[1][2], word[1][3]);
  s0 = __shfl_sync(0xFFFFFFFFu, s, 8 * q);
  s1 = __shfl_sync(0xFFFFFFFFu, s, 8 * q + 4);
}

// QUANT: xf is fp32 x [rows, ldq] (ldq in floats), quantised in the kernel (rows <= 2, where a
// separate quantisation launch costs as much as the GEMV's memory time); otherwise xq holds the
// codes of act_quant_fp8 and xs its scales.
template <bool QUANT>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_mma_gemv_kernel(DevWeight w, const uint8_t* __restrict__ xq, const float* __restrict__ xf, int64_t ldq,
                        const float* __restrict__ xs, int64_t ldxs, int rows, float* __restrict__ y,
                        int64_t row_begin, int64_t n, int64_t ldy, int64_t grp_rows, int64_t grp_x) {
  __shared__ float red[kWarps][4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * 16, o0 = row_begin + t0;
  const int64_t xoff = (t0 / grp_rows) * grp_x, K = w.in, nkb = K / 128;
  const int64_t kb0 = warp * nkb / kWarps, kb1 = (warp + 1) * nkb / kWarps;
  const uint8_t* pa = w.data + (o0 + g) * K + 16 * q;
  const uint8_t* pb = pa + 8 * K;
  const uint8_t* xr = !QUANT && g < rows ? xq + g * ldq + xoff + 16 * q : nullptr;
  const float* xfr = QUANT && g < rows ? xf + g * ldq + xoff : nullptr;
  const int c0 = 2 * q, c1 = 2 * q + 1;
  const float* sx = xs + (xoff / 128) * ldxs;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    uint4 wa[2], wb[2], xv[2];
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {
      const int64_t k = kb * 128 + sp * 64;
      wa[sp] = __ldg(reinterpret_cast<const uint4*>(pa + k));
      wb[sp] = __ldg(reinterpret_cast<const uint4*>(pb + k));
      if constexpr (!QUANT) xv[sp] = xr ? __ldg(reinterpret_cast<const uint4*>(xr + k)) : make_uint4(0u, 0u, 0u, 0u);
    }
    const float sw = scale_at(w, o0 / 128, kb);
    float s0, s1;
    if constexpr (QUANT) {
      quantise_operand(xfr, kb, q, xv, s0, s1);
    } else {
      s0 = c0 < rows ? __ldg(sx + kb * ldxs + c0) : 0.f;
      s1 = c1 < rows ? __ldg(sx + kb * ldxs + c1) : 0.f;
    }
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int sp = 0; sp < 2; ++sp) {
      float c[4], e[4];
      mma_e4m3(c, wa[sp].x, wb[sp].x, wa[sp].y, wb[sp].y, xv[sp].x, xv[sp].y);
      mma_e4m3(e, wa[sp].z, wb[sp].z, wa[sp].w, wb[sp].w, xv[sp].z, xv[sp].w);
#pragma unroll
      for (int i = 0; i < 4; ++i) blk[i] += c[i] + e[i];
    }
    acc[0] += blk[0] * (sw * s0);
    acc[1] += blk[1] * (sw * s1);
    acc[2] += blk[2] * (sw * s0);
    acc[3] += blk[3] * (sw * s1);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v = red[0][i][lane];
    for (int p = 1; p < kWarps; ++p) v += red[p][i][lane];
    const int col = 2 * q + (i & 1);
    const int64_t row = t0 + g + (i >= 2 ? 8 : 0);
    if (col < rows && row < n) y[col * ldy + row] = v;
  }
}

}  // namespace

bool fp8_mma_gemv_ok(const DevWeight& w, int64_t row_begin, int64_t n, int64_t grp_rows) {
  return w.fmt == kFP8 && w.in % 128 == 0 && n % 16 == 0 && row_begin % 16 == 0 && grp_rows % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void fp8_mma_gemv(const DevWeight& w, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs, int rows, float* y,
                  int64_t row_begin, int64_t n, int64_t ldy, int64_t grp_rows, int64_t grp_x, cudaStream_t s) {
  DSV4_CHECK(rows >= 1 && rows <= kMmaGemvMaxRows, "fp8_mma_gemv: 1..", kMmaGemvMaxRows, " rows");
  DSV4_CHECK(fp8_mma_gemv_ok(w, row_begin, n, grp_rows) && ldq % 16 == 0 && grp_x % 128 == 0,
             "fp8_mma_gemv: unsupported shape");
  fp8_mma_gemv_kernel<false><<<static_cast<unsigned>(n / 16), kWarps * 32, 0, s>>>(
      w, xq, nullptr, ldq, xs, ldxs, rows, y, row_begin, n, ldy, grp_rows, grp_x);
  DSV4_CUDA_LAUNCH_CHECK();
}

bool fp8_mma_gemv_f32_ok(const float* x, int64_t ldx, int rows) {
  return rows >= 1 && rows <= kMmaFusedQuantMaxRows && reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
}

void fp8_mma_gemv_f32(const DevWeight& w, const float* x, int64_t ldx, int rows, float* y, int64_t row_begin, int64_t n,
                      int64_t ldy, int64_t grp_rows, int64_t grp_x, cudaStream_t s) {
  DSV4_CHECK(fp8_mma_gemv_f32_ok(x, ldx, rows), "fp8_mma_gemv_f32: 1..", kMmaFusedQuantMaxRows,
             " rows of 16-byte aligned fp32");
  DSV4_CHECK(fp8_mma_gemv_ok(w, row_begin, n, grp_rows) && grp_x % 128 == 0, "fp8_mma_gemv_f32: unsupported shape");
  fp8_mma_gemv_kernel<true><<<static_cast<unsigned>(n / 16), kWarps * 32, 0, s>>>(
      w, nullptr, x, ldx, nullptr, 0, rows, y, row_begin, n, ldy, grp_rows, grp_x);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
