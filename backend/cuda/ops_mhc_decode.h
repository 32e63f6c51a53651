// The one-launch decode form of cuda::hc_pre (ops_mhc_decode.cu), used by hc_pre itself.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace dsv4::cuda::detail {

// Projection slices the fused form uses for R rows; 0 when it does not apply (R > 4, n > 4,
// d % 4 != 0, or a grid that might not be resident at once).
int hc_pre_decode_slices(int64_t R, int64_t n, int64_t d);
// On by default; benchmarks turn it off to time the three-launch form.
void set_hc_pre_decode_enabled(bool on);
// Tuning: with a device buffer of [R x (slices + 1)] x 8 int64, each block's thread 0 stores
// clock64() at the phase ends (ops_mhc_decode.cu); nullptr turns it off.
void set_hc_pre_decode_trace(long long* buf);
// hc_pre (+ the RMS norm with norm_w when given) in one launch; false (nothing enqueued) when
// the shape or alignment does not fit. stash: [R, d] floats; on return it holds the projection
// partials of hc_pre_decode_slices(R, n, d) slices per row. gates = false: pre / post / comb are
// not written (the caller runs the gates from the stash).
bool hc_pre_decode(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
                   float rms_eps, const float* norm_w, float norm_eps, float* pre, float* post, float* comb, float* u,
                   float* stash, bool gates, cudaStream_t s);

// hc_post that also writes the next hc_pre's projection partials into the stash; false
// (nothing enqueued) when the shape or alignment does not fit or it is switched off. Up to 4
// rows (ops_mhc_post_project.cu): the partials and the streams' Gram matrix a column block
// (n <= 4, d <= 8192), read by hc_pre_from_post. More rows (ops_mhc_post_project_tiled.cu,
// n = 4, d % 32 == 0): the tiled projection's layout in hc_post_project_tiled_slices(R, n, d)
// slices, read by hc_pre's finish kernel.
bool hc_post_project_applies(int64_t R, int64_t n, int64_t d);
bool hc_post_project(const float* post, const float* comb, const float* F, const float* F2, const RoutedRows* routed,
                     float* X, int64_t R, int64_t n, int64_t d, const HcParams& next, float* stash, cudaStream_t s);
int hc_post_project_tiled_slices(int64_t R, int64_t n, int64_t d);  // 0: no tiled form
// store / X16: the streams' StreamStore (ops.h); the projection is of the streams as stored.
void hc_post_project_tiled(const float* post, const float* comb, const float* F, const float* F2,
                           const RoutedRows* routed, float* X, int64_t R, int64_t n, int64_t d, const float* fn,
                           float* stash, cudaStream_t s, StreamStore store = StreamStore::F32,
                           uint16_t* X16 = nullptr);
// The hc_pre after the decode form (R <= 4): gates (when `gates`) and u's columns (when `mix`) from those partials.
void hc_pre_from_post(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
                      float rms_eps, const float* norm_w, float norm_eps, float* pre, float* post, float* comb,
                      float* u, const float* stash, bool gates, bool mix, cudaStream_t s);
// On by default; DSV4_HC_PROJECT_IN_POST=0 at start-up turns it off.
void set_hc_project_in_post(bool on);

}  // namespace dsv4::cuda::detail
