#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/fill_random.h"

namespace dsv4::cuda {

namespace {

__device__ inline uint64_t mix(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ inline float normal_at(uint64_t seed, int64_t i) {
  const uint64_t a = mix(seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull)), b = mix(a + 0x632BE59BD9B4E019ull);
  const float u1 = fmaxf((a >> 40) * (1.0f / 16777216.0f), 1e-7f), u2 = (b >> 40) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

template <typename F>
__global__ void fill_kernel(int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) f(i);
}

template <typename F>
void launch(int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65536));
  fill_kernel<<<blocks, threads, 0, s>>>(n, f);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace

void fill_normal_bf16(uint16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  launch(n, [=] __device__(int64_t i) {
    __nv_bfloat16 v = __float2bfloat16(std * normal_at(seed, i));
    p[i] = *reinterpret_cast<uint16_t*>(&v);
  }, s);
}

void fill_normal_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s) {
  launch(n, [=] __device__(int64_t i) { p[i] = std * normal_at(seed, i); }, s);
}

void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t s) {
  launch(n, [=] __device__(int64_t i) {
    const float v = fminf(fmaxf(16.0f * normal_at(seed, i), -448.0f), 448.0f);
    p[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }, s);
}

void fill_e2m1_pairs(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t s) {
  launch(n, [=] __device__(int64_t i) { p[i] = static_cast<uint8_t>(mix(seed + uint64_t(i)) & 0xFF); }, s);
}

void fill_byte(uint8_t* p, int64_t n, uint8_t value, cudaStream_t s) {
  if (n > 0) DSV4_CUDA_CHECK(cudaMemsetAsync(p, value, static_cast<size_t>(n), s));
}

}  // namespace dsv4::cuda
