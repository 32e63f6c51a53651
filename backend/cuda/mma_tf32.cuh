// Split-TF32 tensor-core products for fp32 operands (the mHC projections: ops_mhc.cu and
// ops_mhc_post_project_tiled.cu). Each operand is split into a TF32 high part and a TF32
// remainder; hi·hi + hi·lo + lo·hi is ~fp32 accurate (plain TF32 would be ~1e-3 off in mu).
#pragma once
#include <cstdint>

namespace dsv4::cuda::mhc {

__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  const float rest = x - __uint_as_float(hi);
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(rest));
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One k8 step of a warp's 16 rows against three n8 tiles of outputs (24), the smaller
// products first. xs: the A fragment (rows ra, ra + 8 at columns k + q, k + q + 4) as floats;
// fb[nb][0 / 1]: output 8 nb + g at columns k + q / k + q + 4.
__device__ __forceinline__ void mma_tf32_split_step(float (&acc)[3][4], const float (&xs)[4], const float (&fb)[3][2]) {
  uint32_t ah[4], al[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) split_tf32(xs[e], ah[e], al[e]);
#pragma unroll
  for (int nb = 0; nb < 3; ++nb) {
    uint32_t bh0, bl0, bh1, bl1;
    split_tf32(fb[nb][0], bh0, bl0);
    split_tf32(fb[nb][1], bh1, bl1);
    mma_tf32(acc[nb], al, bh0, bh1);
    mma_tf32(acc[nb], ah, bl0, bl1);
    mma_tf32(acc[nb], ah, bh0, bh1);
  }
}

}  // namespace dsv4::cuda::mhc
