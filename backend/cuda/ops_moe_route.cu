// MoE routing (twin: route() in model/moe.cpp): one warp per row (moe_route.cuh).
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

namespace {

using detail::kRouteMaxK;
using detail::kRoutePerLane;

constexpr int kWarps = 4;

__global__ void moe_route_kernel(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens,
                                 int64_t R, int64_t E, int64_t K, float routed_scale, int32_t* experts,
                                 float* weights) {
  const int64_t r = blockIdx.x * int64_t(kWarps) + (threadIdx.x >> 5);
  if (r >= R) return;  // whole warps only
  detail::route_row(logits, bias, tid2eid, tokens, r, E, K, routed_scale, experts, weights);
}

}  // namespace

void moe_route(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens, int64_t R,
               int64_t E, int64_t K, float routed_scale, int32_t* experts, float* weights, cudaStream_t s) {
  DSV4_CHECK(K >= 1 && K <= kRouteMaxK && K <= E, "cuda::moe_route: need 1 <= K <= min(E, ", kRouteMaxK, ")");
  DSV4_CHECK(tid2eid ? tokens != nullptr : bias != nullptr, "cuda::moe_route: hash needs tokens, else a bias");
  DSV4_CHECK(E <= 32 * kRoutePerLane, "cuda::moe_route: at most ", 32 * kRoutePerLane, " routed experts");
  if (R == 0) return;
  moe_route_kernel<<<detail::ceil_div(R, kWarps), kWarps * 32, 0, s>>>(logits, bias, tid2eid, tokens, R, E, K,
                                                                          routed_scale, experts, weights);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
