// Thread-block clusters and TMA copies (sm_90a): a cluster's CTAs run at once on nearby SMs, can
// arrive on each other's mbarriers (mbarrier.cuh) and receive one global read in all their shared
// memories (multicast), which halves the L2 traffic of data they share. Only .cu files include
// this; sm_90a code only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/tensor_map.h"

namespace dsv4::cuda::detail {

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The cluster barrier, split: every thread of every CTA arrives (release), then waits (acquire).
// Between the two a thread may go on with work that touches no other CTA.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

// The box of `map` at (x bytes, y rows) into dst of every CTA in `mask` (bit r: cluster rank r),
// each completing the box's bytes on its barrier at bar's offset. map: a __grid_constant__
// parameter's address.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const TensorMap* map, int x, int y, uint64_t* bar,
                                                      uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}

}  // namespace dsv4::cuda::detail
