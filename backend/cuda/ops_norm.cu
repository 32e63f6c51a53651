// Row-wise and elementwise ops: embed, rms_norm, rope, swiglu, add_ape, ring_store.
// Twins: cpu::dequant_row, cpu::rms_norm, cpu::rope_inplace, the SwiGLU of model/moe.cpp, the
// APE add of compressor_project and the ring copy of attention_forward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/head_norm_rope.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

using detail::bf16x4_to_float4;
using detail::block_sum;
using detail::ceil_div;
using detail::rope_rotate;
using detail::row_threads;

namespace {

__device__ float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = __int_as_float(0x7fc00000);
  else if (e == 0) v = ldexpf(static_cast<float>(m), -9);
  else v = ldexpf(static_cast<float>(8 + m), e - 10);
  return (b & 0x80) ? -v : v;
}

__device__ float scale_value(const WeightView& w, int64_t r, int64_t c) {
  const int64_t i = r * w.scale_cols + c;
  if (w.scale_dtype == DType::F32) return reinterpret_cast<const float*>(w.scale)[i];
  const uint8_t b = w.scale[i];
  return b == 0xFF ? __int_as_float(0x7fc00000) : ldexpf(1.0f, static_cast<int>(b) - 127);
}

__device__ float weight_value(const WeightView& w, int64_t o, int64_t k) {
  const int64_t i = o * w.in + k;
  if (w.format == WeightFormat::FP8Block) return e4m3_value(w.data[i]) * scale_value(w, o / 128, k / 128);
  if (w.dtype == DType::F32) return reinterpret_cast<const float*>(w.data)[i];
  if (w.dtype == DType::BF16)
    return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(w.data)[i]) << 16);
  return __half2float(reinterpret_cast<const __half*>(w.data)[i]);  // F16
}

__global__ void embed_kernel(WeightView table, const int32_t* tok, int64_t copies, float* X) {
  const int64_t r = blockIdx.x, d = table.in;
  const int64_t t = tok[r];
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
    const float v = weight_value(table, t, k);
    for (int64_t c = 0; c < copies; ++c) X[(r * copies + c) * d + k] = v;
  }
}

// One block per row; the sum of squares is accumulated in double like the CPU twin.
__global__ void rms_norm_kernel(const float* x, const float* gamma, float* y, int64_t n, float eps, bool vec) {
  __shared__ double red[32];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  double ss = 0.0;
  if (vec) {
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(xr)[i];
      ss += double(v.x) * v.x + double(v.y) * v.y + double(v.z) * v.z + double(v.w) * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += double(xr[i]) * xr[i];
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(static_cast<float>(ss / n) + eps);
  if (vec) {
    for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(xr)[i];
      const float4 g = gamma ? reinterpret_cast<const float4*>(gamma)[i] : make_float4(1.f, 1.f, 1.f, 1.f);
      v.x = g.x * (v.x * inv);
      v.y = g.y * (v.y * inv);
      v.z = g.z * (v.z * inv);
      v.w = g.w * (v.w * inv);
      reinterpret_cast<float4*>(yr)[i] = v;
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (gamma ? gamma[i] : 1.0f) * (xr[i] * inv);
  }
}

// rms_norm then rope in one pass per (row, head) block of len channels (float4 path only): the
// tail's pairs are rotated in registers right after normalising, with rope_kernel's arithmetic.
// bf16_out: the result as bf16 pairs there (x unchanged), else in place.
// In: float, or uint16_t (bf16 bits, widened exactly; then bf16_out may be x itself: each thread
// rewrites only the values it read, after the block's sum).
template <typename In>
__device__ __forceinline__ float4 load4(const In* row, int64_t i) {
  if constexpr (std::is_same_v<In, float>)
    return reinterpret_cast<const float4*>(row)[i];
  else
    return bf16x4_to_float4(reinterpret_cast<const uint2*>(row)[i]);
}

// Out: bf16_out when given, else f32_out (x itself for fp32 input: in place).
// One warp per (row, head): a head is 128-512 values, so a block per head spent most of its time
// in the block-wide sum's barriers (1.8x its bytes at 8192 x 64 heads). Each lane keeps its first
// kCached float4 chunks in registers between the sum and the write (len <= 512 reads x once);
// later chunks are read again. Both input types share the one summation order (lane chunks in
// order, then the xor tree), so bf16 input gives the fp32 form's bits on the widened values.
constexpr int kNormRopeWarps = 8, kCached = 4;
template <typename In>
__global__ void __launch_bounds__(kNormRopeWarps * 32)
    rms_norm_rope_kernel(const In* x, const float* gamma, int64_t n_heads_total, int64_t heads, int64_t len, float eps,
                         const float* inv_freq, int64_t pairs, const int64_t* pos, __nv_bfloat16* bf16_out,
                         float* f32_out) {
  const int lane = threadIdx.x & 31;
  const int64_t rh = blockIdx.x * int64_t(kNormRopeWarps) + (threadIdx.x >> 5);
  if (rh >= n_heads_total) return;  // whole warps leave together: the shuffles below stay full
  const In* xr = x + rh * len;
  const int64_t chunks = len / 4;
  float4 v[kCached];
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < kCached; ++k) {
    const int64_t c = lane + 32 * k;
    v[k] = c < chunks ? load4(xr, c) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int k = 0; k < kCached; ++k) ss = detail::add_squares(ss, v[k]);
  for (int64_t c = lane + 32 * kCached; c < chunks; c += 32) ss = detail::add_squares(ss, load4(xr, c));
  ss = detail::warp_sum(ss);
  const float inv = detail::inv_rms(ss, len, eps);
  const int64_t tail = len - 2 * pairs;
  const float p = static_cast<float>(pos[rh / heads]);
  const auto cos_sin = [&](int64_t i) {
    const float ang = p * inv_freq[i];
    return make_float2(cosf(ang), sinf(ang));
  };
  const auto write = [&](int64_t c, float4 u) {
    const float4 g = gamma ? reinterpret_cast<const float4*>(gamma)[c] : make_float4(1.f, 1.f, 1.f, 1.f);
    float o[4];
    detail::norm_rope4(u, g, inv, c, tail, cos_sin, o);
    if (bf16_out) {
      __nv_bfloat162* b = reinterpret_cast<__nv_bfloat162*>(bf16_out + rh * len) + 2 * c;
      b[0] = __floats2bfloat162_rn(o[0], o[1]);
      b[1] = __floats2bfloat162_rn(o[2], o[3]);
    } else {
      reinterpret_cast<float4*>(f32_out + rh * len)[c] = make_float4(o[0], o[1], o[2], o[3]);
    }
  };
#pragma unroll
  for (int k = 0; k < kCached; ++k)
    if (lane + 32 * k < chunks) write(lane + 32 * k, v[k]);
  for (int64_t c = lane + 32 * kCached; c < chunks; c += 32) write(c, load4(xr, c));
}

template <typename In>
void launch_rms_norm_rope(const In* x, const float* gamma, int64_t rows, int64_t heads, int64_t len, float eps,
                          const float* inv_freq, int64_t pairs, const int64_t* pos, __nv_bfloat16* bf16_out,
                          float* f32_out, cudaStream_t s) {
  const int64_t n = rows * heads;
  rms_norm_rope_kernel<<<static_cast<unsigned>(ceil_div(n, int64_t(kNormRopeWarps))), kNormRopeWarps * 32, 0, s>>>(
      x, gamma, n, heads, len, eps, inv_freq, pairs, pos, bf16_out, f32_out);
  DSV4_CUDA_LAUNCH_CHECK();
}

// bf16 (nearest even) copy of n floats: the fallback form of rms_norm_rope's bf16 output.
__global__ void to_bf16_copy_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t len, const float* inv_freq, int64_t pairs,
                            const int64_t* pos, bool inverse) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows * heads * pairs) return;
  const int64_t i = t % pairs, rh = t / pairs, r = rh / heads;
  float* p = x + rh * len + (len - 2 * pairs) + 2 * i;
  // fp32 angle, as the reference computes it.
  const float ang = static_cast<float>(pos[r]) * inv_freq[i];
  float a = p[0], b = p[1];
  rope_rotate(a, b, cosf(ang), inverse ? -sinf(ang) : sinf(ang));
  p[0] = a;
  p[1] = b;
}

__global__ void swiglu_kernel(const float* gu, int64_t rows, int64_t I, float limit, float* h) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= rows * I) return;
  const int64_t r = t / I, i = t % I;
  float g = gu[r * 2 * I + i], v = gu[r * 2 * I + I + i];
  if (limit > 0) {
    g = fminf(g, limit);
    v = fminf(fmaxf(v, -limit), limit);
  }
  h[t] = g / (1.0f + expf(-g)) * v;
}

__global__ void add_ape_kernel(float* z, const int64_t* pos, const float* ape, int64_t m, int64_t width) {
  const int64_t r = blockIdx.x;
  const float* a = ape + (pos[r] % m) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) z[r * width + c] += a[c];
}

__global__ void ring_store_kernel(const float* rows, int64_t width, int64_t p0, int64_t first, float* ring,
                                  int64_t ring_rows) {
  const int64_t t = first + blockIdx.x;
  const float* src = rows + (t - p0) * width;
  float* dst = ring + (t % ring_rows) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[c];
}

// blockIdx.y = job, blockIdx.x = i-th stored row of that job.
__global__ void ring_store_jobs_kernel(const RingJob* jobs) {
  const RingJob J = jobs[blockIdx.y];
  const int64_t first = max(J.p0, J.p0 + J.n - J.ring_rows), t = first + blockIdx.x;
  if (t >= J.p0 + J.n) return;
  const float* src = J.rows + (t - J.p0) * J.width;
  float* dst = J.ring + (t % J.ring_rows) * J.width;
  for (int64_t c = threadIdx.x; c < J.width; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

void ring_store_jobs(const RingJob* jobs, int64_t n_jobs, int64_t max_rows, cudaStream_t s) {
  DSV4_CHECK(n_jobs < 65536, "cuda::ring_store_jobs: too many jobs");
  if (n_jobs <= 0 || max_rows <= 0) return;
  ring_store_jobs_kernel<<<dim3(static_cast<unsigned>(max_rows), static_cast<unsigned>(n_jobs)), 128, 0, s>>>(jobs);
  DSV4_CUDA_LAUNCH_CHECK();
}

void embed(const WeightView& table, const int32_t* tok, int64_t rows, int64_t copies, float* X, cudaStream_t s) {
  DSV4_CHECK(table.format == WeightFormat::FP8Block ||
                 (table.format == WeightFormat::Dense &&
                  (table.dtype == DType::F32 || table.dtype == DType::BF16 || table.dtype == DType::F16)),
             "cuda::embed: unsupported table format");
  if (rows == 0) return;
  embed_kernel<<<rows, 256, 0, s>>>(table, tok, copies, X);
  DSV4_CUDA_LAUNCH_CHECK();
}

void rms_norm(const float* x, const float* gamma, float* y, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  if (rows == 0) return;
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  const bool vec = n % 4 == 0 && al(x) && al(y) && (!gamma || al(gamma));
  rms_norm_kernel<<<rows, row_threads(n), 0, s>>>(x, gamma, y, n, eps, vec);
  DSV4_CUDA_LAUNCH_CHECK();
}

void rms_norm_rope(float* x, const float* gamma, int64_t rows, int64_t heads, int64_t len, float eps,
                   const float* inv_freq, int64_t pairs, const int64_t* pos, cudaStream_t s, void* bf16_out) {
  if (rows * heads == 0) return;
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  auto* b16 = static_cast<__nv_bfloat16*>(bf16_out);
  if (len % 4 != 0 || (2 * pairs) % 4 != 0 || 2 * pairs > len || !al(x) || (gamma && !al(gamma)) ||
      (b16 && !al(b16))) {
    rms_norm(x, gamma, x, rows * heads, len, eps, s);
    rope(x, rows, heads, len, inv_freq, pairs, pos, false, s);
    if (!b16) return;
    const int64_t n = rows * heads * len;
    to_bf16_copy_kernel<<<ceil_div(n, 256), 256, 0, s>>>(x, n, b16);
    DSV4_CUDA_LAUNCH_CHECK();
    return;
  }
  launch_rms_norm_rope<float>(x, gamma, rows, heads, len, eps, inv_freq, pairs, pos, b16, x, s);
}

void rms_norm_rope_bf16(void* x16, const float* gamma, int64_t rows, int64_t heads, int64_t len, float eps,
                        const float* inv_freq, int64_t pairs, const int64_t* pos, cudaStream_t s, float* f32_out) {
  const auto al = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  DSV4_CHECK(len % 4 == 0 && (2 * pairs) % 4 == 0 && 2 * pairs <= len && al(x16) && (!gamma || al(gamma)) &&
                 (!f32_out || al(f32_out)),
             "cuda::rms_norm_rope_bf16: needs len and 2 pairs multiples of 4 and 16-byte aligned rows");
  if (rows * heads == 0) return;
  auto* x = static_cast<uint16_t*>(x16);
  launch_rms_norm_rope<uint16_t>(x, gamma, rows, heads, len, eps, inv_freq, pairs, pos,
                                 f32_out ? nullptr : reinterpret_cast<__nv_bfloat16*>(x), f32_out, s);
}

void rope(float* x, int64_t rows, int64_t heads, int64_t len, const float* inv_freq, int64_t pairs,
          const int64_t* pos, bool inverse, cudaStream_t s) {
  const int64_t n = rows * heads * pairs;
  if (n == 0) return;
  rope_kernel<<<ceil_div(n, 256), 256, 0, s>>>(x, rows, heads, len, inv_freq, pairs, pos, inverse);
  DSV4_CUDA_LAUNCH_CHECK();
}

void swiglu(const float* gu, int64_t rows, int64_t I, float limit, float* h, cudaStream_t s) {
  if (rows * I == 0) return;
  swiglu_kernel<<<ceil_div(rows * I, 256), 256, 0, s>>>(gu, rows, I, limit, h);
  DSV4_CUDA_LAUNCH_CHECK();
}

void add_ape(float* z, const int64_t* pos, const float* ape, int64_t R, int64_t m, int64_t width, cudaStream_t s) {
  if (R == 0) return;
  add_ape_kernel<<<R, 128, 0, s>>>(z, pos, ape, m, width);
  DSV4_CUDA_LAUNCH_CHECK();
}

void ring_store(const float* rows, int64_t n, int64_t width, int64_t p0, float* ring, int64_t ring_rows,
                cudaStream_t s) {
  const int64_t first = std::max(p0, p0 + n - ring_rows), count = p0 + n - first;
  if (count <= 0) return;
  ring_store_kernel<<<count, 128, 0, s>>>(rows, width, p0, first, ring, ring_rows);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
