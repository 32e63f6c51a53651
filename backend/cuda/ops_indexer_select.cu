// The indexer's top-k over a row of scores (twin: topk_indices): indices of the top
// min(topk, n) scores, descending, ties to the lower index. Every pick is ranked by the
// composite key (score key, ~index), so the result is exact whatever path finds it.
// Short rows: one block per row, 8-bit radix select over the scores (four passes from L2),
// ties at the threshold in index order, bitonic sort of the picks.
// Long rows (>= kLargeRow entries): one block read the row 5-6 times at one SM's bandwidth
// (~35 us at 256k entries), so it is spread over the GPU: (1) per chunk a shared-memory
// histogram of the keys' top 12 bits, summed into a per-row global histogram (or the Fast
// scorer's epilogue builds it); (2) every chunk finds the row's threshold bin — the highest bin
// whose suffix count reaches k — and appends the composite keys of its entries at or above it to
// a candidate list (a few hundred past k for smooth scores); (3) the row's last chunk block to
// finish sorts the candidates and keeps the first k ((2) and (3) are one launch). A row whose candidates overflow the list (scores piled into one bin) falls back to
// the short-row select on the full row, so the result never depends on the distribution.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/async_scratch.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_select.h"
#include "backend/cuda/radix_select.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kSelThreads = 1024;
constexpr int kSmallSelThreads = 256;  // short rows of at most kSmallSelMaxRow entries, top <= 512
constexpr int64_t kSmallSelMaxRow = 8192;
constexpr int kBins = kSelectBins;  // histogram of the keys' top 12 bits
constexpr int kBinShift = kSelectBinShift;
constexpr int kChunkThreads = 256;
constexpr int kPerThread = 16;
constexpr int kChunk = kChunkThreads * kPerThread;  // entries per histogram / compaction block
constexpr int kMaxCand = 8192;                      // candidate list per row (64 KB of keys)

// Composite sort key: score key high, complemented index low, so that descending order is
// (score desc, index asc) and all keys are distinct (and never 0: 0 pads sort last).
__device__ __forceinline__ uint64_t pick_key(uint32_t k, int64_t i) {
  return (uint64_t(k) << 32) | uint32_t(~uint32_t(i));
}

// Bitonic sort of cand[0, P) (P a power of two), descending; the whole block calls it.
__device__ void sort_desc(uint64_t* cand, int64_t P) {
  for (int64_t k = 2; k <= P; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
        const int64_t ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = cand[i], b = cand[ixj];
          if (((i & k) == 0) ? (a < b) : (a > b)) {
            cand[i] = b;
            cand[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

__device__ void write_picks(const uint64_t* cand, int64_t kk, int64_t topk, int32_t* out) {
  for (int64_t i = threadIdx.x; i < topk; i += blockDim.x)
    out[i] = i < kk ? static_cast<int32_t>(~static_cast<uint32_t>(cand[i])) : -1;
}

__device__ void sort_desc_in_registers(uint64_t (&v)[2], uint64_t* xchg, int P);

// Short-row select of one row by the whole block (T threads). The picks (at most 2 T after
// padding to a power of two >= 64) are sorted in registers, two a thread (the shared-memory
// network's log2(P)(log2(P) + 1) / 2 barrier stages were most of a prefill row's time:
// bench/NOTES.md step 32); more go through the shared-memory sort.
template <int T>
__device__ void select_row_t(const float* sc, int64_t n, int64_t topk, int32_t* out) {
  __shared__ RadixScratch<uint32_t> rs;
  __shared__ uint64_t cand[kMaxIndexerTopk];
  __shared__ uint32_t warp_ties[T / 32];
  __shared__ uint32_t n_above;
  const int64_t kk = std::min<int64_t>(topk, n);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (kk <= 0) return write_picks(cand, 0, topk, out);
  int64_t P = 64;
  while (P < kk) P <<= 1;
  auto key = [&](int64_t i) { return float_key(sc[i]); };
  auto one = [](int64_t) { return 1u; };
  const uint32_t thr = block_radix_select<uint32_t>(key, one, n, static_cast<uint32_t>(kk), rs);
  const uint32_t need_ties = rs.remaining, n_gt = static_cast<uint32_t>(kk) - need_ties;
  // Keys equal to the threshold: the last pass's bin of it (its histogram is not cleared after).
  const uint32_t n_eq = rs.hist[thr & 255u];
  if (tid == 0) n_above = 0;
  __syncthreads();
  // Every key at or above the threshold is a pick (the usual case: the threshold key alone ties):
  // one pass, any order (the sort orders them), no per-chunk barriers.
  if (n_eq == need_ties)
    for (int64_t i = tid; i < n; i += T) {
      const uint32_t k = key(i);
      if (k >= thr) cand[atomicAdd(&n_above, 1u)] = pick_key(k, i);
    }
  // Otherwise keys above the threshold go anywhere in [0, n_gt); keys equal to it are ranked in
  // index order by a block scan, the first need_ties taken (lower index first).
  uint32_t ties_before = 0;
  for (int64_t base = 0; n_eq != need_ties && base < n; base += T) {
    const int64_t i = base + tid;
    const uint32_t k = i < n ? key(i) : 0u;
    if (i < n && k > thr) cand[atomicAdd(&n_above, 1u)] = pick_key(k, i);
    const bool tie = i < n && k == thr;
    const unsigned ball = __ballot_sync(kFull, tie);
    if (lane == 0) warp_ties[warp] = __popc(ball);
    __syncthreads();
    uint32_t before = 0, total = 0;
    for (int w = 0; w < T / 32; ++w) {
      before += w < warp ? warp_ties[w] : 0u;
      total += warp_ties[w];
    }
    const uint32_t rank = ties_before + before + __popc(ball & ((1u << lane) - 1u));
    if (tie && rank < need_ties) cand[n_gt + rank] = pick_key(k, i);
    ties_before += total;
    __syncthreads();
  }
  for (int64_t i = kk + tid; i < P; i += T) cand[i] = 0;  // pads sort last
  __syncthreads();
  if (P > 2 * T) {
    sort_desc(cand, P);
    return write_picks(cand, kk, topk, out);
  }
  uint64_t v[2];
#pragma unroll
  for (int b = 0; b < 2; ++b) v[b] = 2 * tid + b < P ? cand[2 * tid + b] : 0;
  __syncthreads();  // cand is the exchange buffer from here
  sort_desc_in_registers(v, cand, static_cast<int>(P));
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int64_t i = 2 * tid + b;
    if (i < topk) out[i] = i < kk ? static_cast<int32_t>(~static_cast<uint32_t>(v[b])) : -1;
  }
  for (int64_t i = 2 * T + tid; i < topk; i += T) out[i] = -1;  // past the padded picks: none
}
__device__ void select_row(const float* sc, int64_t n, int64_t topk, int32_t* out) {
  select_row_t<kSelThreads>(sc, n, topk, out);
}

template <int T>
__global__ void __launch_bounds__(T)
    select_kernel(const float* scores, int64_t ld, const IndexerRow* rows, int64_t topk, int32_t* out) {
  const int64_t r = blockIdx.x;
  select_row_t<T>(scores + r * ld, rows[r].n_visible, topk, out + r * topk);
}

// (1) hist[r, b] += #{s in this chunk: key(s) >> 20 == b}.
__global__ void __launch_bounds__(kChunkThreads)
    chunk_hist_kernel(const float* scores, int64_t ld, const IndexerRow* rows, uint32_t* hist) {
  __shared__ uint32_t h[kBins];
  const int64_t r = blockIdx.y, n = rows[r].n_visible, base = static_cast<int64_t>(blockIdx.x) * kChunk;
  if (base >= n) return;
  for (int b = threadIdx.x; b < kBins; b += kChunkThreads) h[b] = 0;
  __syncthreads();
  uint32_t k[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {  // loads first: in flight together
    const int64_t i = base + threadIdx.x + j * kChunkThreads;
    k[j] = i < n ? float_key(scores[r * ld + i]) : 0u;
  }
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {  // one atomic per bin per warp (the bins are crowded)
    const uint32_t bin = base + threadIdx.x + j * kChunkThreads < n ? k[j] >> kBinShift : uint32_t(kBins);
    const unsigned peers = __match_any_sync(kFull, bin);
    if (bin < kBins && lane == __ffs(peers) - 1) atomicAdd(&h[bin], static_cast<uint32_t>(__popc(peers)));
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kChunkThreads)
    if (h[b]) atomicAdd(&hist[r * kBins + b], h[b]);
}

// The highest bin b with #{key >> 20 >= b} >= kk (kk >= 1), by the whole block of T threads:
// thread t sums the kBins / T bins just below 4096 - (kBins / T) t, a block scan orders the sums
// from the top.
template <int T>
__device__ uint32_t threshold_bin(const uint32_t* hist, uint32_t kk) {
  __shared__ uint32_t part[T / 32];
  __shared__ uint32_t found;
  constexpr int kPer = kBins / T;
  const int t = threadIdx.x;
  uint32_t c[kPer], own = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // c[j] = bin 4095 - 16 t - j
    c[j] = hist[kBins - 1 - kPer * t - j];
    own += c[j];
  }
  // Exclusive prefix of `own` over the threads (the top bins first): warp scan, then warp sums.
  const int lane = t & 31, warp = t >> 5;
  uint32_t inc = own;
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t v = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) part[warp] = inc;
  if (t == 0) found = 0;
  __syncthreads();
  uint32_t before = inc - own;
  for (int w = 0; w < warp; ++w) before += part[w];
  if (before < kk && before + own >= kk) {
    uint32_t cum = before;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      cum += c[j];
      if (cum >= kk) {
        found = static_cast<uint32_t>(kBins - 1 - kPer * t - j);
        break;
      }
    }
  }
  __syncthreads();
  return found;  // no crossing (kk > the row's count) cannot happen: kk <= n
}

// Descending bitonic sort of the first P keys (a power of two in [64, 2 x kSelThreads]) held two
// per thread (thread t: elements 2t, 2t + 1): exchanges with a partner in the same warp go through
// shuffles, only the stages whose partner is in another warp through shared memory (a
// shared-memory network of 1024-2048 keys spent ~60 barriers of 1024 threads: 21 us of the
// 256k-entry top-k). Warps past P / 2 keys only meet the barriers: sized to the candidates (a
// few hundred past k), the network has fewer stages and half the warps issue.
constexpr int kRegSortKeys = 2 * kSelThreads;
__device__ void sort_desc_in_registers(uint64_t (&v)[2], uint64_t* xchg, int P) {
  const int t = threadIdx.x;
  const bool active = 2 * t < P;  // warp-uniform: P / 2 is a multiple of 32
  auto keep = [](uint64_t mine, uint64_t other, int e, int j, int k) {
    const int lower = e < (e ^ j) ? e : (e ^ j);
    const bool desc = (lower & k) == 0, first = e == lower;  // the lower index takes the max when desc
    return (desc == first) ? (mine > other ? mine : other) : (mine < other ? mine : other);
  };
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      uint64_t p[2];
      if ((j >> 1) >= 32) {  // partner in another warp: every thread meets the barriers
        if (active) xchg[2 * t] = v[0], xchg[2 * t + 1] = v[1];
        __syncthreads();
        if (active)
#pragma unroll
          for (int b = 0; b < 2; ++b) p[b] = xchg[(2 * t + b) ^ j];
        __syncthreads();
      } else if (!active) {
        continue;
      } else if (j == 1) {
        p[0] = v[1], p[1] = v[0];
      } else {
#pragma unroll
        for (int b = 0; b < 2; ++b) p[b] = __shfl_xor_sync(kFull, v[b], j >> 1);
      }
      if (active)
#pragma unroll
        for (int b = 0; b < 2; ++b) v[b] = keep(v[b], p[b], 2 * t + b, j, k);
    }
  }
}

// (3) Sorts row r's candidates and keeps the first min(topk, n); on overflow, the full select.
// By the whole block (kSelThreads threads); sc: kMaxCand keys of shared memory.
__device__ void select_candidates(const float* scores, int64_t ld, int64_t r, int64_t n, int64_t topk,
                                  int64_t count, const uint64_t* cand, int32_t* out, uint64_t* sc) {
  const int64_t kk = std::min<int64_t>(topk, n);
  if (count > kMaxCand) {  // the scores piled into few bins: exact but slow path
    select_row(scores + r * ld, n, topk, out + r * topk);
    return;
  }
  if (count <= kRegSortKeys) {  // a few hundred past k: sorted in registers
    int P = 64;
    while (P < count) P <<= 1;
    uint64_t v[2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int64_t i = 2 * threadIdx.x + b;
      v[b] = i < count ? __ldcg(cand + r * kMaxCand + i) : 0;  // 0 pads sort last; L2: other blocks wrote them
    }
    sort_desc_in_registers(v, sc, P);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int64_t i = 2 * threadIdx.x + b;
      if (i < topk) out[r * topk + i] = i < kk ? static_cast<int32_t>(~static_cast<uint32_t>(v[b])) : -1;
    }
    return;
  }
  int64_t P = 1;
  while (P < count) P <<= 1;
  for (int64_t i = threadIdx.x; i < P; i += kSelThreads) sc[i] = i < count ? __ldcg(cand + r * kMaxCand + i) : 0;
  __syncthreads();
  sort_desc(sc, P);
  write_picks(sc, kk, topk, out + r * topk);
}


// (2) + (3) in one launch: each block appends pick_key of its chunk's entries at or above the
// threshold bin to cand[r] (cnt[r] counts them all, also past kMaxCand); the row's last block to
// finish sorts them. ctr[2 r] counts row r's candidates, ctr[2 r + 1] its finished blocks. (A
// separate sort launch cost its launch and the compaction's tail.)
constexpr int kCompactPer = kChunk / kSelThreads;  // entries per thread
__global__ void __launch_bounds__(kSelThreads)
    compact_select_kernel(const float* scores, int64_t ld, const IndexerRow* rows, int64_t topk, const uint32_t* hist,
                          uint32_t* ctr, uint64_t* cand, int32_t* out) {
  extern __shared__ uint64_t sc[];
  __shared__ bool last;
  const int64_t r = blockIdx.y, n = rows[r].n_visible, base = static_cast<int64_t>(blockIdx.x) * kChunk;
  if (base >= n) {  // not one of the row's ceil(n / kChunk) blocks; a row without entries: block 0 writes it
    if (n == 0 && blockIdx.x == 0)
      for (int64_t i = threadIdx.x; i < topk; i += kSelThreads) out[r * topk + i] = -1;
    return;
  }
  const uint32_t kk = static_cast<uint32_t>(std::min<int64_t>(topk, n));
  const int lane = threadIdx.x & 31;
  float raw[kCompactPer];
#pragma unroll
  for (int j = 0; j < kCompactPer; ++j) {  // loads first, in flight during the threshold's scan
    const int64_t i = base + threadIdx.x + j * kSelThreads;
    raw[j] = i < n ? __ldg(scores + r * ld + i) : 0.f;
  }
  const uint32_t thr = threshold_bin<kSelThreads>(hist + r * kBins, kk);
#pragma unroll
  for (int j = 0; j < kCompactPer; ++j) {
    const int64_t i = base + threadIdx.x + j * kSelThreads;
    const uint32_t k = float_key(raw[j]);
    const bool take = i < n && (k >> kBinShift) >= thr;
    const unsigned ball = __ballot_sync(kFull, take);
    if (!ball) continue;
    uint32_t first = 0;  // one atomic per warp
    if (lane == __ffs(ball) - 1) first = atomicAdd(&ctr[2 * r], static_cast<uint32_t>(__popc(ball)));
    first = __shfl_sync(kFull, first, __ffs(ball) - 1);
    const uint32_t slot = first + __popc(ball & ((1u << lane) - 1u));
    if (take && slot < kMaxCand) cand[r * kMaxCand + slot] = pick_key(k, i);
  }
  __threadfence();  // this block's candidates and count before its done mark
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(&ctr[2 * r + 1], 1u) == static_cast<uint32_t>(ceil_div(n, int64_t(kChunk))) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every other block's candidates are visible from here
  select_candidates(scores, ld, r, n, topk, __ldcg(&ctr[2 * r]), cand, out, sc);
}

}  // namespace

namespace {
SelectForm g_form = [] {
  const char* env = std::getenv("DSV4_INDEXER_SELECT");
  const std::string f = env ? env : "";
  return f == "warp" ? SelectForm::kWarp : f == "256" ? SelectForm::kBlocks256 : f == "1024" ? SelectForm::kBlocks1024 : SelectForm::kAuto;
}();

// The short-row form by size. H100, step 34 (`bench_ops indexer` select, R rows of n entries,
// top-512, µs for 1024-thread blocks / 256-thread blocks / a warp a row): n 2048: R 1 26 / 33 /
// 46, R 128 27 / 33 / 45, R 256 40 / 37 / 48, R 512 69 / 49 / 49, R 2048 231 / 146 / 65, 8192
// causal rows 773 / 352 / 202; n 512: R 128 20 / 18 / 23, R 512 52 / 28 / 24; n 128: R 1 15 /
// 12 / 9. A warp's row is latency-bound (~45 µs at 2048 entries), so it wins from ~512 rows or on
// short rows; 1024 threads a row win where a few long rows are all there is. Step 35's rolled
// warp sort: n 2048 R 1 23 / 33 / 40, n 512 R 1 18 / 17 / 15, 8192 causal rows 163 (warp).
SelectForm form_by_size(int64_t R, int64_t topk, int64_t max_visible) {
  const bool warp_ok = max_visible <= kWarpSelectMaxRow && topk <= kWarpSelectMaxTopk;
  int64_t P = 64;
  while (P < std::min(topk, max_visible)) P <<= 1;
  const bool b256_ok = P <= 2 * kSmallSelThreads && max_visible <= kSmallSelMaxRow;
  if (g_form == SelectForm::kWarp && warp_ok) return SelectForm::kWarp;
  if (g_form == SelectForm::kBlocks256 && b256_ok) return SelectForm::kBlocks256;
  if (g_form != SelectForm::kAuto) return SelectForm::kBlocks1024;
  if (warp_ok && (R >= 512 || max_visible <= 128)) return SelectForm::kWarp;
  if (b256_ok && (R >= 256 || max_visible <= 1024)) return SelectForm::kBlocks256;
  return SelectForm::kBlocks1024;
}
}  // namespace
void set_indexer_select_form(SelectForm form) { g_form = form; }

void indexer_select(const float* scores, int64_t ld, const IndexerRow* rows, int64_t R, int64_t topk,
                    int64_t max_visible, int32_t* out, cudaStream_t s, const uint32_t* hist, uint32_t* counts) {
  DSV4_CHECK(!counts || hist, "indexer_select: zeroed counts come with a prebuilt histogram");
  DSV4_CHECK(topk >= 1 && topk <= kMaxIndexerTopk, "cuda::indexer_topk: topk must be in [1, ", kMaxIndexerTopk, "]");
  if (R == 0) return;
  if (R > kMaxGridRows) {  // grids hold rows in y
    for_row_ranges(R, [&](int64_t r0, int64_t n) {
      indexer_select(scores + r0 * ld, ld, rows + r0, n, topk, max_visible, out + r0 * topk, s,
                     hist ? hist + r0 * kBins : nullptr, counts ? counts + 2 * r0 : nullptr);
    });
    return;
  }
  if (max_visible < kLargeRow) {
    const SelectForm form = form_by_size(R, topk, max_visible);
    if (form == SelectForm::kWarp) return indexer_select_warp(scores, ld, rows, R, topk, max_visible, out, s);
    if (form == SelectForm::kBlocks256)
      select_kernel<kSmallSelThreads><<<static_cast<unsigned>(R), kSmallSelThreads, 0, s>>>(scores, ld, rows, topk, out);
    else
      select_kernel<kSelThreads><<<static_cast<unsigned>(R), kSelThreads, 0, s>>>(scores, ld, rows, topk, out);
    DSV4_CUDA_LAUNCH_CHECK();
    return;
  }
  // [R] x (candidate count, finished blocks), then (without a prebuilt one) the [R, kBins]
  // histogram: one memset (none when the caller zeroed the counters with its histogram).
  const size_t words = static_cast<size_t>(R) * (hist ? 2 : kBins + 2);
  uint32_t* cnt = counts ? counts : async_scratch_of<uint32_t>(words, s);
  uint64_t* cand = async_scratch_of<uint64_t>(static_cast<size_t>(R) * kMaxCand, s);
  if (!counts) DSV4_CUDA_CHECK(cudaMemsetAsync(cnt, 0, words * sizeof(uint32_t), s));
  const dim3 grid(static_cast<unsigned>(ceil_div(max_visible, kChunk)), static_cast<unsigned>(R));
  if (!hist) {
    uint32_t* own = cnt + 2 * R;
    chunk_hist_kernel<<<grid, kChunkThreads, 0, s>>>(scores, ld, rows, own);
    DSV4_CUDA_LAUNCH_CHECK();
    hist = own;
  }
  const size_t smem = kMaxCand * sizeof(uint64_t);
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(compact_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  compact_select_kernel<<<grid, kSelThreads, smem, s>>>(scores, ld, rows, topk, hist, cnt, cand, out);
  DSV4_CUDA_LAUNCH_CHECK();
  async_release(cand, s);
  if (!counts) async_release(cnt, s);
}

}  // namespace dsv4::cuda::detail
