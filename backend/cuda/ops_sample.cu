// Token sampling, one 1024-thread block per row. Greedy rows (temperature <= 0 or top_k == 1)
// take the argmax (first index of the maximum, as std::max_element). Otherwise:
//   1. top-k: radix-select the k-th largest logit; keep logits >= it (all ties at the k-th
//      value are kept, where the CPU's sort keeps an arbitrary k of them);
//   2. top-p: radix-select over the kept masses p_i = exp((l_i - max) / T) the largest logit
//      threshold whose tail mass reaches top_p · total (the CPU's "smallest prefix");
//   3. draw u in [0, 1) from splitmix64(seed, step), and invert the CDF of the kept masses in
//      index order (each thread sums a contiguous slice; block scan of the slice sums).
// The random stream differs from the CPU sampler's mt19937 (same distribution, not the same
// tokens); for a given (seed, step) the draw is reproducible up to float atomics in step 2.
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/radix_select.cuh"

namespace dsv4::cuda {

using detail::float_key;

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ double uniform01(uint64_t seed, uint64_t step) {
  return (splitmix64(splitmix64(seed) ^ step) >> 11) * (1.0 / 9007199254740992.0);
}

// (value, index) argmax with ties to the lower index, reduced over the block.
__device__ int block_argmax(const float* x, int64_t V, float* best_v) {
  __shared__ float sv[32];
  __shared__ int si[32];
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = x[i];
    if (bi == 0x7fffffff || v > bv) {  // strictly greater: the first maximum of the slice
      bv = v;
      bi = static_cast<int>(i);
    }
  }
  detail::warp_argmax(bv, bi);
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = bv;
    si[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
  bv = sv[0];
  bi = si[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
    if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) {
      bv = sv[w];
      bi = si[w];
    }
  __syncthreads();
  *best_v = bv;
  return bi;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* logits, int64_t V, const float* temperature, const float* top_p, const int32_t* top_k,
                  const uint64_t* seed, const uint64_t* step, int32_t* tokens) {
  __shared__ detail::RadixScratch<uint32_t> rc;
  __shared__ detail::RadixScratch<float> rm;
  __shared__ float fred[32];
  __shared__ double scan[kThreads / 32];
  __shared__ int chosen, fallback;
  const int64_t r = blockIdx.x;
  const float* L = logits + r * V;
  float mx;
  const int amax = block_argmax(L, V, &mx);
  const float T = temperature[r];
  const int64_t k = top_k[r];
  if (T <= 0.f || k == 1) {
    if (threadIdx.x == 0) tokens[r] = amax;
    return;
  }
  auto key = [&](int64_t i) { return float_key(L[i]); };
  uint32_t thr = 0;
  if (k > 0 && k < V) {
    auto one = [](int64_t) { return 1u; };
    thr = detail::block_radix_select<uint32_t>(key, one, V, static_cast<uint32_t>(k), rc);
  }
  auto mass = [&](int64_t i) { return float_key(L[i]) >= thr ? expf((L[i] - mx) / T) : 0.f; };
  const float p = top_p[r];
  if (p < 1.f) {
    float part = 0.f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) part += mass(i);
    const float total = detail::block_sum(part, fred);
    if (p <= 0.f || !(total > 0.f)) {  // the CPU keeps the single most likely token
      if (threadIdx.x == 0) tokens[r] = amax;
      return;
    }
    thr = detail::block_radix_select<float>(key, mass, V, p * total, rm);
  }
  // CDF inversion in index order over contiguous per-thread slices.
  const int64_t slice = (V + kThreads - 1) / kThreads, b = threadIdx.x * slice, e = min(V, b + slice);
  double own = 0.0;
  int last = -1;
  for (int64_t i = b; i < e; ++i) {
    const float m = mass(i);
    if (m > 0.f) {
      own += m;
      last = static_cast<int>(i);
    }
  }
  // Exclusive scan of the slice sums: warp scan, then warp totals in order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double inc = own;
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(detail::kFull, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) scan[warp] = inc;
  if (threadIdx.x == 0) {
    chosen = 0x7fffffff;
    fallback = -1;
  }
  __syncthreads();
  double before = 0.0, total = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? scan[w] : 0.0;
    total += scan[w];
  }
  const double excl = before + inc - own;
  const double target = uniform01(seed[r], step[r]) * total;
  // Slice bounds are rounded sums: a target on a boundary may hit two slices (lower wins) or
  // none (then the last kept token, as the CPU's fallback).
  if (own > 0.0 && target >= excl && target < excl + own) {
    double t = target - excl;
    int pick = last;
    for (int64_t i = b; i < e; ++i) {
      const float m = mass(i);
      if (m > 0.f && (t -= m) < 0.0) {
        pick = static_cast<int>(i);
        break;
      }
    }
    atomicMin(&chosen, pick);
  }
  if (last >= 0) atomicMax(&fallback, last);
  __syncthreads();
  if (threadIdx.x == 0) tokens[r] = chosen != 0x7fffffff ? chosen : fallback >= 0 ? fallback : amax;
}

}  // namespace

void sample(const float* logits, int64_t R, int64_t V, const float* temperature, const float* top_p,
            const int32_t* top_k, const uint64_t* seed, const uint64_t* step, int32_t* tokens, cudaStream_t s) {
  DSV4_CHECK(V >= 1 && V < (int64_t(1) << 31), "cuda::sample: bad vocab size");
  if (R == 0) return;
  sample_kernel<<<R, kThreads, 0, s>>>(logits, V, temperature, top_p, top_k, seed, step, tokens);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
