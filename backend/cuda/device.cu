#include <atomic>
#include <cstdlib>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda {

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  return n > 0;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) DSV4_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  DSV4_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload out of range");
  DSV4_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  DSV4_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download out of range");
  DSV4_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(uint8_t value) {
  if (!bytes_) return;
  // cudaMemset on device memory may still be running when it returns, on the legacy default
  // stream, which does not order against the non-blocking streams the model uses: wait for it,
  // or a copy into a fresh buffer (a restored prefix-cache state) can be zeroed afterwards.
  DSV4_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

namespace {
std::atomic<uint64_t> g_scratch_epoch{0};
}

uint64_t scratch_epoch() { return g_scratch_epoch.load(std::memory_order_relaxed); }
void note_scratch_alloc() { g_scratch_epoch.fetch_add(1, std::memory_order_relaxed); }

void grow_scratch(DeviceBuffer& b, size_t bytes, size_t slack_div) {
  if (b.bytes() >= bytes) return;
  b = DeviceBuffer(bytes + bytes / slack_div);
  note_scratch_alloc();
}

void synchronize() { DSV4_CUDA_CHECK(cudaDeviceSynchronize()); }

bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

bool wgmma_available() {
#if defined(DSV4_CUDA_SM90A)
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

namespace detail {

bool pdl_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("DSV4_PDL");
    if (env && std::string(env) == "0") return false;
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  }();
  return on;
}

}  // namespace detail

}  // namespace dsv4::cuda
