// linear_exact: fp32 math on weights decoded in registers (decode: GEMV, one warp per output)
// or in shared memory (larger batches: 64x64 SIMT tiles). Twin of backend/cpu/linear.cpp.
#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_kernels.cuh"

namespace dsv4::cuda {
namespace detail {

DevWeight dev_weight(const WeightView& w) {
  DSV4_CHECK(!w.empty(), "linear: empty weight");
  DevWeight d;
  d.data = w.data;
  d.scale = w.scale;
  d.out = w.out;
  d.in = w.in;
  d.scale_cols = w.scale_cols;
  d.scale_f32 = w.scale_dtype == DType::F32;
  switch (w.format) {
    case WeightFormat::Dense:
      DSV4_CHECK(w.dtype == DType::F32 || w.dtype == DType::BF16, "linear: unsupported dense dtype ",
                 dtype_name(w.dtype));
      d.fmt = w.dtype == DType::F32 ? kF32 : kBF16;
      break;
    case WeightFormat::FP8Block:
      DSV4_CHECK(w.dtype == DType::F8_E4M3, "linear: FP8 block weight must be F8_E4M3");
      DSV4_CHECK(w.scale && w.scale_cols == (w.in + 127) / 128, "linear: FP8 scale must be [ceil(out/128), ceil(in/128)]");
      d.fmt = kFP8;
      break;
    case WeightFormat::FP4Group32:
      DSV4_CHECK(w.in % 32 == 0 && w.scale && w.scale_cols == w.in / 32, "linear: FP4 needs in % 32 == 0, scale [out, in/32]");
      d.fmt = kFP4;
      break;
  }
  DSV4_CHECK(d.scale_f32 || w.format == WeightFormat::Dense || w.scale_dtype == DType::F8_E8M0,
             "linear: scale dtype must be E8M0 or F32");
  return d;
}

bool vec_ok(const DevWeight& w, const void* x, int64_t ldx) {
  static const int per_load[4] = {4, 8, 16, 32};
  return w.in % per_load[w.fmt] == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
}

}  // namespace detail

namespace {
using namespace detail;

constexpr int kGemvWarps = 8;

// One warp per NR output rows (NR > 1 only with VEC and R <= 2, see gemv_warp_rows).
// Grouped (block-diagonal) form: output oi reads x columns from (oi / grp_rows) * grp_x on
// (grp_rows = n_out, grp_x = 0: a plain linear); a warp's NR rows never straddle a group.
template <int F, int R, bool VEC, int NR>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(DevWeight w, const float* __restrict__ x, int rows,
                                                              float* __restrict__ y, int64_t row_begin, int64_t n_out,
                                                              int64_t ldx, int64_t ldy, int64_t grp_rows,
                                                              int64_t grp_x) {
  const int64_t oi = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32) * NR;
  if (oi >= n_out) return;
  const float* xg = x + (oi / grp_rows) * grp_x;
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = xg + static_cast<int64_t>(r < rows ? r : 0) * ldx;
  const int lane = threadIdx.x & 31;
  if constexpr (NR == 1) {
    float acc[R];
    gemv_warp<F, R, VEC>(w, row_begin + oi, xs, rows, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (r == lane && r < rows) y[r * ldy + oi] = acc[r];
  } else {
    const int n_o = static_cast<int>(n_out - oi < NR ? n_out - oi : NR);
    float acc[NR][R];
    gemv_warp_rows<F, R, NR>(w, row_begin + oi, n_o, xs, rows, acc);
#pragma unroll
    for (int q = 0; q < NR; ++q)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (q * R + r == lane && q < n_o && r < rows) y[r * ldy + oi + q] = acc[q][r];
  }
}

// Split-K form for short outputs at decode (wq_a 1024 rows, wkv 512, ...): one warp per output
// left 1024 warps, a block per SM, a quarter of the loads in flight the bandwidth needs. Here
// the block's 8 warps are 8 / SPLIT outputs × SPLIT slices of K (multiples of a warp's 16-byte
// step), reduced through shared memory in slice order (deterministic).
template <int F, int R, int SPLIT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_split_kernel(DevWeight w, const float* __restrict__ x, int rows,
                                                                    float* __restrict__ y, int64_t row_begin,
                                                                    int64_t n_out, int64_t ldx, int64_t ldy,
                                                                    int64_t grp_rows, int64_t grp_x, int64_t kslice) {
  __shared__ float red[kGemvWarps][R];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, part = warp % SPLIT;
  const int64_t oi = static_cast<int64_t>(blockIdx.x) * (kGemvWarps / SPLIT) + warp / SPLIT;
  const bool valid = oi < n_out;
  const int64_t o = valid ? oi : n_out - 1;  // every warp reaches the barrier
  const float* xg = x + (o / grp_rows) * grp_x;
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = xg + static_cast<int64_t>(r < rows ? r : 0) * ldx;
  float acc[R];
  const int64_t kb = part * kslice, ke = kb + kslice < w.in ? kb + kslice : w.in;
  gemv_warp<F, R, true>(w, row_begin + o, xs, rows, acc, kb < w.in ? kb : w.in, ke);
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == lane) red[warp][r] = acc[r];
  __syncthreads();
  if (part != 0 || !valid) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == lane && r < rows) {
      float v = red[warp][r];
      for (int p = 1; p < SPLIT; ++p) v += red[warp + p][r];
      y[r * ldy + oi] = v;
    }
}

struct IdentityX {
  const float* x;
  int64_t ldx;
  __device__ const float* operator()(int m) const { return x + m * ldx; }
};
struct IdentityY {
  float* y;
  int64_t ldy;
  __device__ float* operator()(int m) const { return y + m * ldy; }
};

__global__ void __launch_bounds__(kTileThreads) tile_kernel(DevWeight w, const float* __restrict__ x, int64_t rows,
                                                            float* __restrict__ y, int64_t row_begin, int64_t n_out,
                                                            int64_t ldx, int64_t ldy) {
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int M = static_cast<int>(rows - m0 < kTileM ? rows - m0 : kTileM);
  tile_gemm(w, row_begin, n_out, static_cast<int64_t>(blockIdx.x) * kTileN, M, IdentityX{x + m0 * ldx, ldx},
            IdentityY{y + m0 * ldy, ldy});
}

// Four rows per warp when that still leaves >= 2 blocks per SM (H200: 132 SMs).
constexpr int kRowsPerWarp = 4;
constexpr int64_t kMultiRowMinOut = 2 * 132 * kGemvWarps * kRowsPerWarp;

struct Groups {
  int64_t rows, x;  // outputs per group, x column offset between groups
};

template <int F, int R>
void launch_gemv_r(const DevWeight& w, const float* x, int rows, float* y, int64_t rb, int64_t n, int64_t ldx,
                   int64_t ldy, bool vec, Groups g, cudaStream_t s) {
  const auto blocks = [&](int64_t per_warp) {
    return dim3(static_cast<unsigned>((n + kGemvWarps * per_warp - 1) / (kGemvWarps * per_warp)));
  };
  if constexpr (R <= 2) {
    if (vec && n >= kMultiRowMinOut && g.rows % kRowsPerWarp == 0) {
      gemv_kernel<F, R, true, kRowsPerWarp>
          <<<blocks(kRowsPerWarp), kGemvWarps * 32, 0, s>>>(w, x, rows, y, rb, n, ldx, ldy, g.rows, g.x);
      DSV4_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  if constexpr (R <= 4) {
    // Split K while the grid is short of ~4 blocks per SM and every slice keeps >= 2 warp steps.
    const int64_t warp_step = 32 * FmtTraits<F>::kPerLoad;
    int split = 1;
    while (split < kGemvWarps && (n * split + kGemvWarps - 1) / kGemvWarps < 4 * 132 &&
           w.in / (2 * split) >= warp_step)
      split *= 2;
    if (vec && split > 1) {
      const int64_t slice = ((w.in + split - 1) / split + warp_step - 1) / warp_step * warp_step;
      const dim3 grid(static_cast<unsigned>((n * split + kGemvWarps - 1) / kGemvWarps));
      auto go = [&](auto kernel) {
        kernel<<<grid, kGemvWarps * 32, 0, s>>>(w, x, rows, y, rb, n, ldx, ldy, g.rows, g.x, slice);
      };
      if (split == 2) go(gemv_split_kernel<F, R, 2>);
      else if (split == 4) go(gemv_split_kernel<F, R, 4>);
      else go(gemv_split_kernel<F, R, 8>);
      DSV4_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  if (vec)
    gemv_kernel<F, R, true, 1><<<blocks(1), kGemvWarps * 32, 0, s>>>(w, x, rows, y, rb, n, ldx, ldy, g.rows, g.x);
  else
    gemv_kernel<F, R, false, 1><<<blocks(1), kGemvWarps * 32, 0, s>>>(w, x, rows, y, rb, n, ldx, ldy, g.rows, g.x);
  DSV4_CUDA_LAUNCH_CHECK();
}

template <int F>
void launch_gemv(const DevWeight& w, const float* x, int rows, float* y, int64_t rb, int64_t n, int64_t ldx,
                 int64_t ldy, bool vec, Groups g, cudaStream_t s) {
  // Smallest compiled row count that covers `rows`: no wasted accumulators at decode.
  if (rows <= 1) return launch_gemv_r<F, 1>(w, x, rows, y, rb, n, ldx, ldy, vec, g, s);
  if (rows <= 2) return launch_gemv_r<F, 2>(w, x, rows, y, rb, n, ldx, ldy, vec, g, s);
  if (rows <= 4) return launch_gemv_r<F, 4>(w, x, rows, y, rb, n, ldx, ldy, vec, g, s);
  if (rows <= 8) return launch_gemv_r<F, 8>(w, x, rows, y, rb, n, ldx, ldy, vec, g, s);
  return launch_gemv_r<F, 16>(w, x, rows, y, rb, n, ldx, ldy, vec, g, s);
}

void gemv(const WeightView& wv, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t n, int64_t ldx,
          int64_t ldy, Groups g, cudaStream_t s) {
  const DevWeight w = detail::dev_weight(wv);
  const bool vec = detail::vec_ok(w, x, ldx) && (g.x * 4) % 16 == 0;
  const int r = static_cast<int>(rows);
  switch (w.fmt) {
    case kF32: return launch_gemv<kF32>(w, x, r, y, row_begin, n, ldx, ldy, vec, g, s);
    case kBF16: return launch_gemv<kBF16>(w, x, r, y, row_begin, n, ldx, ldy, vec, g, s);
    case kFP8: return launch_gemv<kFP8>(w, x, r, y, row_begin, n, ldx, ldy, vec, g, s);
    default: return launch_gemv<kFP4>(w, x, r, y, row_begin, n, ldx, ldy, vec, g, s);
  }
}

}  // namespace

void linear_exact(const WeightView& wv, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
                  int64_t ldx, int64_t ldy, cudaStream_t s) {
  DSV4_CHECK(row_begin >= 0 && row_end <= wv.out && row_begin <= row_end, "linear_exact: bad row range");
  const int64_t n = row_end - row_begin;
  if (rows <= 0 || n == 0) return;
  if (rows <= kGemvMaxRows) return gemv(wv, x, rows, y, row_begin, n, ldx, ldy, Groups{n, 0}, s);
  const DevWeight w = detail::dev_weight(wv);
  const dim3 grid(static_cast<unsigned>((n + kTileN - 1) / kTileN), static_cast<unsigned>((rows + kTileM - 1) / kTileM));
  // Narrow outputs at small batches (router 256, indexer weights 64, compressor 1024 outputs at
  // 64 rows) leave the 64x64 tile grid a few blocks on 132 SMs: stream the weights once per 16
  // rows with the GEMV instead (up to 8 passes; prefill-sized batches keep the tiles).
  if (rows <= 8 * kGemvMaxRows && static_cast<int64_t>(grid.x) * grid.y < 2 * 132) {
    for (int64_t r0 = 0; r0 < rows; r0 += kGemvMaxRows)
      gemv(wv, x + r0 * ldx, std::min<int64_t>(kGemvMaxRows, rows - r0), y + r0 * ldy, row_begin, n, ldx, ldy,
           Groups{n, 0}, s);
    return;
  }
  tile_kernel<<<grid, kTileThreads, 0, s>>>(w, x, rows, y, row_begin, n, ldx, ldy);
  DSV4_CUDA_LAUNCH_CHECK();
}

void linear_exact_grouped(const WeightView& w, int64_t groups, const float* x, int64_t rows, float* y, int64_t ldx,
                          int64_t ldy, cudaStream_t s) {
  DSV4_CHECK(groups >= 1 && w.out % groups == 0, "linear_exact_grouped: ", w.out, " rows do not split in ", groups,
             " groups");
  const int64_t ng = w.out / groups;
  if (rows <= 0) return;
  if (rows <= detail::kGemvMaxRows) return gemv(w, x, rows, y, 0, w.out, ldx, ldy, Groups{ng, w.in}, s);
  for (int64_t g = 0; g < groups; ++g) linear_exact(w, x + g * w.in, rows, y + g * ng, g * ng, (g + 1) * ng, ldx, ldy, s);
}

}  // namespace dsv4::cuda
