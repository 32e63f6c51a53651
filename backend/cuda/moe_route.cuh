// MoE routing (twin: route() in model/moe.cpp) as a device function of one warp per row: lane l
// holds experts l, l + 32, ... (scores sqrt(softplus(l)) and the biased selection scores) in
// registers. K rounds of warp argmax with ties to the lower index reproduce topk_indices' order
// exactly; a picked expert's selection score becomes -inf in its lane. Hash layers take
// tid2eid's row instead. (The former version staged the scores in shared memory with one logit
// load in flight per lane at a time: ~11 us per decode layer, most of it eight serial loads.)
// Only .cu files include this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda::detail {

constexpr int kRouteMaxK = 16;
constexpr int kRoutePerLane = 16;  // experts per lane: E <= 512

__device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Row r's routing by one whole warp (moe_route_kernel, and the MoE grouping's fused form in moe.cu).
__device__ __forceinline__ void route_row(const float* logits, const float* bias, const int32_t* tid2eid,
                                         const int32_t* tokens, int64_t r, int64_t E, int64_t K, float routed_scale,
                                         int32_t* experts, float* weights) {
  const int lane = threadIdx.x & 31;
  float score[kRoutePerLane], biased[kRoutePerLane];
#pragma unroll
  for (int j = 0; j < kRoutePerLane; ++j) {  // all loads first: they are in flight together
    const int64_t e = lane + 32 * j;
    score[j] = e < E ? logits[r * E + e] : 0.f;
    biased[j] = e < E && !tid2eid ? bias[e] : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kRoutePerLane; ++j) {
    score[j] = sqrtf(softplus_dev(score[j]));
    biased[j] = lane + 32 * j < E ? (tid2eid ? 0.f : score[j] + biased[j]) : -INFINITY;
  }
  // Unrolled over kRouteMaxK so that pick[] stays in registers (a runtime index put it in local
  // memory: ~15 us per decode layer for K = 6).
  int32_t pick[kRouteMaxK];
  float picked[kRouteMaxK];
#pragma unroll
  for (int k = 0; k < kRouteMaxK; ++k) {
    if (k >= K) break;
    int bi;
    if (tid2eid) {
      bi = tid2eid[int64_t(tokens[r]) * K + k];
    } else {
      float bv = -INFINITY;
      bi = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < kRoutePerLane; ++j)  // ascending e: strict > keeps the lowest index of a tie
        if (biased[j] > bv) {
          bv = biased[j];
          bi = lane + 32 * j;
        }
      warp_argmax(bv, bi);
    }
    pick[k] = bi;  // identical in every lane
    float own = 0.f;
#pragma unroll
    for (int j = 0; j < kRoutePerLane; ++j)
      if (lane + 32 * j == bi) {
        own = score[j];
        biased[j] = -INFINITY;  // taken
      }
    picked[k] = __shfl_sync(kFull, own, bi & 31);
  }
  if (lane == 0) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kRouteMaxK; ++k)
      if (k < K) sum += picked[k];
#pragma unroll
    for (int k = 0; k < kRouteMaxK; ++k)
      if (k < K) {
        experts[r * K + k] = pick[k];
        weights[r * K + k] = picked[k] / sum * routed_scale;
      }
  }
}

}  // namespace dsv4::cuda::detail
