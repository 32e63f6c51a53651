// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may start
// while the kernel before it on the stream is still running, once that kernel has called
// pdl_trigger(). At decode sizes the weight-streaming kernels (FP8 GEMV, routed experts) spend
// most of their time waiting on DRAM latency; started early they pull their weight bytes into
// L2 while the activation quantisation before them runs.
// The rule for a dependent kernel: before pdl_wait() it may read only what the kernel before it
// does not write — weights, and buffers written by kernels that finished before that kernel
// began. The activation quantisation kernels (launched normally, so they begin after everything
// before them completed) and the FP8 GEMV trigger; a GEMV after a GEMV (several weights on one
// quantised input) prefetches only weights before its wait, and its wait covers the first
// GEMV's completion, which covered the quantisation's. hc_post (launched normally) triggers too:
// hc_pre's projection after it (the one-launch decode form, and the split-K kernel below 256
// rows) asks L2 for its weights before its wait. At decode sizes hc_post_project (launched as a
// dependent: it loads the next projection's weights into registers before its wait) follows
// wo_b's GEMV or the routed experts' down kernel, which triggers at its start for it. Every
// other kernel keeps the plain full dependency.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/check.h"

namespace dsv4::cuda::detail {

// Blocks until the preceding kernel has completed and its writes are visible (a no-op when the
// kernel was not launched as a dependent).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the dependent kernel after this one be scheduled now (it still waits in pdl_wait()).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for bytes [p, p + n) from the calling thread (p and n multiples of 16). Nothing waits
// for it; the later loads find the lines in L2. Its SASS takes uniform operands: with a different
// address per lane it runs once per distinct lane value (a loop), so per-lane rows want
// prefetch.global.L2 a line at a time instead.
__device__ __forceinline__ void prefetch_l2_span(const void* p, uint32_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (n > 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#endif
}

// Asks L2 for bytes [p, p + n): one bulk prefetch per warp of the block, on its share of the
// range widened to 16-byte bounds (inside the same 256-byte allocation granule). Nothing waits
// for it; the later loads find the lines in L2.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const int64_t bytes = static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) + n + 15) / 16 * 16 - lo);
  const int warps = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5);
  const int64_t share = (bytes / warps + 15) / 16 * 16, b = warp * share;
  const int64_t len = bytes - b < share ? bytes - b : share;
  if ((threadIdx.x & 31) == 0 && n > 0 && len > 0)
    prefetch_l2_span(reinterpret_cast<const void*>(lo + b), static_cast<uint32_t>(len));
#endif
}

// Whether dependent launches are on (DSV4_PDL=0 turns them off, e.g. to compare).
bool pdl_enabled();

// kernel<<<grid, block, smem, s>>>(args...) as a programmatic dependent of the previous kernel
// on s (a plain launch when PDL is off).
template <typename... KArgs, typename... Args>
void launch_dependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DSV4_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace dsv4::cuda::detail
