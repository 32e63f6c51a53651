// Tensor-core building blocks shared by the decode kernels (gemv_fp8_mma.cu, moe_mma.cu):
// mma.sync m16n8k16 with f16 operands and fp32 accumulators, and the exact e4m3 pair -> f16x2
// conversion its operands are built with. Only .cu files include this.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace dsv4::cuda::detail {

// c += A (16x16, rows g / g+8 in a0..a3) · B (16x8, column g in b0, b1); g = lane / 4.
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two e4m3 codes (low byte first) -> f16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_f16(uint32_t two) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}

}  // namespace dsv4::cuda::detail
