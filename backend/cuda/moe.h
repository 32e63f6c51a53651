// Routed experts on the GPU: tokens grouped by expert on the device (histogram, prefix sum,
// permutation), grouped SwiGLU-expert GEMMs reading each expert's stored weights (FP4 packed
// stays FP4 in memory), weighted scatter-add into the output. Twin: model/moe.cpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/linear.h"
#include "backend/cuda/ops.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

struct ExpertSet {
  // Per routed expert: gate w1 [I, d], down w2 [d, I], up w3 [I, d] (device views).
  std::vector<WeightView> w1, w2, w3;
  int64_t d = 0, I = 0;
};

// Kernel variant of the tensor-core expert path, for benchmarks and tests: row_blocks 16-row
// blocks per CTA (0 = the default, 2; 1 / 2 / 4; one that does not divide the rows falls back to
// 1) and ctas_per_sm 2 (two K-blocks of loads in flight per warp) or 3 (default: one, more
// warps). Every variant computes the same bits.
void set_moe_mma_variant(int row_blocks, int ctas_per_sm);
// Tile width of the tensor-core path on packed experts: 0 = by size (wide tiles from an average
// of kMoeWgmmaMinTokens (wgmma) / kMoeWideMinTokens tokens per expert, 8-token tiles below), -1 =
// always 8, 1 = always 64 on mma.sync (moe_mma_wide.cu: the 8-token kernels' bits), 2 / 3 =
// always 64 / 128 on bf16 wgmma (moe_wgmma.cu, an error where unavailable), 4 = always 128 on FP8
// wgmma (moe_wgmma_fp8_wide.cu), 5-8 and 13-14 = the same bits from the warp-specialised kernels
// (moe_wgmma_fp8_ws.cu: 5 / 6 one producer warpgroup, 7 / 8 two; 6 / 8 with the generic-to-async
// proxy fence in the consumers; 22 = 6 persistent: a CTA an SM walks the (tile, slice) items;
// modes 9-21, clusters sharing the codes by TMA and step 26's forms, were removed after measuring
// slower, bench/NOTES.md steps 25-26). By size: mode 22's kernels (DSV4_MOE_PREFILL_WS=18, the
// default; 0 = mode 4's, 1-4 = modes 5-8's).
// By size, wide tiles run on wgmma where the device (sm_90) and
// build (arch 90a) have it: 64 tokens on bf16 (same products, fp32 sums in another order), from an
// average of kMoeWgmma128MinTokens 128 tokens on FP8 (the group scales folded into the e4m3
// weights, h re-quantised to FP8 as the official W4A8; DSV4_MOE_PREFILL_FP8=0: bf16).
void set_moe_wide_tiles(int mode);
// CTAs of the persistent FP8 prefill form (mode 22): 0 = one per SM; tests set a few so that each
// CTA walks many items.
void set_moe_persistent_ctas(int ctas);
// The persistent form's merged tiles (an expert's last two 128-token tiles as one item of up to
// 192 tokens, its weights folded once): on by default (DSV4_MOE_MERGE=0 off); same bits either way.
void set_moe_merge_tiles(bool on);
bool moe_wgmma_available();
// The 8-token tiles on packed experts: 0 = the FP8 wgmma kernels (moe_wgmma_decode.cu) where the
// device (sm_90) and build (arch 90a) have them, else mma.sync; -1 = always mma.sync (moe_mma.cu,
// the bits of the stored layout and the 64-token mma.sync tiles); 1 = always wgmma (an error
// where unavailable). DSV4_MOE_DECODE_WGMMA=0 starts at -1.
void set_moe_decode_wgmma(int mode);
// Tokens per tile of those FP8 wgmma kernels: 0 = by size (16 from an average of
// kMoeDecode16MinTokens tokens per expert, else 8), 8 or 16. DSV4_MOE_DECODE_TILE sets the start.
void set_moe_decode_tile(int tokens);
// From bench_linear moe (K = 6 of 256 experts, packed; 2026-12-04): 128-token wgmma tiles at 96
// tokens per expert (4096: 5.61 vs 6.76 ms) but not at 48 (2048: 4.05 vs 3.50); mma.sync 64-token
// tiles only from ~64 (2048: 6.83 vs 9.74 ms; 1024: 5.50 vs 5.24). Since the FP8 wgmma decode
// kernels take 16-token tiles (2026-12-06, H100): those beat the 64-token wgmma tiles up to at
// least 24 tokens per expert (512 / 768 / 1024 tokens: 1.52 / 2.02 / 2.42 vs 2.39 / 2.48 / 2.60
// ms), and 8-token tiles from 6 (256 tokens: 1.31 vs 1.37 ms; at 64, 1.5: 0.99 vs 0.98).
constexpr int kMoeWideMinTokens = 64;
constexpr int kMoeDecode16MinTokens = 4;
constexpr int kMoeWgmmaMinTokens = 32;
constexpr int kMoeWgmma128MinTokens = 64;

// The router's selection made by MoeRunner::run itself, inside its grouping launch (one dependent
// launch less per decode layer): cuda::moe_route's arguments; run() writes experts / weights
// [R, K] as moe_route does.
struct MoeRoute {
  const float* logits = nullptr;   // [R, E]
  const float* bias = nullptr;     // [E] (score layers)
  const int32_t* tid2eid = nullptr;  // [vocab, K] (hash layers)
  const int32_t* tokens = nullptr;   // [R] (hash layers)
  float routed_scale = 1.f;
  int32_t* experts = nullptr;
  float* weights = nullptr;
};

class MoeRunner {
 public:
  MoeRunner();
  ~MoeRunner();
  // out [R, d] += Σ_k weights[r,k] · expert_{experts[r,k]}(x[r]) with clamped SwiGLU (limit <= 0: none);
  // accumulate = false: out = the sum (out need not be initialised).
  // experts/weights [R, K] are device arrays (from moe_route).
  // defer (with accumulate = false): where the call runs as one pass, the weighted sum is left
  // to the caller — *defer gets the pairs' rows (valid until the next run) and out is not
  // written (cuda::hc_post makes the sum); else defer->Y is nullptr and out holds the sum.
  void run(const ExpertSet& set, const float* x, int64_t R, const int32_t* experts, const float* weights, int64_t K,
           float limit, float* out, Precision p, cudaStream_t s, bool accumulate = true, RoutedRows* defer = nullptr);
  // run() after the routing: route's experts / weights are written here first (in the grouping's
  // launch up to one row per 32 experts, else by cuda::moe_route), the same values.
  void run_routed(const ExpertSet& set, const float* x, int64_t R, const MoeRoute& route, int64_t K, float limit,
                  float* out, Precision p, cudaStream_t s, bool accumulate = true, RoutedRows* defer = nullptr);
  // Re-lays FP4 experts in place for the tensor-core path (16-byte loads per mma thread; see
  // moe_tiles.cuh). After it the set runs only in Fast precision (run() with Exact is an
  // error) and every batch size takes the tensor-core kernels. False (nothing changed) when the
  // experts are not FP4 or not aligned for that path. Call once per upload, on weights nothing
  // else reads.
  bool pack_for_tensor_cores(const ExpertSet& set, cudaStream_t s);
  // Tests: fill the intermediate buffers (H, Y) with NaN bytes before every run, so that an
  // element a kernel fails to write cannot pass for one written by an earlier run.
  void set_poison_scratch(bool on);

 private:
  void run_impl(const ExpertSet& set, const float* x, int64_t R, const int32_t* experts, const float* weights,
                const MoeRoute* route, int64_t K, float limit, float* out, Precision p, cudaStream_t s, bool accumulate,
                RoutedRows* defer);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::cuda
