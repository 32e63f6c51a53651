// Block-wide radix selection over uint32 keys (8-bit digits, MSB first), used by the indexer's
// top-k and the sampler's top-k / top-p. The block size must be a multiple of 32. The keys are re-read from the caller's functor on
// every pass (they live in global memory / L2; a 64k-entry row does not fit in shared memory).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda::detail {

// Shared scratch of one selection.
template <typename W>
struct RadixScratch {
  W hist[256];
  uint32_t prefix;
  W remaining;
};

// Warp 0 walks the 256 bins from the top and picks the first bin where the running weight
// reaches `remaining`; updates prefix/remaining. Bins are split 8 per lane for a warp scan.
template <typename W>
__device__ void radix_pick_bin(RadixScratch<W>& s, int shift) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  W c[8];
  W own = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    c[j] = s.hist[255 - 8 * lane - j];
    own += c[j];
  }
  W inc = own;
  for (int o = 1; o < 32; o <<= 1) {
    const W t = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += t;
  }
  const W exc = inc - own;
  const W rem = s.remaining;
  const unsigned hit = __ballot_sync(kFull, exc < rem && inc >= rem);
  if (hit) {
    if (lane == __ffs(hit) - 1) {
      W cum = exc;
      int bin = 0;
      for (int j = 0; j < 8; ++j) {
        if (cum + c[j] >= rem) {
          bin = 255 - 8 * lane - j;
          break;
        }
        cum += c[j];
      }
      s.prefix |= static_cast<uint32_t>(bin) << shift;
      s.remaining = rem - cum;
    }
    return;
  }
  // The whole weight falls short of `rem` (float rounding of masses): keep every key, i.e.
  // descend into the lowest non-empty bin.
  const unsigned nonempty = __ballot_sync(kFull, own > W(0));
  if (!nonempty) return;
  if (lane == 31 - __clz(nonempty)) {
    for (int j = 7; j >= 0; --j) {
      if (c[j] > W(0)) {
        s.prefix |= static_cast<uint32_t>(255 - 8 * lane - j) << shift;
        s.remaining = c[j];
        break;
      }
    }
  }
}

// Finds the largest threshold key t such that weight{key >= t} >= target, where weight(i) is
// 1 (W = uint32_t: t is the target-th largest key) or a float mass (top-p). Keys with zero
// weight are ignored. Returns t; `remaining` ends as the weight still needed from keys == t.
template <typename W, typename KeyFn, typename WeightFn>
__device__ uint32_t block_radix_select(KeyFn key, WeightFn weight, int64_t n, W target, RadixScratch<W>& s) {
  if (threadIdx.x == 0) {
    s.prefix = 0;
    s.remaining = target;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s.prefix;
    if constexpr (std::is_same_v<W, uint32_t>) {
      // Counts: lanes of a warp that hit the same bin add once (__match_any + __reduce_add, exact).
      // Scores crowd into a few bins of the top digit, and 32 lanes' atomics on one shared word
      // serialised: ~110 us for a 16k-entry indexer row.
      for (int64_t base = 0; base < n; base += blockDim.x) {  // whole warps iterate together
        const int64_t i = base + threadIdx.x;
        uint32_t bin = 256u, w = 0u;
        if (i < n) {
          const uint32_t k = key(i);
          if ((k & mask) == prefix) {
            w = weight(i);
            if (w > 0u) bin = (k >> shift) & 255u;
          }
        }
        const unsigned peers = __match_any_sync(kFull, bin);
        const uint32_t total = __reduce_add_sync(peers, w);
        if (bin < 256u && static_cast<int>(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&s.hist[bin], total);
      }
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint32_t k = key(i);
        if ((k & mask) == prefix) {
          const W w = weight(i);
          if (w > W(0)) atomicAdd(&s.hist[(k >> shift) & 255u], w);
        }
      }
    }
    __syncthreads();
    radix_pick_bin(s, shift);
    __syncthreads();
    mask |= 255u << shift;
  }
  return s.prefix;
}

}  // namespace dsv4::cuda::detail
