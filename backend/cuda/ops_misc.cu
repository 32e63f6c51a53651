#include <algorithm>
#include "backend/cuda/check.h"
#include "backend/cuda/ops_misc.h"

namespace dsv4::cuda {

namespace {
__global__ void scale_kernel(float* x, int64_t n, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] *= a;
}

__global__ void gather_kernel(const float* src, const int64_t* idx, int64_t width, float* dst) {
  const float* s = src + idx[blockIdx.x] * width;
  float* d = dst + int64_t(blockIdx.x) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}
// bf16 rows widened (exactly); idx null: row i itself.
__global__ void gather_widen_kernel(const uint16_t* src, const int64_t* idx, int64_t width, float* dst) {
  const uint16_t* s = src + (idx ? idx[blockIdx.x] : int64_t(blockIdx.x)) * width;
  float* d = dst + int64_t(blockIdx.x) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) d[c] = __uint_as_float(uint32_t(s[c]) << 16);
}
__global__ void add_row_broadcast_kernel(float* x, const float* b, int64_t copies, int64_t width) {
  const int64_t r = blockIdx.x / copies;
  float* xr = x + int64_t(blockIdx.x) * width;
  const float* br = b + r * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) xr[c] += br[c];
}
}  // namespace

void scale_inplace(float* x, int64_t n, float a, cudaStream_t s) {
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 4096));
  scale_kernel<<<blocks, threads, 0, s>>>(x, n, a);
  DSV4_CUDA_LAUNCH_CHECK();
}

void gather_rows(const float* src, const int64_t* idx, int64_t n, int64_t width, float* dst, cudaStream_t s) {
  if (n == 0) return;
  gather_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(src, idx, width, dst);
  DSV4_CUDA_LAUNCH_CHECK();
}

void gather_rows_widen(const uint16_t* src, const int64_t* idx, int64_t n, int64_t width, float* dst, cudaStream_t s) {
  if (n == 0) return;
  gather_widen_kernel<<<static_cast<unsigned>(n), 256, 0, s>>>(src, idx, width, dst);
  DSV4_CUDA_LAUNCH_CHECK();
}

void add_row_broadcast(float* x, const float* b, int64_t rows, int64_t copies, int64_t width, cudaStream_t s) {
  if (rows * copies == 0) return;
  add_row_broadcast_kernel<<<static_cast<unsigned>(rows * copies), 256, 0, s>>>(x, b, copies, width);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
