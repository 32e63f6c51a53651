// Device building blocks shared by the linears and the MoE: a stored weight as kernels see it,
// exact element decoders (E8M0, e4m3, e2m1, bf16), a GEMV core (one warp per output row,
// 16-byte weight loads decoded in registers, up to 16 activation rows per pass) and a tiled
// SIMT core (64x64 outputs, 32-wide K steps, weights decoded into shared memory).
// Only .cu files include this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/weight_view.h"

namespace dsv4::cuda::detail {

enum Fmt : int { kF32 = 0, kBF16 = 1, kFP8 = 2, kFP4 = 3 };

struct DevWeight {
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int64_t out = 0, in = 0, scale_cols = 0;
  int fmt = kF32;
  int scale_f32 = 0;
};

// Host side: validates the view (format/dtype pair, scale shape) and flattens it.
DevWeight dev_weight(const WeightView& w);
// Host side: the GEMV may use 16-byte weight loads and float4 activation loads.
bool vec_ok(const DevWeight& w, const void* x, int64_t ldx);

// Up to this many activation rows the linears run as GEMV (weight bandwidth bound).
constexpr int kGemvMaxRows = 16;

// Elements per 16-byte load, and bytes of one weight row.
template <int F>
struct FmtTraits;
template <>
struct FmtTraits<kF32> { static constexpr int kPerLoad = 4; };
template <>
struct FmtTraits<kBF16> { static constexpr int kPerLoad = 8; };
template <>
struct FmtTraits<kFP8> { static constexpr int kPerLoad = 16; };
template <>
struct FmtTraits<kFP4> { static constexpr int kPerLoad = 32; };

__host__ __device__ inline int64_t row_bytes(int fmt, int64_t in) {
  return fmt == kF32 ? in * 4 : fmt == kBF16 ? in * 2 : fmt == kFP8 ? in : in / 2;
}

__device__ __forceinline__ float e8m0_dev(uint8_t b) {
  if (b == 0xFF) return __int_as_float(0x7FC00000);
  if (b == 0) return __int_as_float(0x00400000);  // 2^-127 is an fp32 subnormal
  return __int_as_float(static_cast<int>(b) << 23);
}

__device__ __forceinline__ float scale_at(const DevWeight& w, int64_t r, int64_t c) {
  const int64_t i = r * w.scale_cols + c;
  if (w.scale_f32) return __ldg(reinterpret_cast<const float*>(w.scale) + i);
  return e8m0_dev(__ldg(w.scale + i));
}

__device__ __forceinline__ float e4m3_dev(uint8_t b) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  return __half2float(__half(h));
}

// e2m1 magnitude i in 0..7 -> {0, .5, 1, 1.5, 2, 3, 4, 6} built from fp32 bits (no table).
__device__ __forceinline__ float e2m1_dev(uint32_t c) {
  const uint32_t i = c & 7u;
  const uint32_t mag = i < 2 ? (i ? 0x3F000000u : 0u) : (((i >> 1) + 126u) << 23) | ((i & 1u) << 22);
  return __uint_as_float(mag | ((c & 8u) << 28));
}

// W[o, k] exactly as backend/cpu/linear.cpp's dequant_row.
__device__ __forceinline__ float w_elem(const DevWeight& w, int64_t o, int64_t k) {
  switch (w.fmt) {
    case kF32:
      return __ldg(reinterpret_cast<const float*>(w.data) + o * w.in + k);
    case kBF16: {
      const uint16_t b = __ldg(reinterpret_cast<const unsigned short*>(w.data) + o * w.in + k);
      return __uint_as_float(static_cast<uint32_t>(b) << 16);
    }
    case kFP8:
      return e4m3_dev(__ldg(w.data + o * w.in + k)) * scale_at(w, o / 128, k / 128);
    default: {
      const uint8_t b = __ldg(w.data + o * (w.in / 2) + (k >> 1));
      return e2m1_dev((k & 1) ? (b >> 4) : (b & 0xF)) * scale_at(w, o, k / 32);
    }
  }
}

// Eight packed e2m1 (element 2i low nibble) -> v[0..8) = value * 2^-14, exactly: the nibble's
// magnitude bits become fp16 exponent/mantissa bits (0x0200 = 2^-15 = 0.5 * 2^-14, ..., 0x0E00
// = 6 * 2^-14), the sign bit the fp16 sign; callers fold 2^14 into the group scale. About 3
// instructions per element instead of ~10 for a per-element branchy decode.
__device__ __forceinline__ void e2m1x8_scaled(uint32_t q, float* v) {
  const uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;  // even / odd elements
  const uint32_t p[4] = {__byte_perm(lo, 0, 0x4140), __byte_perm(lo, 0, 0x4342), __byte_perm(hi, 0, 0x4140),
                         __byte_perm(hi, 0, 0x4342)};  // (e0,e2) (e4,e6) (e1,e3) (e5,e7) in 16-bit lanes
  float2 f[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t h = ((p[i] << 9) & 0x0E000E00u) | ((p[i] << 12) & 0x80008000u);
    __half2_raw r;
    r.x = static_cast<unsigned short>(h & 0xFFFF);
    r.y = static_cast<unsigned short>(h >> 16);
    f[i] = __half22float2(__half2(r));
  }
  v[0] = f[0].x; v[2] = f[0].y; v[4] = f[1].x; v[6] = f[1].y;
  v[1] = f[2].x; v[3] = f[2].y; v[5] = f[3].x; v[7] = f[3].y;
}

__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Decodes the 16 bytes holding elements [k0, k0 + kPerLoad) of row o (unscaled) and returns
// the scale that multiplies all of them (1 for dense: one FP8 128-block / one FP4 32-group).
template <int F>
__device__ __forceinline__ float decode16(const DevWeight& w, int64_t o, int64_t k0, uint4 raw, float* v) {
  const uint32_t u[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (F == kF32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = __uint_as_float(u[j]);
    return 1.f;
  } else if constexpr (F == kBF16) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = __uint_as_float(u[j] << 16);
      v[2 * j + 1] = __uint_as_float(u[j] & 0xFFFF0000u);
    }
    return 1.f;
  } else if constexpr (F == kFP8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[j] & 0xFFFF), __NV_E4M3);
      __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u[j] >> 16), __NV_E4M3);
      float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
      v[4 * j] = a.x;
      v[4 * j + 1] = a.y;
      v[4 * j + 2] = b.x;
      v[4 * j + 3] = b.y;
    }
    return scale_at(w, o / 128, k0 / 128);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) e2m1x8_scaled(u[j], v + 8 * j);
    return scale_at(w, o, k0 / 32) * 16384.f;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

// acc[r] (all lanes) = Σ_{k in [kb, ke)} W[o, k] xs[r][k] for r < nrows, computed by one warp
// (ke < 0: to the end of the row; split-K callers pass kb a multiple of 32 * kPerLoad).
// VEC: 16-byte weight loads and float4 activation loads (callers check alignment and in %
// kPerLoad == 0); otherwise one element per lane per step.
template <int F, int R, bool VEC>
__device__ __forceinline__ void gemv_warp(const DevWeight& w, int64_t o, const float* const* xs, int nrows,
                                          float* acc, int64_t kb = 0, int64_t ke = -1) {
  const int lane = threadIdx.x & 31;
  if (ke < 0) ke = w.in;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  if constexpr (VEC) {
    constexpr int N = FmtTraits<F>::kPerLoad;
    const uint8_t* row = w.data + o * row_bytes(F, w.in);
    const int64_t step = 32 * N;
    constexpr int kDepth = 4;  // loads in flight per lane before any math (DRAM latency)
    for (int64_t k0 = kb + lane * N; k0 < ke; k0 += kDepth * step) {
      uint4 raw[kDepth];
#pragma unroll
      for (int u = 0; u < kDepth; ++u)
        raw[u] = k0 + u * step < ke ? ld_stream(row + row_bytes(F, k0 + u * step)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int64_t kk = k0 + u * step;
        if (kk >= ke) break;
        float v[N];
        const float s = decode16<F>(w, o, kk, raw[u], v);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= nrows) break;
          const float4* xp = reinterpret_cast<const float4*>(xs[r] + kk);
          float p = 0.f;
#pragma unroll
          for (int j = 0; j < N / 4; ++j) {
            const float4 xv = __ldg(xp + j);
            p += v[4 * j] * xv.x + v[4 * j + 1] * xv.y + v[4 * j + 2] * xv.z + v[4 * j + 3] * xv.w;
          }
          acc[r] += s * p;
        }
      }
    }
  } else {
    for (int64_t k = kb + lane; k < ke; k += 32) {
      const float wv = w_elem(w, o, k);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= nrows) break;
        acc[r] += wv * __ldg(xs[r] + k);
      }
    }
  }
  // nrows is warp-uniform: no shuffles for absent rows.
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < nrows) acc[r] = warp_sum(acc[r]);
}

// NR consecutive output rows o0 .. o0+n_o-1 (n_o <= NR) per warp sharing every activation load:
// at decode, activations re-read from L1 once per weight row would cost as many bytes as the
// weights (or more for FP4). For R <= 2 (registers: R*kPerLoad activations live per chunk).
template <int F, int R, int NR>
__device__ __forceinline__ void gemv_warp_rows(const DevWeight& w, int64_t o0, int n_o, const float* const* xs,
                                               int nrows, float (&acc)[NR][R]) {
  constexpr int N = FmtTraits<F>::kPerLoad;
  const int lane = threadIdx.x & 31;
  const int64_t rb = row_bytes(F, w.in);
  const uint8_t* rowp[NR];
#pragma unroll
  for (int q = 0; q < NR; ++q) {
    rowp[q] = w.data + (o0 + (q < n_o ? q : 0)) * rb;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[q][r] = 0.f;
  }
  for (int64_t k0 = lane * N; k0 < w.in; k0 += 32 * N) {
    uint4 raw[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) raw[q] = ld_stream(rowp[q] + row_bytes(F, k0));
    float xv[R][N];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4* xp = reinterpret_cast<const float4*>(xs[r < nrows ? r : 0] + k0);
#pragma unroll
      for (int j = 0; j < N / 4; ++j) {
        const float4 t = __ldg(xp + j);
        xv[r][4 * j] = t.x;
        xv[r][4 * j + 1] = t.y;
        xv[r][4 * j + 2] = t.z;
        xv[r][4 * j + 3] = t.w;
      }
    }
#pragma unroll
    for (int q = 0; q < NR; ++q) {
      float v[N];
      const float sc = decode16<F>(w, o0 + (q < n_o ? q : 0), k0, raw[q], v);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float p[4] = {0.f, 0.f, 0.f, 0.f};  // four chains: FMA latency, not issue, bounds one chain
#pragma unroll
        for (int j = 0; j < N; ++j) p[j % 4] += v[j] * xv[r][j];
        acc[q][r] += sc * ((p[0] + p[1]) + (p[2] + p[3]));
      }
    }
  }
#pragma unroll
  for (int q = 0; q < NR; ++q)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (q < n_o && r < nrows) acc[q][r] = warp_sum(acc[q][r]);
}

// Tiled SIMT core: Y[m, n0 + j] for m < M (≤ 64) rows and j < 64 outputs (o = row_begin + n0 + j
// < row_begin + n_out). Row m of the activations is xrow(m) (length w.in), the result goes to
// yrow(m)[n0 + j]. 256 threads, each 4x4 outputs; weights decoded once per tile into smem.
constexpr int kTileM = 64, kTileN = 64, kTileK = 32, kTileThreads = 256;

template <class XRow, class YRow>
__device__ __forceinline__ void tile_gemm(const DevWeight& w, int64_t row_begin, int64_t n_out, int64_t n0, int M,
                                          XRow xrow, YRow yrow) {
  __shared__ float sx[kTileK][kTileM + 4];
  __shared__ float sw[kTileK][kTileN + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < w.in; k0 += kTileK) {
#pragma unroll
    for (int i = 0; i < (kTileM * kTileK) / kTileThreads; ++i) {
      const int idx = tid + i * kTileThreads, m = idx / kTileK, kk = idx % kTileK;
      const int64_t k = k0 + kk;
      sx[kk][m] = (m < M && k < w.in) ? __ldg(xrow(m) + k) : 0.f;
      const int64_t n = n0 + m;  // the same index pattern loads the 64 weight rows
      sw[kk][m] = (n < n_out && k < w.in) ? w_elem(w, row_begin + n, k) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 a = *reinterpret_cast<const float4*>(&sx[kk][ty * 4]);
      const float4 b = *reinterpret_cast<const float4*>(&sw[kk][tx * 4]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = ty * 4 + i;
    if (m >= M) continue;
    float* yr = yrow(m);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n < n_out) yr[n] = acc[i][j];
    }
  }
}

}  // namespace dsv4::cuda::detail
