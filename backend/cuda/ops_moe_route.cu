// MoE routing (twin: route() in model/moe.cpp): one warp per row. Scores sqrt(softplus(l)) and
// the biased selection scores live in shared memory; K rounds of warp argmax with ties to the
// lower index reproduce topk_indices' order exactly. Hash layers take tid2eid's row instead.
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxK = 16;

__device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void moe_route_kernel(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens,
                                 int64_t R, int64_t E, int64_t K, float routed_scale, int32_t* experts,
                                 float* weights) {
  extern __shared__ float smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= R) return;  // whole warps only: no block barriers below
  float* score = smem + warp * 2 * E;
  float* biased = score + E;
  for (int64_t e = lane; e < E; e += 32) {
    score[e] = sqrtf(softplus_dev(logits[r * E + e]));
    biased[e] = tid2eid ? 0.f : score[e] + bias[e];
  }
  __syncwarp();
  // Unrolled over kMaxK so that pick[] stays in registers (a runtime index put it in local
  // memory: ~15 us per decode layer for K = 6).
  int32_t pick[kMaxK];
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    if (k >= K) break;
    if (tid2eid) {
      pick[k] = tid2eid[int64_t(tokens[r]) * K + k];
      continue;
    }
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t e = lane; e < E; e += 32) {
      bool taken = false;
#pragma unroll
      for (int j = 0; j < kMaxK; ++j) taken |= j < k && pick[j] == e;
      const float v = biased[e];
      if (!taken && (v > bv || (v == bv && e < bi))) {
        bv = v;
        bi = static_cast<int>(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(detail::kFull, bv, o);
      const int oi = __shfl_xor_sync(detail::kFull, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
      }
    }
    pick[k] = bi;  // identical in every lane after the butterfly
  }
  if (lane == 0) {
    float sum = 0;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k)
      if (k < K) sum += score[pick[k]];
#pragma unroll
    for (int k = 0; k < kMaxK; ++k)
      if (k < K) {
        experts[r * K + k] = pick[k];
        weights[r * K + k] = score[pick[k]] / sum * routed_scale;
      }
  }
}

}  // namespace

void moe_route(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens, int64_t R,
               int64_t E, int64_t K, float routed_scale, int32_t* experts, float* weights, cudaStream_t s) {
  DSV4_CHECK(K >= 1 && K <= kMaxK && K <= E, "cuda::moe_route: need 1 <= K <= min(E, ", kMaxK, ")");
  DSV4_CHECK(tid2eid ? tokens != nullptr : bias != nullptr, "cuda::moe_route: hash needs tokens, else a bias");
  if (R == 0) return;
  const size_t smem = kWarps * 2 * E * sizeof(float);
  moe_route_kernel<<<detail::ceil_div(R, kWarps), kWarps * 32, smem, s>>>(logits, bias, tid2eid, tokens, R, E, K,
                                                                          routed_scale, experts, weights);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
