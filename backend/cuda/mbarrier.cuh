// Shared-memory mbarriers (sm_90) for producer / consumer hand-offs inside a CTA: a barrier
// completes a phase when its count of arrivals is reached, and waiters name the phase by its
// parity (phase n completes with parity n % 2). Arrive has release and the wait acquire
// semantics at CTA scope, so what a thread wrote before arriving is visible to a thread that
// waited for that phase. Only .cu files include this; sm_90 code only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cp_async.cuh"

namespace dsv4::cuda::detail {

// One thread initialises; the CTA then synchronises before any thread uses the barrier.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialisations visible to the other threads (and the async proxy) of the CTA.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_addr(bar)); }

// Returns once the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_addr(bar), parity); }

}  // namespace dsv4::cuda::detail
