// The indexer's top-k selection over a score buffer (ops_indexer_select.cu), shared by the
// Exact (fp32 SIMT) and Fast (bf16 tensor-core) scoring kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace dsv4::cuda::detail {

constexpr int kMaxIndexerTopk = 2048;
// Rows of at least this many entries (max_visible) take the multi-block path.
constexpr int64_t kLargeRow = 32768;
// Its histogram: counts of a row's scores by the top 12 bits of their float_key.
constexpr int kSelectBins = 4096;
constexpr int kSelectBinShift = 20;
// out[r, :] = top min(topk, n_visible) indices of scores[r * ld, ...) (descending, ties to the
// lower index), the rest -1. Stream-ordered scratch only: CUDA-graph capturable.
// hist: [R, kSelectBins] histogram of the scores already built by the scorer (the Fast scorer
// fills it in its epilogue, sparing a pass over the scores); nullptr: built here. counts (with
// hist): [2R] zeroed words (per row: candidate count, finished compaction blocks), cleared by the
// same memset as hist (in a graph each memset node costs ~3 us). Used only by the multi-block path
// (max_visible >= kLargeRow).
void indexer_select(const float* scores, int64_t ld, const IndexerRow* rows, int64_t R, int64_t topk,
                    int64_t max_visible, int32_t* out, cudaStream_t s, const uint32_t* hist = nullptr,
                    uint32_t* counts = nullptr);

// Rows of at most kWarpSelectMaxRow entries at top-k of at most kWarpSelectMaxTopk can take one
// warp a row (ops_indexer_select_warp.cu): the fastest form over many rows, but ~45 us of latency
// for a 2048-entry row, so few long rows take the block forms (indexer_select's rule).
constexpr int64_t kWarpSelectMaxRow = 2048;
constexpr int64_t kWarpSelectMaxTopk = 512;
void indexer_select_warp(const float* scores, int64_t ld, const IndexerRow* rows, int64_t R, int64_t topk,
                         int64_t max_visible, int32_t* out, cudaStream_t s);
// The short-row select's form: by size (kAuto), or one forced where it applies (tests, A/B):
// a warp a row, 256-thread blocks, 1024-thread blocks. DSV4_INDEXER_SELECT=warp|256|1024 forces
// one from the start.
enum class SelectForm { kAuto, kWarp, kBlocks256, kBlocks1024 };
void set_indexer_select_form(SelectForm form);

}  // namespace dsv4::cuda::detail
