// MoE routing (twin: route() in model/moe.cpp): one warp per row; lane l holds experts l, l + 32,
// ... (scores sqrt(softplus(l)) and the biased selection scores) in registers. K rounds of warp
// argmax with ties to the lower index reproduce topk_indices' order exactly; a picked expert's
// selection score becomes -inf in its lane. Hash layers take tid2eid's row instead. (The former
// version staged the scores in shared memory with one logit load in flight per lane at a time:
// ~11 us per decode layer, most of it eight serial loads.)
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxK = 16;
constexpr int kPerLane = 16;  // experts per lane: E <= 512

__device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void moe_route_kernel(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens,
                                 int64_t R, int64_t E, int64_t K, float routed_scale, int32_t* experts,
                                 float* weights) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= R) return;  // whole warps only
  float score[kPerLane], biased[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {  // all loads first: they are in flight together
    const int64_t e = lane + 32 * j;
    score[j] = e < E ? logits[r * E + e] : 0.f;
    biased[j] = e < E && !tid2eid ? bias[e] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    score[j] = sqrtf(softplus_dev(score[j]));
    biased[j] = lane + 32 * j < E ? (tid2eid ? 0.f : score[j] + biased[j]) : -INFINITY;
  }
  // Unrolled over kMaxK so that pick[] stays in registers (a runtime index put it in local
  // memory: ~15 us per decode layer for K = 6).
  int32_t pick[kMaxK];
  float picked[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    if (k >= K) break;
    int bi;
    if (tid2eid) {
      bi = tid2eid[int64_t(tokens[r]) * K + k];
    } else {
      float bv = -INFINITY;
      bi = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)  // ascending e: strict > keeps the lowest index of a tie
        if (biased[j] > bv) {
          bv = biased[j];
          bi = lane + 32 * j;
        }
      detail::warp_argmax(bv, bi);
    }
    pick[k] = bi;  // identical in every lane
    float own = 0.f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (lane + 32 * j == bi) {
        own = score[j];
        biased[j] = -INFINITY;  // taken
      }
    picked[k] = __shfl_sync(detail::kFull, own, bi & 31);
  }
  if (lane == 0) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k)
      if (k < K) sum += picked[k];
#pragma unroll
    for (int k = 0; k < kMaxK; ++k)
      if (k < K) {
        experts[r * K + k] = pick[k];
        weights[r * K + k] = picked[k] / sum * routed_scale;
      }
  }
}

}  // namespace

void moe_route(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens, int64_t R,
               int64_t E, int64_t K, float routed_scale, int32_t* experts, float* weights, cudaStream_t s) {
  DSV4_CHECK(K >= 1 && K <= kMaxK && K <= E, "cuda::moe_route: need 1 <= K <= min(E, ", kMaxK, ")");
  DSV4_CHECK(tid2eid ? tokens != nullptr : bias != nullptr, "cuda::moe_route: hash needs tokens, else a bias");
  DSV4_CHECK(E <= 32 * kPerLane, "cuda::moe_route: at most ", 32 * kPerLane, " routed experts");
  if (R == 0) return;
  moe_route_kernel<<<detail::ceil_div(R, kWarps), kWarps * 32, 0, s>>>(logits, bias, tid2eid, tokens, R, E, K,
                                                                          routed_scale, experts, weights);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
