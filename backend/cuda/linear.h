// CUDA linears over stored weights (dense BF16/F32, FP8 128×128 block, FP4 per-32 group).
// Two precisions:
//  * exact: fp32 math on weights dequantised in registers (twin of backend/cpu/linear.cpp,
//    matches it to fp32 rounding) — the path checked against the oracle goldens;
//  * fast: FP8 block-scaled tensor-core GEMM through cuBLASLt for FP8 weights (activations
//    quantised per 1×128 block with power-of-two scales, as the official demo), bf16 tensor
//    cores for BF16 weights, FP4 read from memory and upcast on chip — compared statistically.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "backend/cuda/inverse_rope.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

enum class Precision { Exact, Fast };

// y[r, o - row_begin] = Σ_k W[o, k] x[r, k] for o in [row_begin, row_end); ldx/ldy row strides.
void linear_exact(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
                  int64_t ldx, int64_t ldy, cudaStream_t s);

// Block-diagonal linear (the grouped low-rank output): group g multiplies weight rows
// [g·n_g, (g+1)·n_g) (n_g = w.out / groups) with x columns [g·w.in, (g+1)·w.in) of each row and
// writes y columns [g·n_g, (g+1)·n_g). One launch for all groups at decode sizes.
void linear_exact_grouped(const WeightView& w, int64_t groups, const float* x, int64_t rows, float* y, int64_t ldx,
                          int64_t ldy, cudaStream_t s);

// Holds the cuBLASLt handle, workspace and scratch (quantised activations, scales); one per stream.
class FastLinear {
 public:
  FastLinear();
  ~FastLinear();
  FastLinear(const FastLinear&) = delete;
  FastLinear& operator=(const FastLinear&) = delete;
  void run(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
           int64_t ldx, int64_t ldy, cudaStream_t s);
  // y_i[r, :] = W_i x[r, :] for several weights on the same x (all rows of each W_i): the same
  // numbers as one run() per weight, but x is quantised (or rounded to bf16) once for all of them:
  // at decode sizes with FP8 weights on the tensor-core GEMV (wq_a / wkv, the shared expert's
  // gate / up), and past them where every weight takes run()'s cuBLASLt path of one kind (FP8
  // block: those again; dense bf16: the compressors' wkv / wgate).
  struct Output {
    const WeightView* w;
    float* y;
    int64_t ldy;
  };
  void run_shared_input(std::initializer_list<Output> outs, const float* x, int64_t rows, int64_t ldx, cudaStream_t s);
  // rms_norm(x, gamma, eps) in place (rows of w.in contiguous channels), quantised for w's
  // tensor-core GEMV in the same launch; then run_quantised(w, ...) is run(w, x, ...) on the
  // normed rows, bit for bit. false (nothing enqueued) where that GEMV does not take w at these
  // rows: the caller norms and runs as usual. DSV4_NORM_QUANT=0 always answers false (A/B).
  bool quantise_rms_norm(const WeightView& w, float* x, const float* gamma, float eps, int64_t rows, cudaStream_t s);
  void run_quantised(const WeightView& w, int64_t rows, float* y, int64_t ldy, cudaStream_t s);
  // linear_exact_grouped's contract with this class's numerics (FP8 weights on big batches: one
  // quantisation of all groups, then one grouped GEMM, or one GEMM per group).
  void run_grouped(const WeightView& w, int64_t groups, const float* x, int64_t rows, float* y, int64_t ldx,
                   int64_t ldy, cudaStream_t s);
  // run_grouped on x after the inverse RoPE (the attention output into wo_a), which is done in
  // place: x ends as rope(..., inverse = true) leaves it, on every path. With FP8 weights at
  // decode sizes the rotation is part of the activation quantisation (one launch for both);
  // otherwise rope() runs first, then run_grouped. x is rows of heads: ldx == in-width of all
  // groups, a multiple of rope.head_len.
  void run_grouped_inverse_rope(const WeightView& w, int64_t groups, float* x, int64_t rows, float* y, int64_t ldx,
                                int64_t ldy, const InverseRope& rope, cudaStream_t s);
  // run(w, x, rows, ...) with the output as bf16 (y16 [rows, w.out], bf16 bits): cuBLASLt's FP8
  // GEMM writes its fp32 sums rounded to bf16, half the bytes of y. false (nothing enqueued, or
  // only the activation quantisation) where w is not an FP8 weight on cuBLASLt at these rows.
  bool run_bf16_out(const WeightView& w, const float* x, int64_t rows, uint16_t* y16, cudaStream_t s);
  // Where run_grouped_inverse_rope(w, groups, x, rows, ...) would quantise x for the grouped FP8
  // GEMM (FP8 weights past the GEMV sizes): true, with the buffers that quantisation writes —
  // codes [rows, groups w.in], scales [groups w.in / 128][rows], act_quant_fp8_inverse_rope's
  // layout — for the caller to fill (the attention kernel's FP8 epilogue, cuda::AttnFp8Out);
  // then run_grouped_quantised(w, groups, rows, ...) is the rest of run_grouped_inverse_rope.
  bool grouped_input_fp8(const WeightView& w, int64_t groups, int64_t rows, uint8_t** q, float** scales);
  void run_grouped_quantised(const WeightView& w, int64_t groups, int64_t rows, float* y, int64_t ldy, cudaStream_t s);
  // Rows up to this run as GEMV on quantised activations; more go to cuBLASLt (FP8 / bf16).
  // Default kDefaultGemvMaxRows, or DSV4_FAST_GEMV_MAX_ROWS (benchmarks compare both).
  static constexpr int kDefaultGemvMaxRows = 2;
  int gemv_max_rows() const { return gemv_max_rows_; }
  void set_gemv_max_rows(int r);
  // FP8 weights at <= 32 rows: tensor-core GEMV (on by default; DSV4_FP8_MMA_GEMV=0 turns it off).
  // Past 8 rows only for grouped weights and plain ones of at most wide_mma_max_bytes (larger
  // ones stream faster through cuBLASLt there; tests and benchmarks raise the bound).
  bool mma_gemv() const { return mma_gemv_; }
  void set_mma_gemv(bool on) { mma_gemv_ = on; }
  static constexpr int64_t kDefaultWideMmaMaxBytes = 16ll << 20;
  void set_wide_mma_max_bytes(int64_t b);
  // FP8 weights past the GEMV sizes: 0 = grouped ones on the wgmma grouped GEMM
  // (gemm_fp8_grouped.h, sm_90a) up to 512 rows, plain ones on cuBLASLt; 1 = the wgmma GEMM for
  // plain ones too (whole weights, any rows); -1 = cuBLASLt for both (one GEMM per group).
  // DSV4_FP8_GEMM sets the start.
  void set_fp8_gemm(int mode);
  // Per-weight data (expanded FP8 scales) is cached by device address: call this when weights
  // are freed or replaced, so a new weight at a reused address is not served stale scales.
  void forget_weights();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int gemv_max_rows_ = kDefaultGemvMaxRows;
  bool mma_gemv_ = true;
  int fp8_gemm_ = 0;
};

}  // namespace dsv4::cuda
