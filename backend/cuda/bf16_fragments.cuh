// bf16 tensor-core fragments the attention and indexer kernels share: two floats packed as a
// bf16 pair (round to nearest) and ldmatrix x4 loads of 16x16 blocks from shared memory. Only
// .cu files include this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cp_async.cuh"

namespace dsv4::cuda::detail {

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// ldmatrix x4 address of lane for a 16x16 block at (r0, c0) of a row-major bf16 matrix: the
// A-operand order of mma.m16n8k16 and of wgmma's register A (rows 0-7 / 8-15, then columns 0-7 /
// 8-15).
template <int P>
__device__ __forceinline__ const __nv_bfloat16* a_addr(const __nv_bfloat16 (*m)[P], int r0, int c0) {
  const int lane = threadIdx.x & 31, mi = lane >> 3, rr = lane & 7;
  return &m[r0 + rr + 8 * (mi & 1)][c0 + 8 * (mi >> 1)];
}

}  // namespace dsv4::cuda::detail
