// Tensor-core FP8 GEMV for decode (gemv_fp8_mma.cu): y[r, o] for r < rows <= 32 on the e4m3 codes
// and 1x128 scales of act_quant_fp8 (the W8A8 numbers of FastLinear). Only .cu files include it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/linear_kernels.cuh"

namespace dsv4::cuda::detail {

constexpr int kMmaGemvMaxRows = 32;  // 8-row activation blocks share each weight fragment
// FP8 weight, in % 128 == 0, 16-row tiles inside 128-row scale blocks and inside groups.
bool fp8_mma_gemv_ok(const DevWeight& w, int64_t row_begin, int64_t n, int64_t grp_rows);
// Output rows [row_begin, row_begin + n) of w; xq [rows, ldq] codes, xs [ldq / 128][ldxs] scales.
// Grouped (block-diagonal) form: output tile t reads x columns from (t / grp_rows) * grp_x on
// (grp_rows = n, grp_x = 0: a plain linear).
void fp8_mma_gemv(const DevWeight& w, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs, int rows, float* y,
                  int64_t row_begin, int64_t n, int64_t ldy, int64_t grp_rows, int64_t grp_x, cudaStream_t s);

// One output of fp8_mma_gemv's contract.
struct GemvOut {
  DevWeight w;
  float* y;
  int64_t row_begin, n, ldy, grp_rows, grp_x;
};
// Two outputs on the same codes in one launch where both take the same kernel shape (else two
// launches). Each output's bits are those of its own fp8_mma_gemv unless the pair's grid alone
// passes one wave of resident CTAs and is widened for it (the shared expert's gate / up at one
// row: one launch of 2-tile CTAs where each alone takes 1-tile CTAs; deterministic either way,
// DSV4_GEMV_PAIR=0 gives the solo sums). At one row each launch pays a
// fixed ~6 us (ramp, one round of loads, the slices' sum), so wq_a and wkv, launched one after
// the other, paid it twice on the step's critical path.
void fp8_mma_gemv_pair(const GemvOut& a, const GemvOut& b, const uint8_t* xq, int64_t ldq, const float* xs, int64_t ldxs,
                       int rows, cudaStream_t s);

}  // namespace dsv4::cuda::detail
