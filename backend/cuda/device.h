// Device memory: an owning buffer (plain cudaMalloc, never managed memory) and a tiny
// GPU-presence probe so tests skip cleanly on machines without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4::cuda {

// True when a CUDA device is present and usable (no exception when the driver is missing).
bool available();
// True when the current device is sm_90 and this build has arch-90a code: the wgmma kernels
// (routed experts at prefill sizes, the indexer's scorer) exist and may be launched.
bool wgmma_available();

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  // Fills every byte (tests poison outputs with 0xFF = NaN for fp32 before a run).
  void fill_bytes(uint8_t value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  if (count) b.download(v.data(), count * sizeof(T));
  return v;
}

// Scratch (re)allocations are counted: a captured CUDA graph holds the addresses it was
// captured with, so its owner compares the epoch and re-captures after any change.
uint64_t scratch_epoch();
void note_scratch_alloc();
// b = a fresh buffer of bytes + bytes / slack_div when it holds fewer than `bytes` (counted).
void grow_scratch(DeviceBuffer& b, size_t bytes, size_t slack_div = 4);

void synchronize();
// True when p points into device memory (cudaMalloc'd), false for host memory.
bool is_device_pointer(const void* p);

}  // namespace dsv4::cuda
