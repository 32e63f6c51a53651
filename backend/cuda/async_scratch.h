// Stream-ordered scratch (cudaMallocAsync) that stays mapped between uses. The device's default
// pool returns its memory to the driver at every synchronisation (release threshold 0), so a
// caller that synchronises between calls (eager decode, benchmarks) paid a fresh mapping for each
// scratch buffer; keeping the pool makes a repeat allocation a free-list hit. Graph capture is
// unaffected (allocations inside a capture become graph memory nodes either way).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace dsv4::cuda {

// Sets the current device's default pool to keep what it has allocated (idempotent per device;
// DSV4_KEEP_POOL=0 leaves the driver default, for before/after measurements).
void keep_async_pool();
// bytes of scratch ordered on s (keep_async_pool first, unless s is capturing); release with
// async_release on the same stream.
void* async_scratch(size_t bytes, cudaStream_t s);
void async_release(void* p, cudaStream_t s);

template <typename T>
T* async_scratch_of(size_t count, cudaStream_t s) {
  return static_cast<T*>(async_scratch(count * sizeof(T), s));
}

}  // namespace dsv4::cuda
