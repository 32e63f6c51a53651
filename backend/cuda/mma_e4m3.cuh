// Tensor-core building blocks shared by the decode kernels (gemv_fp8_mma.cu, moe_mma.cu):
// mma.sync m16n8k32 on e4m3 operands (sm_89+) with fp32 accumulators, and the e2m1 -> e4m3 byte
// conversion that lets FP4 weights use it. FP8 weights and the activation codes of
// act_quant_fp8 feed the mma as stored: no per-element conversion at all. Only .cu files
// include this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda::detail {

// Four e4m3 codes (one word, c0 lowest) -> f16 pairs (c0, c1) and (c2, c3), exact.
__device__ __forceinline__ void e4m3x4_f16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// c = A (16x32: a0 / a2 row g, a1 / a3 row g+8) · B (32x8: b0, b1 column g), g = lane / 4, on
// fresh accumulators: every call's dot products are 32 long and summed by the caller in fp32
// (Hopper's FP8 tensor cores keep fewer accumulator bits over long K chains).
// Thread q = lane % 4 supplies 8 k-values per row (a0 with b0, a2 with b1): which 8 of the 32
// is free, as long as A and B agree.
// sm_90 has no mma.sync on e4m3: ptxas expands mma.m16n8k32.e4m3 into these same conversions and
// two f16 m16n8k16, plus an fp32 add of the zero accumulator per output (4 FADDs per call, kept
// because x + 0 turns -0 into +0); written out here without that add.
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  uint32_t a0l, a0h, a1l, a1h, a2l, a2h, a3l, a3h, b0l, b0h, b1l, b1h;
  e4m3x4_f16x2(a0, a0l, a0h);
  e4m3x4_f16x2(a1, a1l, a1h);
  e4m3x4_f16x2(a2, a2l, a2h);
  e4m3x4_f16x2(a3, a3l, a3h);
  e4m3x4_f16x2(b0, b0l, b0h);
  e4m3x4_f16x2(b1, b1l, b1h);
  // k16 step 1: the f16 fragment's k pairs (2q, 2q+1) / (2q+8, 2q+9) are codes 0-1 / 2-3 of a0 (row
  // g), a1 (row g+8) and b0; step 2 the same of a2, a3, b1.
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0l), "r"(a1l), "r"(a0h), "r"(a1h), "r"(b0l), "r"(b0h), "f"(0.f));
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a2l), "r"(a3l), "r"(a2h), "r"(a3h), "r"(b1l), "r"(b1h));
}

// Eight e2m1 (element 2i in the low nibble of byte i) -> e4m3 bytes, each value × 2^-6 exactly:
// the magnitude bits (e1 e0 m) land on e4m3's E1 E0 M2, so e2m1's subnormal 0.5 becomes the
// e4m3 subnormal 2^-7 and every normal keeps its exponent offset (callers fold 2^6 into the
// scale). even = elements (0, 2, 4, 6), odd = (1, 3, 5, 7); 7 integer instructions in all.
__device__ __forceinline__ void e2m1x8_e4m3(uint32_t w, uint32_t& even, uint32_t& odd) {
  even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);
  odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);
}
constexpr float kE2m1E4m3Unscale = 64.f;

// Eight e4m3 codes c0..c7 (two words, c0 lowest) -> (c0, c2, c4, c6) and (c1, c3, c5, c7): the
// k order e2m1x8_e4m3 gives the weights.
__device__ __forceinline__ void split_even_odd(uint2 c, uint32_t& even, uint32_t& odd) {
  even = __byte_perm(c.x, c.y, 0x6420);
  odd = __byte_perm(c.x, c.y, 0x7531);
}

}  // namespace dsv4::cuda::detail
