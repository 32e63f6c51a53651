// The product of one 128-block of the 8-token expert kernels (moe_mma.cu, moe_mma_wide.cu):
// NM weights (rows g and g+8 of a 16-row tile) against token column g of the activation codes,
// with the E8M0 group scales and the activation's 128-block scales. Both kernels call this one
// body, so that they give the same bits. Only .cu files include this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/linear_kernels.cuh"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_tiles.cuh"

namespace dsv4::cuda::detail {

// The thread's operands of one 128-block: 16 bytes of FP4 (4 words, one per 32-group) of rows g
// (wa) and g+8 (wb) for each weight, their 4 E8M0 scales (one byte per group), the 32 activation
// codes of token g (8 per group j, as the weights' k order needs them), and the scales of C columns 2q / 2q+1.
template <int NM>
struct BlockOperands {
  uint32_t wa[NM][4], wb[NM][4], ea[NM], eb[NM];
  uint2 xc[4];
  float x0, x1;
};

// E8M0 byte j of a scale word as fp32 (2^(b - 127)) for b in 1..254: the byte moved into the
// exponent field (2 integer instructions; e8m0_dev's branches for 0 and 255 cost ~8).
template <int J>
__device__ __forceinline__ float e8m0_plain(uint32_t word) {
  const uint32_t bits = J <= 2 ? word << (23 - 8 * J) : word >> 1;
  return __int_as_float(static_cast<int>(bits & 0x7F800000u));
}

// Non-zero when a byte of the word is 0x00 or 0xFF (the E8M0 codes e8m0_plain gets wrong): such a
// byte has all bits equal, so b ^ (b >> 1) is 0 in its low 7 bits.
__device__ __forceinline__ uint32_t e8m0_special_bytes(uint32_t word) {
  const uint32_t u = (word ^ (word >> 1)) & 0x7F7F7F7Fu;
  return ~((u + 0x7F7F7F7Fu) | u) & 0x80808080u;
}

// acc[m][i] += (Σ_j mma_j · group scale_j) · activation scale, unscaled by 2^6 (kE2m1E4m3Unscale).
// PLAIN: no scale byte is 0x00 or 0xFF (same numbers, cheaper decode).
template <int NM, bool PLAIN>
__device__ __forceinline__ void block_product_as(const BlockOperands<NM>& o, const uint32_t (&xe)[4],
                                                 const uint32_t (&xo)[4], float (&acc)[NM][4]) {
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t ae, ao, be, bo;
      e2m1x8_e4m3(o.wa[m][j], ae, ao);
      e2m1x8_e4m3(o.wb[m][j], be, bo);
      float c[4];
      mma_e4m3(c, ae, be, ao, bo, xe[j], xo[j]);
      float s_a, s_b;
      if constexpr (PLAIN) {
        s_a = j == 0 ? e8m0_plain<0>(o.ea[m]) : j == 1 ? e8m0_plain<1>(o.ea[m]) : j == 2 ? e8m0_plain<2>(o.ea[m]) : e8m0_plain<3>(o.ea[m]);
        s_b = j == 0 ? e8m0_plain<0>(o.eb[m]) : j == 1 ? e8m0_plain<1>(o.eb[m]) : j == 2 ? e8m0_plain<2>(o.eb[m]) : e8m0_plain<3>(o.eb[m]);
      } else {
        s_a = e8m0_dev(static_cast<uint8_t>(o.ea[m] >> (8 * j)));
        s_b = e8m0_dev(static_cast<uint8_t>(o.eb[m] >> (8 * j)));
      }
      blk[0] += c[0] * s_a;
      blk[1] += c[1] * s_a;
      blk[2] += c[2] * s_b;
      blk[3] += c[3] * s_b;
    }
    acc[m][0] += blk[0] * o.x0;
    acc[m][1] += blk[1] * o.x1;
    acc[m][2] += blk[2] * o.x0;
    acc[m][3] += blk[3] * o.x1;
  }
}

// The activation operand: token column g's codes (row-major, ld = K of the weight; nullptr: no
// token in this column) and the per-128-block scales of the thread's two C columns (s[kb * ld_s]).
struct TokenOperand {
  const uint8_t* codes;  // row of token g at offset 8q (32q in act_quant_fp8's mma-packed order)
  const float* s0;       // scales of column 2q / 2q+1
  const float* s1;
  int64_t ld_s;
};

// Block kb of the token operand in the mma-packed order (the thread's 32 codes adjacent).
template <int NM>
__device__ __forceinline__ void load_packed_tokens(const TokenOperand& x, int64_t kb, BlockOperands<NM>& o) {
  uint4 lo = make_uint4(0u, 0u, 0u, 0u), hi = lo;
  if (x.codes) {
    lo = __ldg(reinterpret_cast<const uint4*>(x.codes + kb * 128));
    hi = __ldg(reinterpret_cast<const uint4*>(x.codes + kb * 128 + 16));
  }
  o.xc[0] = make_uint2(lo.x, lo.y), o.xc[1] = make_uint2(lo.z, lo.w);
  o.xc[2] = make_uint2(hi.x, hi.y), o.xc[3] = make_uint2(hi.z, hi.w);
  o.x0 = __ldg(x.s0 + kb * x.ld_s), o.x1 = __ldg(x.s1 + kb * x.ld_s);
}

// The gate/up epilogue of the 8-token kernels: H[slot, row (+8)] = swiglu(W1 x, W3 x) for the
// thread's C columns 2q / 2q+1 that hold a token of the tile (slots start..start+count).
__device__ __forceinline__ void store_swiglu(float* H, int64_t I, int start, int count, int64_t row, int q,
                                             const float (&acc)[2][4], float limit) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int col = 2 * q + (i & 1);
    if (col < count)
      H[static_cast<int64_t>(start + col) * I + row + (i >= 2 ? 8 : 0)] =
          swiglu_clamped(acc[0][i] * kE2m1E4m3Unscale, acc[1][i] * kE2m1E4m3Unscale, limit);
  }
}

template <int NM>
__device__ __forceinline__ void block_product(const BlockOperands<NM>& o, float (&acc)[NM][4]) {
  uint32_t xe[4], xo[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) split_even_odd(o.xc[j], xe[j], xo[j]);
  uint32_t special = 0;
#pragma unroll
  for (int m = 0; m < NM; ++m) special |= e8m0_special_bytes(o.ea[m]) | e8m0_special_bytes(o.eb[m]);
  // The choice must be the warp's (mma.sync is warp-wide: lanes that split between the two
  // bodies hung the kernel on a 0x00 scale byte in some lanes' rows).
  if (__builtin_expect(!__any_sync(0xFFFFFFFFu, special != 0), 1))
    block_product_as<NM, true>(o, xe, xo, acc);
  else
    block_product_as<NM, false>(o, xe, xo, acc);
}

}  // namespace dsv4::cuda::detail
