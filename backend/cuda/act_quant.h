// FP8 activation quantisation of the official demo (spec/model.md §4): per row, per block of
// 128 input channels, amax = max(|x|, 1e-4), s = 2^ceil(log2(amax/448)), q = e4m3(clamp(x/s, ±448)).
// ceil(log2) is taken exactly from the fp32 bits of amax/448.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/inverse_rope.h"

namespace dsv4::cuda {

// q [rows_pad, ldq] e4m3 codes, scales [ceil(in/128), rows_pad] fp32 (row index fastest, the
// cuBLASLt VEC128 layout). Rows in [rows, rows_pad) are written as zeros with scale 1.
// mma_packed (in % 128 == 0): inside each 128-block, bytes [8t, 8t + 8) of 32-group j go to
// [32t + 8j, 32t + 8j + 8) — the operand order of the packed MoE kernels (moe_tiles.cuh).
void act_quant_fp8(const float* x, int64_t rows, int64_t in, int64_t ldx, int64_t rows_pad, uint8_t* q, int64_t ldq,
                   float* scales, cudaStream_t s, bool mma_packed = false);

// rms_norm(x, gamma, eps) of rows of n contiguous channels, in place, then act_quant_fp8 of the
// result (rows_pad = rows, stored order), in one launch: x, the codes and the scales bit for bit
// as the two launches give. false (nothing enqueued) unless n % 128 == 0, ldq % 4 == 0 and
// x, gamma, q are 16-byte aligned.
bool act_quant_fp8_rms_norm(float* x, const float* gamma, float eps, int64_t rows, int64_t n, uint8_t* q, int64_t ldq,
                            float* scales, cudaStream_t s);

// act_quant_fp8 (rows_pad = rows) in the B-operand order of the FP8 wgmma expert kernels
// (moe_wgmma_fp8.cu): value 32j + 8q + 2i + h of a block at 32j + 16h + 4q + i, so that each
// 16-byte chunk is one row of a K-major core matrix. in % 128 == 0.
void act_quant_fp8_wgmma_b(const float* x, int64_t rows, int64_t in, int64_t ldx, uint8_t* q, int64_t ldq,
                           float* scales, cudaStream_t s);

// act_quant_fp8 (rows_pad = rows, stored order) of x after the inverse RoPE, which is also stored
// back into x: x ends as rope(..., inverse = true) leaves it, the codes and scales as
// act_quant_fp8 of that, bit for bit. One launch where the output projection's input took two.
// in % rope.head_len == 0; head_len even; 2 * pairs <= head_len.
void act_quant_fp8_inverse_rope(float* x, int64_t rows, int64_t in, int64_t ldx, const InverseRope& rope, uint8_t* q,
                                int64_t ldq, float* scales, cudaStream_t s);

// y [rows, ldy] = dequant(quant(x)) as bf16 (exact: an e4m3 value times a power of two), each
// 128-block in the operand order of the wgmma expert kernels (moe_wgmma.cu): value 32j + 8q + u
// goes to position 32j + 16 (u / 4) + 8 (u / 2 % 2) + 2q + u % 2. in % 128 == 0.
void act_quant_bf16_wgmma(const float* x, int64_t rows, int64_t in, int64_t ldx, __nv_bfloat16* y, int64_t ldy,
                          cudaStream_t s);

// y = dequant(quant(x)) in fp32 (the values an FP8 GEMM sees); y == x allowed.
void act_fake_quant_fp8(const float* x, int64_t rows, int64_t in, int64_t ldx, float* y, int64_t ldy, cudaStream_t s);

}  // namespace dsv4::cuda
