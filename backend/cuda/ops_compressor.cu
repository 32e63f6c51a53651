// Compressor window pooling (twin: the per-window loop of compressor_segment): one block per
// closing window; a thread per channel runs the softmax-gated pool over the window's rows in
// the CPU's order (previous window's lo-halves, then this window), then the block applies
// RMSNorm and RoPE at position w·m to the pooled vector held in shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

namespace {

__device__ __forceinline__ int64_t row_offset(const PoolJob& J, int64_t p, int64_t width, bool& from_chunk) {
  from_chunk = p >= J.chunk_p0;
  return from_chunk ? (p - J.chunk_p0) * width : (p % J.ring_rows) * width;
}

__global__ void compressor_pool_kernel(const PoolJob* jobs, int64_t m, int64_t c, bool overlap, const float* gamma,
                                       float eps, const float* inv_freq, int64_t pairs, bool bf16_out) {
  extern __shared__ float C[];  // [c]
  __shared__ double red[32];
  const PoolJob J = jobs[blockIdx.x];
  if (J.w < 0) return;  // padding job
  const int64_t width = (overlap ? 2 : 1) * c, w = J.w;
  const int64_t lo_begin = (overlap && w > 0) ? (w - 1) * m : w * m;  // lo-halves first, as the CPU
  const int64_t hi_begin = w * m, end = (w + 1) * m;
  const int64_t off = overlap ? c : 0;
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float mx = -INFINITY;
    for (int64_t p = lo_begin; p < end; ++p) {
      bool ck;
      const int64_t o = row_offset(J, p, width, ck) + (p >= hi_begin ? off : 0) + ch;
      mx = fmaxf(mx, (ck ? J.chunk_z : J.ring_z)[o]);
    }
    float den = 0.f, num = 0.f;
    for (int64_t p = lo_begin; p < end; ++p) {
      bool ck;
      const int64_t o = row_offset(J, p, width, ck) + (p >= hi_begin ? off : 0) + ch;
      const float e = expf((ck ? J.chunk_z : J.ring_z)[o] - mx);
      den += e;
      num += e * (ck ? J.chunk_a : J.ring_a)[o];
    }
    C[ch] = num / den;
  }
  double ss = 0.0;
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) ss += double(C[ch]) * C[ch];
  ss = detail::block_sum(ss, red);  // its barriers also publish C
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / c) + eps);
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) C[ch] = gamma[ch] * (C[ch] * inv);
  __syncthreads();
  const float pos = static_cast<float>(w * m);
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    float* p = C + (c - 2 * pairs) + 2 * i;
    const float ang = pos * inv_freq[i];
    const float cs = cosf(ang), sn = sinf(ang);
    const float a = p[0], b = p[1];
    p[0] = a * cs - b * sn;
    p[1] = a * sn + b * cs;
  }
  __syncthreads();
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    if (bf16_out)
      static_cast<__nv_bfloat16*>(J.out)[ch] = __float2bfloat16_rn(C[ch]);
    else
      static_cast<float*>(J.out)[ch] = C[ch];
  }
}

}  // namespace

void compressor_pool(const PoolJob* jobs, int64_t n_jobs, int64_t m, int64_t c, bool overlap, const float* gamma,
                     float eps, const float* inv_freq, int64_t pairs, cudaStream_t s, KeyFormat out_format) {
  DSV4_CHECK(2 * pairs <= c, "cuda::compressor_pool: rope pairs exceed the entry width");
  if (n_jobs == 0) return;
  const int threads = c >= 256 ? 256 : 128;
  compressor_pool_kernel<<<n_jobs, threads, c * sizeof(float), s>>>(jobs, m, c, overlap, gamma, eps, inv_freq,
                                                                      pairs, out_format == KeyFormat::BF16);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
