#include "backend/cuda/async_scratch.h"

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

namespace {
constexpr int kMaxDevices = 64;
std::once_flag g_device_once[kMaxDevices];

bool pool_kept_by_env() {
  const char* env = std::getenv("DSV4_KEEP_POOL");
  return !(env && std::string(env) == "0");
}
}  // namespace

void keep_async_pool() {
  int dev = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&dev));
  DSV4_CHECK(dev >= 0 && dev < kMaxDevices, "keep_async_pool: device ordinal ", dev, " out of range");
  std::call_once(g_device_once[dev], [dev] {
    if (!pool_kept_by_env()) return;
    cudaMemPool_t pool = nullptr;
    DSV4_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep_all = UINT64_MAX;
    DSV4_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  });
}

void* async_scratch(size_t bytes, cudaStream_t s) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  DSV4_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
  if (cap == cudaStreamCaptureStatusNone) keep_async_pool();
  void* p = nullptr;
  DSV4_CUDA_CHECK(cudaMallocAsync(&p, bytes, s));
  return p;
}

void async_release(void* p, cudaStream_t s) {
  if (p) DSV4_CUDA_CHECK(cudaFreeAsync(p, s));
}

}  // namespace dsv4::cuda
