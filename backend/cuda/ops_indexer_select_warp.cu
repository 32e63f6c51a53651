// The indexer's top-k for short rows, one warp a row (twin: topk_indices; same contract as
// indexer_select). A prefill's CSA rows see at most a few thousand compressed entries each and
// the block forms spent most of their time in block barriers (radix passes, tie scans, the
// shared-memory sort: bench/NOTES.md steps 32-34). Here a row's keys live in its warp's
// registers (64 a lane), so nothing but __syncwarp orders the work:
//   1. threshold: the largest key t with #{key >= t} >= k, found bit by bit from the first bit
//      where the row's keys differ (a warp reduction a bit), stopping early when the keys at or
//      above the bound are exactly k;
//   2. the picks (keys above t, then keys equal to t in index order) compacted by ballots into
//      the warp's shared buffer as composite keys (score key, ~index): all distinct;
//   3. a bitonic sort of the picks, descending, P / 32 a lane in registers (shuffles across
//      lanes, swaps within one), written out.
#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/check.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_select.h"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = 8;                          // rows a block
constexpr int kKeys = kWarpSelectMaxRow / 32;      // keys a lane
constexpr int kGroups = kKeys / 8;                 // loads and counts skip whole groups past n
static_assert(kKeys % 8 == 0 && kWarpSelectMaxTopk % 32 == 0);

// #{row keys >= t} over the warp, for t >= 1 (pads are key 0, never counted).
__device__ __forceinline__ uint32_t count_at_least(const uint32_t (&k)[kKeys], uint32_t t, int groups) {
  uint32_t c = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    if (g < groups) {
#pragma unroll
      for (int j = 0; j < 8; ++j) c += k[8 * g + j] >= t ? 1u : 0u;
    }
  return __reduce_add_sync(kFull, c);
}

__device__ __forceinline__ uint64_t pick_of(uint32_t k, uint32_t i) { return (uint64_t(k) << 32) | uint32_t(~i); }

// One in-lane stage of the sort: registers e and e ^ JE (partners 32 JE apart) compare-exchanged,
// descending where bit k of the element index is clear (k >= 64: one of e's bits).
template <int E, int JE>
__device__ __forceinline__ void swap_stage(uint64_t (&v)[E], int k) {
  if constexpr (JE < E) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int f = e ^ JE;
      if (f < e) continue;
      const bool desc = (e & (k >> 5)) == 0;
      if ((v[e] < v[f]) == desc) {
        const uint64_t a = v[e];
        v[e] = v[f];
        v[f] = a;
      }
    }
  }
}

// Sorts the warp's kk picks (buf[0, kk)) descending, E a lane (element x = 32 e + lane), and
// writes out[0, topk): the picks' indices, then -1. The network's stages are a rolled loop over
// unrolled registers (580 KB of cubin for the five sizes fully unrolled, 204 KB rolled): on an H100
// a lone warp's row of 2048 / 512 entries 46 / 23 -> 40 / 15 us, 8192 causal rows of <= 2048
// entries 200 -> 163 us (bench/NOTES.md steps 34-35). Not inlined: its own register allocation
// (inlined, the kernel spilled 144 bytes at its 128 registers; apart, neither spills).
template <int E>
__device__ __noinline__ void sort_and_write(const uint64_t* buf, uint32_t kk, int64_t topk, int32_t* out, int lane) {
  constexpr int P = 32 * E;
  uint64_t v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) v[e] = 32u * e + lane < kk ? buf[32 * e + lane] : 0;  // 0 pads sort last
#pragma unroll 1
  for (int k = 2; k <= P; k <<= 1) {
#pragma unroll 1
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= 32) {  // partner in this lane: register e ^ (j / 32)
        switch (j >> 5) {
          case 1: swap_stage<E, 1>(v, k); break;
          case 2: swap_stage<E, 2>(v, k); break;
          case 4: swap_stage<E, 4>(v, k); break;
          default: swap_stage<E, 8>(v, k); break;
        }
      } else {  // partner in lane ^ j, same register
        const bool lower = (lane & j) == 0;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const uint64_t o = __shfl_xor_sync(kFull, v[e], j);
          const bool desc = ((32 * e + lane) & k) == 0;
          if ((o > v[e]) == (lower == desc)) v[e] = o;
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const uint32_t x = 32u * e + lane;
    if (x < topk) out[x] = x < kk ? static_cast<int32_t>(~static_cast<uint32_t>(v[e])) : -1;
  }
  for (int64_t x = P + lane; x < topk; x += 32) out[x] = -1;
}

__global__ void __launch_bounds__(kWarps * 32, 2)  // 128 registers: 16 warps an SM
    warp_select_kernel(const float* scores, int64_t ld, const IndexerRow* rows, int64_t R, int64_t topk, int32_t* out) {
  __shared__ uint64_t bufs[kWarps][kWarpSelectMaxTopk];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= R) return;
  const uint32_t n = static_cast<uint32_t>(rows[r].n_visible);
  const uint32_t kk = static_cast<uint32_t>(std::min<int64_t>(topk, n));
  out += r * topk;
  if (kk == 0) {
    for (int64_t x = lane; x < topk; x += 32) out[x] = -1;
    return;
  }
  const float* sc = scores + r * ld + lane;  // entry 256 g + 32 j + lane at an immediate offset
  const int groups = static_cast<int>((n + 255) / 256);
  uint32_t k[kKeys];
#pragma unroll
  for (int g = 0; g < kGroups; ++g)  // every load of the row first: in flight together
#pragma unroll
    for (int j = 0; j < 8; ++j)
      k[8 * g + j] = g < groups && 256u * g + 32u * j + lane < n ? float_key(__ldcg(sc + (256 * g + 32 * j))) : 0u;

  // 1. Picks: keys >= t (ties false), or keys > t and the first need_ties keys == t (ties true).
  uint32_t t = 0, need_ties = 0;
  bool ties = false;
  if (n > kk) {
    uint32_t all_and = ~0u, any_or = 0;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (256u * g + 32u * j + lane < n) {
          all_and &= k[8 * g + j];
          any_or |= k[8 * g + j];
        }
    all_and = __reduce_and_sync(kFull, all_and);
    any_or = __reduce_or_sync(kFull, any_or);
    const uint32_t differ = all_and ^ any_or;
    if (differ == 0) {  // one key value: the first kk entries
      t = all_and;
      ties = true;
      need_ties = kk;
    } else {
      const int top = 31 - __clz(differ);  // bits above it are every key's
      t = all_and & ~((2u << top) - 1u);
      uint32_t at_least = n;  // #{keys >= t}
      for (int b = top; b >= 0 && at_least != kk; --b) {
        const uint32_t c = t | (1u << b);
        const uint32_t m = count_at_least(k, c, groups);
        if (m >= kk) {
          t = c;
          at_least = m;
        }
      }
      if (at_least != kk) {  // t is the kk-th largest key; more keys equal it than are needed
        ties = true;
        need_ties = kk - (t == ~0u ? 0u : count_at_least(k, t + 1u, groups));
      }
    }
  }

  // 2. Compaction. Ties are taken in index order (lower index first): the last one taken, cut,
  // found first, so that one ballot an element decides.
  uint32_t cut = 0;
  if (ties) {
    uint32_t seen = 0;
    bool found = false;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      if (g < groups) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const unsigned tb = __ballot_sync(kFull, k[8 * g + j] == t && 256u * g + 32u * j + lane < n);
          if (!found && seen + __popc(tb) >= need_ties) {  // the need_ties-th tie is in this ballot
            cut = 256u * g + 32u * j + __fns(tb, 0, static_cast<int>(need_ties - seen));
            found = true;
          }
          seen += __popc(tb);
        }
      }
  }
  uint64_t* buf = bufs[warp];
  const unsigned below = (1u << lane) - 1u;
  uint32_t base = 0;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
    if (g < groups) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t i = 256u * g + 32u * j + lane, key = k[8 * g + j];
        const bool take = i < n && (ties ? key > t || (key == t && i <= cut) : key >= t);
        const unsigned tk = __ballot_sync(kFull, take);
        if (take) buf[base + __popc(tk & below)] = pick_of(key, i);
        base += __popc(tk);
      }
    }
  __syncwarp();

  // 3. Sort (P: the picks padded to a power of two, at least 32).
  switch ((kk + 31) / 32) {
    case 1: return sort_and_write<1>(buf, kk, topk, out, lane);
    case 2: return sort_and_write<2>(buf, kk, topk, out, lane);
    case 3:
    case 4: return sort_and_write<4>(buf, kk, topk, out, lane);
    case 5: case 6: case 7:
    case 8: return sort_and_write<8>(buf, kk, topk, out, lane);
    default: return sort_and_write<16>(buf, kk, topk, out, lane);
  }
}

}  // namespace

void indexer_select_warp(const float* scores, int64_t ld, const IndexerRow* rows, int64_t R, int64_t topk,
                         int64_t max_visible, int32_t* out, cudaStream_t s) {
  DSV4_CHECK(max_visible <= kWarpSelectMaxRow && topk >= 1 && topk <= kWarpSelectMaxTopk,
             "indexer_select_warp: rows of at most ", kWarpSelectMaxRow, " entries and top-k of at most ",
             kWarpSelectMaxTopk, " (got ", max_visible, ", ", topk, ")");
  if (R == 0) return;
  warp_select_kernel<<<static_cast<unsigned>(ceil_div(R, kWarps)), kWarps * 32, 0, s>>>(scores, ld, rows, R, topk, out);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
