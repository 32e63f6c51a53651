// FP8 GEMM for block-diagonal (grouped) weights past the GEMV sizes, on Hopper's FP8 warpgroup MMA
// (gemm_fp8_grouped.cu): wo_a's 8 groups in one launch, where cuBLASLt (no strided-batched
// block-scaled FP8 kernel) takes one 16-CTA GEMM per group. Only .cu files include it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/linear_kernels.cuh"

namespace dsv4::cuda::detail {

// An sm_90a device and build, an FP8 weight with 128x128 block scales, in % 128 == 0, groups
// rows of out / groups, each a multiple of 64.
bool fp8_grouped_gemm_ok(const DevWeight& w, int64_t groups);
// y[r, g * ng + o] = Σ_k x_g[r, k] W[g * ng + o, k] for r < rows, g < groups (ng = w.out / groups,
// x_g = columns [g * w.in, (g + 1) * w.in) of x): x as act_quant_fp8 leaves it (xq [rows, ldq]
// e4m3 codes, 16-byte aligned rows; xs [groups * w.in / 128][ldxs] scales); each 128-block's
// products summed by the tensor core, then scaled and added in fp32 (the W8A8 numbers).
void fp8_grouped_gemm(const DevWeight& w, int64_t groups, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs,
                      int64_t rows, float* y, int64_t ldy, cudaStream_t s);
// Benchmarks: force the CTA tile (weight rows x tokens): 0 by size (default), 1 64 x 64, 2 128 x
// 128, 3 128 x 64, 4 64 x 128.
void set_grouped_gemm_cfg(int cfg);

}  // namespace dsv4::cuda::detail
