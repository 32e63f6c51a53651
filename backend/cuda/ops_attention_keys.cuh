// What the sparse-attention kernels share (ops_attention.cu: fp32, the Exact twin;
// ops_attention_mma.cu: bf16 tensor cores, Fast): a row's key list. Only .cu files include this.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda::detail {

// Key j of a row's list: window positions first, then compressed entries; nullptr = masked. D:
// float slots per stored key (the head dim, or half of it for bf16 keys).
__device__ __forceinline__ const float* key_ptr(const AttnRow& row, int64_t j, int64_t lo, int64_t nwin, int64_t W,
                                                int64_t D) {
  if (j < nwin) {
    const int64_t t = lo + j;
    return t >= row.chunk_p0 ? row.chunk_kv + (t - row.chunk_p0) * D : row.ring + (t % W) * D;
  }
  const int64_t i = j - nwin;
  if (row.sel) {
    const int32_t e = row.sel[i];
    return e >= 0 ? row.entries + int64_t(e) * D : nullptr;
  }
  return row.entries + i * D;
}

// The part of a row's key list that split `split` of `nsplit` takes, in whole tiles of `tile`
// keys: [kb, ke) (empty past the end), and the window's first position lo and length nwin.
struct SplitKeys {
  int64_t lo, nwin, kb, ke;
};
__device__ __forceinline__ SplitKeys split_keys(const AttnRow& row, int64_t W, int nsplit, int split, int64_t tile) {
  SplitKeys k;
  k.lo = row.pos - W + 1 > 0 ? row.pos - W + 1 : 0;
  k.nwin = row.pos - k.lo + 1;
  const int64_t nkeys = k.nwin + (row.sel ? row.n_sel : row.n_entries);
  if (nsplit == 1) {  // the whole list (the general form below divides by nsplit in 64 bits)
    k.kb = 0;
    k.ke = nkeys;
    return k;
  }
  const int64_t chunk = (((nkeys + nsplit - 1) / nsplit + tile - 1) / tile) * tile;
  k.kb = split * chunk < nkeys ? split * chunk : nkeys;
  k.ke = k.kb + chunk < nkeys ? k.kb + chunk : nkeys;
  return k;
}
// A split without keys: weight 0 for its `heads` heads from h0 (the merge skips their
// accumulators). Threads < heads write.
__device__ __forceinline__ void mark_empty_split(float2* ml, int64_t r, int64_t H, int64_t h0, int nsplit, int split,
                                                 int heads) {
  if (static_cast<int>(threadIdx.x) < heads)
    ml[((r * H + h0) + threadIdx.x) * nsplit + split] = make_float2(-INFINITY, 0.f);
}

// Tensor-core attention (Fast precision) for H % 64 == 0 and D == 512: o, or with partial the
// flash-decoding triples of the key-list splits (the fp32 kernel's format, merged by the same
// kernel). grid (H / 64, R, nsplit).
constexpr int kAttnMmaHeads = 64;
constexpr int kAttnMmaDim = 512;
inline bool attention_mma_ok(int64_t H, int64_t D) { return H % kAttnMmaHeads == 0 && D == kAttnMmaDim; }
// Launches a tensor-core attention kernel (the signature below) over row ranges of <= 65535 rows:
// grid (H / 64, rows, nsplit); q_row: float slots per q row (D, or D / 2 for bf16 q). extra: more
// kernel arguments, each made by extra(r0) for the range that starts at row r0.
template <typename Kernel, typename... Extra>
void launch_attention_rows(Kernel kernel, int threads, size_t smem, const float* q, int64_t q_row, const AttnRow* rows,
                           int64_t R, int64_t H, int64_t W, const float* sink, float scale, int nsplit, float* o,
                           float* partial, float2* ml, cudaStream_t s, const Extra&... extra) {
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  for_row_ranges(R, [&](int64_t r0, int64_t n) {
    const dim3 grid(static_cast<unsigned>(H / kAttnMmaHeads), static_cast<unsigned>(n), static_cast<unsigned>(nsplit));
    const int64_t slots = r0 * H * nsplit;  // partial / ml slots of the rows before r0
    kernel<<<grid, threads, smem, s>>>(q + r0 * H * q_row, rows + r0, H, W, sink, scale, nsplit,
                                       o + r0 * H * kAttnMmaDim, partial ? partial + slots * kAttnMmaDim : nullptr,
                                       ml ? ml + slots : nullptr, extra(r0)...);
    DSV4_CUDA_LAUNCH_CHECK();
  });
}

// bf16_keys: the rows' keys are stored as bf16 (cuda::KeyFormat::BF16), D / 2 float slots each;
// bf16_q (with bf16_keys): q too.
void attention_mma(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t W, const float* sink, float scale,
                   int nsplit, float* o, float* partial, float2* ml, cudaStream_t s, bool bf16_keys = false,
                   bool bf16_q = false);
// The same for bf16 keys on warpgroup MMA (ops_attention_wgmma.cu): sm_90 device, arch-90a
// build, not switched off by set_attention_wgmma(false).
bool attention_wgmma_ok(int64_t H, int64_t D);
// f8 (nsplit == 1 and attention_fp8_out_ok only): the FP8 activations of wo_a instead of o
// (cuda::AttnFp8Out); DSV4_ATTN_FP8_OUT=0 at start-up turns that form off.
bool attention_fp8_out_ok(int64_t H, const InverseRope& rope);
// qn: bf16 q not yet normalised, each head's norm and RoPE in the kernel (attention_norms_q only).
bool attention_norms_q(int64_t H, int64_t D, int64_t pairs);
void attention_wgmma(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t W, const float* sink,
                     float scale, int nsplit, float* o, float* partial, float2* ml, cudaStream_t s, bool bf16_q,
                     const AttnFp8Out* f8 = nullptr, const AttnQNorm* qn = nullptr);

}  // namespace dsv4::cuda::detail
