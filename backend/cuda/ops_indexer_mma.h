// The indexer's Fast-precision scoring on bf16 tensor cores (ops_indexer_mma.cu); the selection
// is shared with the Exact path (ops_indexer.cu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace dsv4::cuda::detail {

constexpr int kIndexerMmaMaxHeads = 64;
constexpr int kIndexerMmaMaxDim = 128;
// Heads a multiple of 8 up to 64, head dim a multiple of 32 up to 128 (V4: 64 x 128).
bool indexer_mma_ok(int64_t nh, int64_t hd);
// scores[r * ld + s] for s < rows[r].n_visible (<= max_visible); other slots untouched.
// hist (optional, [R, kSelectBins], zeroed by the caller): += the scores' histogram for
// indexer_select.
void indexer_score_mma(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                       int64_t max_visible, float* scores, int64_t ld, cudaStream_t s,
                       KeyFormat keys = KeyFormat::F32, uint32_t* hist = nullptr);

// The wgmma scorer (ops_indexer_wgmma.cu): V4's 64 heads x 128 dims on an sm_90 device with an
// arch-90a build; indexer_score_mma takes it there. set_indexer_wgmma(false) (or
// DSV4_INDEXER_WGMMA=0) keeps the mma.sync scorer, for tests and A/B runs.
bool indexer_wgmma_ok(int64_t nh, int64_t hd);
void set_indexer_wgmma(bool on);
void indexer_score_wgmma(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t max_visible,
                         float* scores, int64_t ld, cudaStream_t s, KeyFormat keys, uint32_t* hist);

}  // namespace dsv4::cuda::detail
