// MoeRunner: routed experts with device-side grouping and no host synchronisation.
//  1. group_kernel (one block): per-expert counts, offsets, slot -> (row, k) pair permutation and a
//     tile list (expert, first slot, count <= T); the grid is sized by the bound
//     pairs/T + min(E, pairs) and surplus blocks exit, so the host never needs the counts.
//  2. gate/up: g = W1 x, v = W3 x, h = silu(min(g, L)) * clamp(v, ±L) per slot.
//  3. down: y = W2 h, written at the pair's row of Y [R*K, d].
//  4. combine: out[r] += Σ_k w[r,k] Y[r*K + k] in fixed k order (deterministic, no atomics).
// FP4 experts in Fast precision: tensor-core kernels at every size (moe_mma.cu, 8-token tiles;
// on packed weights at prefill sizes moe_mma_wide.cu, 64-token tiles, same bits), on weights
// optionally re-packed for 16-byte loads (pack_for_tensor_cores); the 8-token tiles of packed weights
// on FP8 wgmma where available (moe_wgmma_decode.cu). Otherwise few
// tokens per expert (decode): GEMV kernels (T = 16), weights streamed once per tile with
// FP4/FP8 decoded in registers; many tokens: 64x64 SIMT tiles (weights decoded into smem).
// Weights are read as stored (FP4 packed + E8M0); Fast = the same kernels on FP8-quantised
// activations (x before W1/W3, h before W2), the official W4A8 numerics.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/linear_kernels.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda {
namespace {
using namespace detail;

constexpr int kMaxExperts = 1024;
constexpr int kGemvTile = 16;
constexpr int kWarps = 8;

using Tile = MoeTile;

// Inclusive scan over the block (blockDim.x == 1024 >= E) in shared memory.
__device__ __forceinline__ void block_scan(int* a) {
  for (int o = 1; o < blockDim.x; o <<= 1) {
    const int v = threadIdx.x >= o ? a[threadIdx.x - o] : 0;
    __syncthreads();
    a[threadIdx.x] += v;
    __syncthreads();
  }
}

// One block, a thread per expert (any block size >= E): counts, then scans of the slot and tile
// counts so that each expert writes its own tiles (a serial loop over 256 experts took ~20 us a
// layer).
// Tiles of an expert's c pairs: of T, but the last two merge where together they hold at most Tm
// (the persistent FP8 prefill kernels' wide items; Tm == T: plain T-tiles).
__device__ __forceinline__ int tiles_of(int c, int T, int Tm) {
  return c <= 0 ? 0 : c <= Tm ? 1 : (c - Tm + T - 1) / T + 1;
}

__device__ __forceinline__ void group_pairs(const int32_t* experts, int pairs, int E, int T, int Tm,
                                            int32_t* slot_pair, Tile* tiles, int32_t* n_tiles) {
  __shared__ int cnt[kMaxExperts];
  __shared__ int slots[kMaxExperts];  // inclusive scan of counts
  __shared__ int ntile[kMaxExperts];  // inclusive scan of tile counts
  const int e = threadIdx.x;
  cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int x = experts[i];
    if (x >= 0 && x < E) atomicAdd(&cnt[x], 1);
  }
  __syncthreads();
  const int c = e < E ? cnt[e] : 0;
  slots[e] = c;
  ntile[e] = tiles_of(c, T, Tm);
  __syncthreads();
  block_scan(slots);
  block_scan(ntile);
  const int off = slots[e] - c, t0 = ntile[e] - tiles_of(c, T, Tm);
  for (int s = 0, j = 0; s < c; ++j) {
    const int n = c - s <= Tm ? c - s : T;
    tiles[t0 + j] = Tile{e, off + s, n, 0};
    s += n;
  }
  if (e == blockDim.x - 1) *n_tiles = ntile[e];
  __syncthreads();
  cnt[e] = off;  // reused as each expert's next free slot
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int x = experts[i];
    if (x >= 0 && x < E) slot_pair[atomicAdd(&cnt[x], 1)] = i;
  }
}

__global__ void group_kernel(const int32_t* __restrict__ experts, int pairs, int E, int T, int Tm,
                             int32_t* __restrict__ slot_pair, Tile* __restrict__ tiles, int32_t* __restrict__ n_tiles) {
  group_pairs(experts, pairs, E, T, Tm, slot_pair, tiles, n_tiles);
}

constexpr int kRouteGroupMaxThreads = 512;  // = route_row's expert bound

// The routing of R rows (moe_route's, one warp per row) and then their grouping, in one block:
// one launch where the decode step had two. The block's own writes of experts are what it groups
// (visible to it after the barrier). One thread per expert, E rounded up to whole warps:
// route_row's registers (127 unbounded, 112 under these bounds) would not fit 1024 threads.
__global__ void __launch_bounds__(kRouteGroupMaxThreads)
    route_group_kernel(MoeRoute route, int R, int K, int E, int T, int Tm, int32_t* __restrict__ experts,
                       float* __restrict__ weights, int32_t* __restrict__ slot_pair, Tile* __restrict__ tiles,
                       int32_t* __restrict__ n_tiles) {
  for (int r = threadIdx.x >> 5; r < R; r += blockDim.x >> 5)
    detail::route_row(route.logits, route.bias, route.tid2eid, route.tokens, r, E, K, route.routed_scale, experts,
                      weights);
  __syncthreads();
  group_pairs(experts, R * K, E, T, Tm, slot_pair, tiles, n_tiles);
}

template <int F, int R, bool VEC>
__device__ __forceinline__ void gateup_rows(const DevWeight& w1, const DevWeight& w3, int64_t i, const Tile& t,
                                            const int32_t* slot_pair, int K, const float* x, int64_t d, int64_t I,
                                            float limit, float* H) {
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = x + static_cast<int64_t>(slot_pair[t.start + (r < t.count ? r : 0)] / K) * d;
  float g[R], v[R];
  gemv_warp<F, R, VEC>(w1, i, xs, t.count, g);
  gemv_warp<F, R, VEC>(w3, i, xs, t.count, v);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == lane && r < t.count) H[static_cast<int64_t>(t.start + r) * I + i] = swiglu_clamped(g[r], v[r], limit);
}

constexpr int rows_per_warp(bool vec) { return vec ? 4 : 1; }

template <int F, int R, int NR>
__device__ __forceinline__ void gateup_multi(const DevWeight& w1, const DevWeight& w3, int64_t i0, int n_o,
                                             const Tile& t, const int32_t* slot_pair, int K, const float* x,
                                             int64_t d, int64_t I, float limit, float* H) {
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = x + static_cast<int64_t>(slot_pair[t.start + (r < t.count ? r : 0)] / K) * d;
  float g[NR][R], v[NR][R];
  gemv_warp_rows<F, R, NR>(w1, i0, n_o, xs, t.count, g);
  gemv_warp_rows<F, R, NR>(w3, i0, n_o, xs, t.count, v);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int q = 0; q < NR; ++q)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (q * R + r == lane && q < n_o && r < t.count)
        H[static_cast<int64_t>(t.start + r) * I + i0 + q] = swiglu_clamped(g[q][r], v[q][r], limit);
}

template <int F, int R, int NR>
__device__ __forceinline__ void down_multi(const DevWeight& w2, int64_t o0, int n_o, const Tile& t,
                                           const int32_t* slot_pair, const float* H, int64_t d, int64_t I, float* Y) {
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = H + static_cast<int64_t>(t.start + (r < t.count ? r : 0)) * I;
  float acc[NR][R];
  gemv_warp_rows<F, R, NR>(w2, o0, n_o, xs, t.count, acc);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int q = 0; q < NR; ++q)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (q * R + r == lane && q < n_o && r < t.count)
        Y[static_cast<int64_t>(slot_pair[t.start + r]) * d + o0 + q] = acc[q][r];
}

// Rows of one tile, count <= MAXR. MAXR is the kernel's bound on tokens per tile (the host picks
// it from the call's rows: an expert gets at most one slot per token), so the 1-2 token decode
// kernels do not carry the 16-row path's accumulators (255 registers, 1 block per SM).
template <int F, bool VEC, int MAXR>
__device__ __forceinline__ void gateup_tile_rows(const DevWeight& w1, const DevWeight& w3, int64_t i0, int n_o,
                                                 const Tile& t, const int32_t* slot_pair, int K, const float* x,
                                                 int64_t d, int64_t I, float limit, float* H) {
  constexpr int RPW = rows_per_warp(VEC);
  if constexpr (VEC) {
    // Decode (1-2 tokens on this expert): the warp's rows share each activation load.
    if (t.count <= 1) return gateup_multi<F, 1, RPW>(w1, w3, i0, n_o, t, slot_pair, K, x, d, I, limit, H);
    if constexpr (MAXR >= 2)
      if (t.count <= 2) return gateup_multi<F, 2, RPW>(w1, w3, i0, n_o, t, slot_pair, K, x, d, I, limit, H);
  }
  // Smallest compiled row count covering this tile.
  for (int q = 0; q < n_o; ++q) {
    if (t.count <= 1) gateup_rows<F, 1, VEC>(w1, w3, i0 + q, t, slot_pair, K, x, d, I, limit, H);
    else if constexpr (MAXR <= 4) gateup_rows<F, MAXR, VEC>(w1, w3, i0 + q, t, slot_pair, K, x, d, I, limit, H);
    else if (t.count <= 4) gateup_rows<F, 4, VEC>(w1, w3, i0 + q, t, slot_pair, K, x, d, I, limit, H);
    else gateup_rows<F, MAXR, VEC>(w1, w3, i0 + q, t, slot_pair, K, x, d, I, limit, H);
  }
}

// A tile of more than MAXR tokens (only a routing table that repeats an expert within one token
// can make one) runs as consecutive sub-tiles of MAXR.
__device__ __forceinline__ Tile sub_tile(const Tile& t, int b, int maxr) {
  return Tile{t.expert, t.start + b, min(maxr, t.count - b), 0};
}

// Table per expert: [w1, w2, w3].
template <int F, bool VEC, int MAXR>
__global__ void __launch_bounds__(kWarps * 32) gateup_gemv(const DevWeight* __restrict__ tab, const Tile* __restrict__ tiles,
                                                           const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                                                           int K, const float* __restrict__ x, int64_t d, int64_t I, float limit,
                                                           float* __restrict__ H) {
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const Tile t = tiles[blockIdx.y];
  constexpr int RPW = rows_per_warp(VEC);
  const int64_t i0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * RPW;
  if (i0 >= I) return;
  const int n_o = static_cast<int>(I - i0 < RPW ? I - i0 : RPW);
  const DevWeight w1 = tab[3 * t.expert], w3 = tab[3 * t.expert + 2];
  for (int b = 0; b < t.count; b += MAXR)
    gateup_tile_rows<F, VEC, MAXR>(w1, w3, i0, n_o, sub_tile(t, b, MAXR), slot_pair, K, x, d, I, limit, H);
}

template <int F, int R, bool VEC>
__device__ __forceinline__ void down_rows(const DevWeight& w2, int64_t o, const Tile& t, const int32_t* slot_pair,
                                          const float* H, int64_t d, int64_t I, float* Y) {
  const float* xs[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xs[r] = H + static_cast<int64_t>(t.start + (r < t.count ? r : 0)) * I;
  float acc[R];
  gemv_warp<F, R, VEC>(w2, o, xs, t.count, acc);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r == lane && r < t.count) Y[static_cast<int64_t>(slot_pair[t.start + r]) * d + o] = acc[r];
}

template <int F, bool VEC, int MAXR>
__device__ __forceinline__ void down_tile_rows(const DevWeight& w2, int64_t o0, int n_o, const Tile& t,
                                               const int32_t* slot_pair, const float* H, int64_t d, int64_t I, float* Y) {
  constexpr int RPW = rows_per_warp(VEC);
  if constexpr (VEC) {
    if (t.count <= 1) return down_multi<F, 1, RPW>(w2, o0, n_o, t, slot_pair, H, d, I, Y);
    if constexpr (MAXR >= 2)
      if (t.count <= 2) return down_multi<F, 2, RPW>(w2, o0, n_o, t, slot_pair, H, d, I, Y);
  }
  for (int q = 0; q < n_o; ++q) {
    if (t.count <= 1) down_rows<F, 1, VEC>(w2, o0 + q, t, slot_pair, H, d, I, Y);
    else if constexpr (MAXR <= 4) down_rows<F, MAXR, VEC>(w2, o0 + q, t, slot_pair, H, d, I, Y);
    else if (t.count <= 4) down_rows<F, 4, VEC>(w2, o0 + q, t, slot_pair, H, d, I, Y);
    else down_rows<F, MAXR, VEC>(w2, o0 + q, t, slot_pair, H, d, I, Y);
  }
}

template <int F, bool VEC, int MAXR>
__global__ void __launch_bounds__(kWarps * 32) down_gemv(const DevWeight* __restrict__ tab, const Tile* __restrict__ tiles,
                                                         const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                                                         const float* __restrict__ H, int64_t d, int64_t I, float* __restrict__ Y) {
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const Tile t = tiles[blockIdx.y];
  constexpr int RPW = rows_per_warp(VEC);
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * RPW;
  if (o0 >= d) return;
  const int n_o = static_cast<int>(d - o0 < RPW ? d - o0 : RPW);
  const DevWeight w2 = tab[3 * t.expert + 1];
  for (int b = 0; b < t.count; b += MAXR)
    down_tile_rows<F, VEC, MAXR>(w2, o0, n_o, sub_tile(t, b, MAXR), slot_pair, H, d, I, Y);
}

// ---- many tokens per expert: SIMT tiles -------------------------------------------------------

struct GatherX {
  const float* x;
  const int32_t* slot_pair;
  int start, K;
  int64_t d;
  __device__ const float* operator()(int m) const { return x + static_cast<int64_t>(slot_pair[start + m] / K) * d; }
};
struct SlotRows {
  float* base;
  int start;
  int64_t ld;
  __device__ float* operator()(int m) const { return base + static_cast<int64_t>(start + m) * ld; }
};
struct SlotRowsConst {
  const float* base;
  int start;
  int64_t ld;
  __device__ const float* operator()(int m) const { return base + static_cast<int64_t>(start + m) * ld; }
};
struct PairRows {
  float* Y;
  const int32_t* slot_pair;
  int start;
  int64_t d;
  __device__ float* operator()(int m) const { return Y + static_cast<int64_t>(slot_pair[start + m]) * d; }
};

// blockIdx.z = 0: G = W1 x, 1: V = W3 x.
__global__ void __launch_bounds__(kTileThreads) gateup_tile(const DevWeight* __restrict__ tab, const Tile* __restrict__ tiles,
                                                            const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                                                            int K, const float* __restrict__ x, int64_t d, int64_t I, float* G,
                                                            float* V) {
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const Tile t = tiles[blockIdx.y];
  const DevWeight w = tab[3 * t.expert + (blockIdx.z ? 2 : 0)];
  tile_gemm(w, 0, I, static_cast<int64_t>(blockIdx.x) * kTileN, t.count, GatherX{x, slot_pair, t.start, K, d},
            SlotRows{blockIdx.z ? V : G, t.start, I});
}

__global__ void swiglu_kernel(float* G, const float* V, int64_t n, float limit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) G[i] = swiglu_clamped(G[i], V[i], limit);
}

__global__ void __launch_bounds__(kTileThreads) down_tile(const DevWeight* __restrict__ tab, const Tile* __restrict__ tiles,
                                                          const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ slot_pair,
                                                          const float* __restrict__ H, int64_t d, int64_t I, float* __restrict__ Y) {
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;
  const Tile t = tiles[blockIdx.y];
  tile_gemm(tab[3 * t.expert + 1], 0, d, static_cast<int64_t>(blockIdx.x) * kTileN, t.count,
            SlotRowsConst{H, t.start, I}, PairRows{Y, slot_pair, t.start, d});
}

// V = 4: four adjacent columns per thread with float4 loads (d % 4 == 0, 16-byte aligned out): the
// scalar form issued one load per weight, expert id and Y element and read ~1.6 TB/s (ncu, 4096
// tokens). Same sums in the same k order either way. T: the rows' type, float or bf16 bits
// (uint16_t, widened exactly).
template <int V, typename T>
__device__ __forceinline__ void row_values(const T* row, int64_t c, float (&v)[V]) {
  if constexpr (std::is_same_v<T, float>) {
    using Vec = std::conditional_t<V == 4, float4, float>;
    const Vec y = reinterpret_cast<const Vec*>(row)[c];
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = reinterpret_cast<const float*>(&y)[j];
  } else if constexpr (V == 4) {
    const uint2 u = reinterpret_cast<const uint2*>(row)[c];
    const float4 y = detail::bf16x4_to_float4(u);
    v[0] = y.x, v[1] = y.y, v[2] = y.z, v[3] = y.w;
  } else {
    v[0] = __uint_as_float(uint32_t(row[c]) << 16);
  }
}

template <int V, typename T>
__global__ void combine_kernel(const T* __restrict__ Y, const int32_t* __restrict__ experts,
                               const float* __restrict__ weights, int64_t R, int K, int E, int64_t d,
                               bool accumulate, float* __restrict__ out) {
  using Vec = std::conditional_t<V == 4, float4, float>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, dv = d / V;
  if (i >= R * dv) return;
  const int64_t r = i / dv, c = i % dv;
  float acc[V] = {};
  for (int k = 0; k < K; ++k) {
    const int e = experts[r * K + k];
    if (e < 0 || e >= E) continue;
    const float w = weights[r * K + k];
    float yv[V];
    row_values<V>(Y + (r * K + k) * d, c, yv);
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += w * yv[j];
  }
  Vec& o = reinterpret_cast<Vec*>(out + r * d)[c];
  if (accumulate) {
    const Vec prev = o;
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] += reinterpret_cast<const float*>(&prev)[j];
  }
  Vec res;
#pragma unroll
  for (int j = 0; j < V; ++j) reinterpret_cast<float*>(&res)[j] = acc[j];
  o = res;
}

template <typename T>
void combine_rows(const T* Y, const RoutedRows& rows, int64_t R, int64_t d, bool accumulate, float* out,
                  cudaStream_t s) {
  if (d % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0)
    combine_kernel<4, T><<<static_cast<unsigned>((R * d / 4 + 255) / 256), 256, 0, s>>>(
        Y, rows.experts, rows.weights, R, rows.K, rows.E, d, accumulate, out);
  else
    combine_kernel<1, T><<<static_cast<unsigned>((R * d + 255) / 256), 256, 0, s>>>(
        Y, rows.experts, rows.weights, R, rows.K, rows.E, d, accumulate, out);
}

void combine(const RoutedRows& rows, int64_t R, int64_t d, bool accumulate, float* out, cudaStream_t s) {
  if (rows.Y16)
    combine_rows(rows.Y16, rows, R, d, accumulate, out, s);
  else
    combine_rows(rows.Y, rows, R, d, accumulate, out, s);
  DSV4_CUDA_LAUNCH_CHECK();
}

int g_persistent_ctas = 0;  // set_moe_persistent_ctas
// The persistent FP8 form on merged tiles of up to kMoeFp8MergeTokens (an expert's last two
// 128-token tiles as one item: its weights folded once for both; bench/NOTES.md step 32);
// DSV4_MOE_MERGE=0 or set_moe_merge_tiles(false) keeps 128-token tiles.
bool g_merge_tiles = [] {
  const char* env = std::getenv("DSV4_MOE_MERGE");
  return !(env && env[0] == '0');
}();

// One of the FP8 prefill kernels (a set's gate/up or down) over grid_x CTAs per tile, as a
// programmatic dependent of the launch before.
template <typename Kernel, typename... Args>
void launch_fp8_tiles(Kernel kernel, const Fp8TileKernels& k, int64_t grid_x, unsigned max_tiles, cudaStream_t s,
                      Args&&... args) {
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.smem)));
  // The persistent form: one CTA an SM (or set_moe_persistent_ctas's count), walking the items itself.
  const int64_t items = grid_x * max_tiles;
  const dim3 grid = k.persistent ? dim3(static_cast<unsigned>(std::min<int64_t>(
                                       items, g_persistent_ctas > 0 ? g_persistent_ctas : detail::sm_count())))
                                 : dim3(static_cast<unsigned>(grid_x), max_tiles);
  launch_dependent(kernel, grid, dim3(k.threads), k.smem, s, std::forward<Args>(args)...);
}

int g_wide_mode = 0;  // set_moe_wide_tiles
// The by-size rule's 128-token wgmma tiles: FP8 (moe_wgmma_fp8_wide.cu: the official W4A8
// numerics, h re-quantised to FP8) unless DSV4_MOE_PREFILL_FP8=0 (bf16 activations,
// moe_wgmma.cu); bench/NOTES.md step 15.
const bool g_prefill_fp8 = [] {
  const char* env = std::getenv("DSV4_MOE_PREFILL_FP8");
  return !(env && env[0] == '0');
}();
// Which FP8 kernels the by-size rule runs (same bits): form 2 made persistent (18:
// moe_wgmma_fp8_persistent.cu, a CTA an SM walking the items; 5-8% faster than form 2 at
// 4096-8192 tokens, bench/NOTES.md step 29); DSV4_MOE_PREFILL_WS=2 the warp-specialised form with
// one producer warpgroup and the proxy fence in the consumers (moe_wgmma_fp8_ws.cu, a CTA an
// item: 4-6% faster than the wide kernels, step 25), 0 the wide kernels (moe_wgmma_fp8_wide.cu),
// 1-4 another form, as set_moe_wide_tiles(4-8, 22) forces them.
const int g_prefill_ws = [] {
  const char* env = std::getenv("DSV4_MOE_PREFILL_WS");
  if (!env) return 18;
  const std::string v = env;
  // Anything but 0-18 is -1, refused by fp8_tile_kernels when the by-size rule first asks.
  for (int ws = 0; ws <= 18; ++ws)
    if (v == std::to_string(ws)) return ws;
  return -1;
}();

// ws form 1-4: (producer warpgroups, fence in the consumers) = (1, no), (1, yes), (2, no), (2,
// yes); 18: form 2 persistent. Removed after measuring slower (named errors): 5-8, clusters sharing the codes by TMA
// multicast (1.8-2.9x, bench/NOTES.md step 25); 9-16, the forms of step 26 (copies by warp, per-quad
// token scales, packed weights in registers, codes copied by the consumers, pieces read a block
// ahead, consumer ping-pong, persistent CTAs: 1-37%).
Fp8TileKernels fp8_tile_kernels(int ws) {
  DSV4_CHECK(ws >= 0 && ws <= 18, "MoeRunner: DSV4_MOE_PREFILL_WS must be one of 0-4, 18 (the FP8 prefill expert forms; "
                                  "18 = the default), not '", std::getenv("DSV4_MOE_PREFILL_WS"), "'");
  if (ws == 18) return fp8_ws_persistent_kernels();
  DSV4_CHECK(ws <= 4, "MoeRunner: FP8 prefill form ", ws, " (DSV4_MOE_PREFILL_WS / set_moe_wide_tiles(", ws + 4,
             ")) was removed after it measured slower (", ws <= 8 ? "clustered TMA, 1.8-2.9x" : "step 26's forms, 1-37%",
             "; bench/NOTES.md steps 25-26)");
  if (ws == 0) return fp8_wide_kernels();
  return fp8_ws_kernels(ws > 2 ? 2 : 1, ws % 2 == 0);
}

// Wide tiles on wgmma (moe_wgmma.cu) where the device and build have it, unless mode 1 asks
// for the mma.sync ones.
bool wgmma_tiles() {
  static const bool available = wgmma_available();
  DSV4_CHECK(g_wide_mode < 2 || available,
             "MoeRunner: wgmma expert tiles asked for (set_moe_wide_tiles(2, 3 or 4)) but unavailable: they need an "
             "sm_90 device and a build for CUDA arch 90a");
  return available && g_wide_mode != 1;
}

int g_decode_wgmma = [] {  // set_moe_decode_wgmma
  const char* env = std::getenv("DSV4_MOE_DECODE_WGMMA");
  return env && std::string(env) == "0" ? -1 : 0;
}();

// Wide tiles once experts average kMoeWgmmaMinTokens (wgmma; 12 where the narrow tiles are the
// mma.sync ones, set_moe_decode_wgmma(-1)) or kMoeWideMinTokens (mma.sync) tokens: below that
// most tiles hold one 8-token group and run on an eighth of the 8-token kernels' CTAs.
bool wide_tiles(int64_t pairs, int E) {
  if (g_wide_mode != 0) return g_wide_mode > 0;
  const int min_tokens = !wgmma_tiles() ? kMoeWideMinTokens : g_decode_wgmma < 0 ? 12 : kMoeWgmmaMinTokens;
  return pairs >= static_cast<int64_t>(min_tokens) * E;
}

// Tokens per wgmma tile: 128 from an average of kMoeWgmma128MinTokens per expert (bf16 tiles).
int wgmma_tile_tokens(int64_t pairs, int E) {
  if (g_wide_mode >= 2) return g_wide_mode == 3 ? 128 : 64;
  return pairs >= static_cast<int64_t>(kMoeWgmma128MinTokens) * E ? 128 : 64;
}

// The FP8 wgmma kernels for 8-token tiles of packed experts, unless mode -1 asks for mma.sync.
bool decode_wgmma(int64_t d, int64_t I) {
  if (g_decode_wgmma < 0) return false;
  const bool ok = fp8_decode_ok(d, I);
  DSV4_CHECK(ok || g_decode_wgmma == 0, "MoeRunner: FP8 wgmma decode tiles asked for (set_moe_decode_wgmma(1)) but "
             "unavailable: they need an sm_90 device, a build for CUDA arch 90a and d, I multiples of 128");
  return ok;
}

int g_decode_tile = [] {  // set_moe_decode_tile
  const char* env = std::getenv("DSV4_MOE_DECODE_TILE");
  return env ? std::atoi(env) : 0;
}();

// Tokens per FP8 wgmma decode tile: 16 once experts average kMoeDecode16MinTokens tokens (then
// ~15% have 9-16 and two 8-token tiles would read their weights twice), else 8.
int decode_tile_tokens(int64_t pairs, int E) {
  if (g_decode_tile != 0) return g_decode_tile;
  return pairs >= static_cast<int64_t>(kMoeDecode16MinTokens) * E ? 16 : 8;
}

unsigned blocks256(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

void grow(DeviceBuffer& b, size_t bytes) { grow_scratch(b, bytes); }

}  // namespace

struct MoeRunner::Impl {
  struct Table {
    DeviceBuffer tab;
    int fmt = 0;
    bool aligned = false;  // every weight 16-byte aligned (VEC GEMV)
    bool mma = false;      // the tensor-core path takes these experts (moe_mma.cu)
    bool packed = false;   // weights re-laid by pack_fp4_for_mma: tensor-core path only
  };
  std::map<std::pair<const void*, size_t>, Table> tables;
  DeviceBuffer slot_pair, tiles, n_tiles, H, G, V, Y, xq, xq8, xsc, hq8, hsc, xb, hb;
  bool poison = false;  // set_poison_scratch

  Table& table(const ExpertSet& set) {
    const size_t E = set.w1.size();
    DSV4_CHECK(E > 0 && E <= kMaxExperts && set.w2.size() == E && set.w3.size() == E, "MoeRunner: bad expert set");
    const auto key = std::make_pair(static_cast<const void*>(set.w1[0].data), E);
    auto it = tables.find(key);
    if (it != tables.end()) return it->second;
    std::vector<DevWeight> host(3 * E);
    Table t;
    t.aligned = true;
    for (size_t e = 0; e < E; ++e) {
      const WeightView* ws[3] = {&set.w1[e], &set.w2[e], &set.w3[e]};
      for (int j = 0; j < 3; ++j) {
        host[3 * e + j] = dev_weight(*ws[j]);
        t.aligned = t.aligned && reinterpret_cast<uintptr_t>(ws[j]->data) % 16 == 0;
      }
      DSV4_CHECK(set.w1[e].out == set.I && set.w1[e].in == set.d && set.w3[e].out == set.I && set.w3[e].in == set.d &&
                     set.w2[e].out == set.d && set.w2[e].in == set.I,
                 "MoeRunner: expert ", e, " shape mismatch");
    }
    t.fmt = host[0].fmt;
    for (const auto& w : host) DSV4_CHECK(w.fmt == t.fmt, "MoeRunner: experts must share one format");
    const char* env = std::getenv("DSV4_MOE_MMA");
    t.mma = !(env && std::string(env) == "0") && mma_experts_ok(host.data(), static_cast<int>(host.size()), set.d, set.I);
    t.tab = to_device(host);
    note_scratch_alloc();
    return tables.emplace(key, std::move(t)).first->second;
  }
};

void set_moe_decode_wgmma(int mode) {
  DSV4_CHECK(mode >= -1 && mode <= 1, "set_moe_decode_wgmma: -1 (mma.sync), 0 (wgmma where available), 1 (wgmma)");
  g_decode_wgmma = mode;
}

void set_moe_decode_tile(int tokens) {
  DSV4_CHECK(tokens == 0 || tokens == 8 || tokens == 16, "set_moe_decode_tile: 0 (by size), 8 or 16 tokens");
  g_decode_tile = tokens;
}

void set_moe_merge_tiles(bool on) { g_merge_tiles = on; }

void set_moe_persistent_ctas(int ctas) {
  DSV4_CHECK(ctas >= 0, "set_moe_persistent_ctas: 0 (one per SM) or a positive count");
  g_persistent_ctas = ctas;
}

void set_moe_wide_tiles(int mode) {
  DSV4_CHECK(mode >= -1 && (mode <= 8 || mode == 22),
             "set_moe_wide_tiles: -1 (8-token tiles), 0 (by size), 1 (64-token mma.sync tiles), 2 / 3 (64- / "
             "128-token wgmma tiles), 4-8 and 22 (128-token FP8 wgmma tiles; warp-specialised from 5, 22 persistent); "
             "modes 9-21 (clustered "
             "TMA forms, then step 26's forms) were removed after measuring slower (bench/NOTES.md steps 25-26)");
  g_wide_mode = mode;
}

MoeRunner::MoeRunner() : impl_(std::make_unique<Impl>()) {}

bool MoeRunner::pack_for_tensor_cores(const ExpertSet& set, cudaStream_t s) {
  Impl::Table& tb = impl_->table(set);
  if (!tb.mma) return false;
  if (tb.packed) return true;
  DeviceBuffer scratch(static_cast<size_t>(set.I * set.d / 2));  // each of W1, W2, W3 has I x d values
  for (const auto* ws : {&set.w1, &set.w2, &set.w3})
    for (const WeightView& w : *ws)  // the model owns these bytes; only this runner reads them from now on
      pack_fp4_for_mma(const_cast<uint8_t*>(w.data), w.out, w.in / 2, scratch.as<uint8_t>(), s);
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));  // the scratch is released below
  tb.packed = true;
  return true;
}
void MoeRunner::set_poison_scratch(bool on) { impl_->poison = on; }
MoeRunner::~MoeRunner() = default;

namespace {

template <int F, bool VEC, int MAXR>
void launch_gemv(const DevWeight* tab, const Tile* tiles, const int32_t* nt, const int32_t* sp, int K, const float* x,
                 int64_t d, int64_t I, float limit, float* H, const float* Hin, float* Y, unsigned max_tiles,
                 bool gate, cudaStream_t s) {
  constexpr int per_block = kWarps * rows_per_warp(VEC);
  if (gate) {
    const dim3 grid(static_cast<unsigned>((I + per_block - 1) / per_block), max_tiles);
    gateup_gemv<F, VEC, MAXR><<<grid, kWarps * 32, 0, s>>>(tab, tiles, nt, sp, K, x, d, I, limit, H);
  } else {
    const dim3 grid(static_cast<unsigned>((d + per_block - 1) / per_block), max_tiles);
    down_gemv<F, VEC, MAXR><<<grid, kWarps * 32, 0, s>>>(tab, tiles, nt, sp, Hin, d, I, Y);
  }
  DSV4_CUDA_LAUNCH_CHECK();
}

template <int F, bool VEC>
void launch_gemv_maxr(int maxr, const DevWeight* tab, const Tile* tiles, const int32_t* nt, const int32_t* sp, int K,
                      const float* x, int64_t d, int64_t I, float limit, float* H, const float* Hin, float* Y,
                      unsigned max_tiles, bool gate, cudaStream_t s) {
  switch (maxr) {
    case 1: return launch_gemv<F, VEC, 1>(tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    case 2: return launch_gemv<F, VEC, 2>(tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    case 4: return launch_gemv<F, VEC, 4>(tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    default: return launch_gemv<F, VEC, kGemvTile>(tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
  }
}

template <bool VEC>
void dispatch_gemv(int fmt, int maxr, const DevWeight* tab, const Tile* tiles, const int32_t* nt, const int32_t* sp,
                   int K, const float* x, int64_t d, int64_t I, float limit, float* H, const float* Hin, float* Y,
                   unsigned max_tiles, bool gate, cudaStream_t s) {
  switch (fmt) {
    case kF32: return launch_gemv_maxr<kF32, VEC>(maxr, tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    case kBF16: return launch_gemv_maxr<kBF16, VEC>(maxr, tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    case kFP8: return launch_gemv_maxr<kFP8, VEC>(maxr, tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
    default: return launch_gemv_maxr<kFP4, VEC>(maxr, tab, tiles, nt, sp, K, x, d, I, limit, H, Hin, Y, max_tiles, gate, s);
  }
}

}  // namespace

void MoeRunner::run(const ExpertSet& set, const float* x, int64_t R, const int32_t* experts, const float* weights,
                    int64_t K, float limit, float* out, Precision p, cudaStream_t s, bool accumulate,
                    RoutedRows* defer) {
  run_impl(set, x, R, experts, weights, nullptr, K, limit, out, p, s, accumulate, defer);
}

void MoeRunner::run_routed(const ExpertSet& set, const float* x, int64_t R, const MoeRoute& route, int64_t K,
                           float limit, float* out, Precision p, cudaStream_t s, bool accumulate, RoutedRows* defer) {
  const int64_t E = static_cast<int64_t>(set.w1.size());
  DSV4_CHECK(route.logits && route.experts && route.weights, "MoeRunner::run_routed: logits and outputs needed");
  DSV4_CHECK(K >= 1 && K <= detail::kRouteMaxK && K <= E, "MoeRunner::run_routed: need 1 <= K <= min(E, ",
             detail::kRouteMaxK, ")");
  DSV4_CHECK(route.tid2eid ? route.tokens != nullptr : route.bias != nullptr,
             "MoeRunner::run_routed: hash needs tokens, else a bias");
  DSV4_CHECK(E <= 32 * detail::kRoutePerLane, "MoeRunner::run_routed: at most ", 32 * detail::kRoutePerLane,
             " routed experts");
  run_impl(set, x, R, route.experts, route.weights, &route, K, limit, out, p, s, accumulate, defer);
}

// run(); with `route`, experts / weights are its outputs, written first (in the grouping launch
// where the call is one pass).
void MoeRunner::run_impl(const ExpertSet& set, const float* x, int64_t R, const int32_t* experts,
                         const float* weights, const MoeRoute* route, int64_t K, float limit, float* out, Precision p,
                         cudaStream_t s, bool accumulate, RoutedRows* defer) {
  if (defer) *defer = RoutedRows{};
  if (R <= 0) return;
  if (route && K <= 0) route = nullptr;  // nothing to route
  if (K <= 0) {  // no experts per token: the sum is zero
    if (!accumulate) DSV4_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(R * set.d) * sizeof(float), s));
    return;
  }
  Impl& m = *impl_;
  const Impl::Table& tb = m.table(set);
  const int E = static_cast<int>(set.w1.size());
  const int64_t d = set.d, I = set.I, pairs = R * K;
  DSV4_CHECK(pairs < (1ll << 31), "MoeRunner: too many (row, k) pairs");
  DSV4_CHECK(!tb.packed || p == Precision::Fast,
             "MoeRunner: these experts were re-packed for the Fast tensor-core path; Exact precision needs an "
             "unpacked upload");
  // FP4 experts in Fast precision: tensor cores at every batch size (8-token tiles; 64-token
  // tiles on packed experts at prefill sizes, where 8-token tiles re-read each expert from L2). Otherwise few tokens per
  // expert on average: GEMV tiles; more: 64-token SIMT tiles.
  const bool gemv = pairs <= 8ll * E;
  const auto tiles_for = [&](int64_t np, int t) { return (np + t - 1) / t + std::min<int64_t>(E, np); };
  const bool mma = p == Precision::Fast && tb.mma;
  // Up to one row per warp of the grouping block (one warp per 32 experts) the routing runs
  // there; more rows take moe_route's grid first (rows routed one after another by a few warps
  // would lengthen the chain they are meant to shorten).
  if (route && (R > (E + 31) / 32 || (mma && tiles_for(pairs, kMmaTileTokens) >= 65536))) {
    moe_route(route->logits, route->bias, route->tid2eid, route->tokens, R, E, K, route->routed_scale, route->experts,
              route->weights, s);
    route = nullptr;
  }
  if (mma && tiles_for(pairs, kMmaTileTokens) >= 65536 && R > 1) {  // the grid's y extent: split the rows
    const int64_t h = R / 2;  // (each half reuses Y: combined here, never deferred)
    run(set, x, h, experts, weights, K, limit, out, p, s, accumulate);
    run(set, x + h * d, R - h, experts + h * K, weights + h * K, K, limit, out + h * d, p, s, accumulate);
    return;
  }
  const bool wide = mma && tb.packed && wide_tiles(pairs, E);
  const bool wgmma = wide && wgmma_tiles();
  const bool fp8_wide = wgmma && (g_wide_mode >= 4 || (g_wide_mode == 0 && g_prefill_fp8 && I % 64 == 0 &&
                                                       wgmma_tile_tokens(pairs, E) == 128));
  const int fp8_ws = !fp8_wide ? 0 : g_wide_mode >= 5 ? g_wide_mode - 4 : g_wide_mode == 0 ? g_prefill_ws : 0;
  const bool merge = fp8_wide && fp8_ws == 18 && g_merge_tiles;    // the persistent form's wide items
  const bool fp8 = mma && !wide && tb.packed && decode_wgmma(d, I);  // FP8 wgmma 8- / 16-token tiles
  const int T = fp8_wide ? kMoeFp8WideTokens
                : wgmma ? wgmma_tile_tokens(pairs, E)
                : wide ? kMmaWideTokens
                : fp8  ? decode_tile_tokens(pairs, E)
                : mma  ? kMmaTileTokens
                : gemv ? kGemvTile
                       : kTileM;
  const unsigned max_tiles = static_cast<unsigned>(tiles_for(pairs, T));
  DSV4_CHECK(max_tiles < 65536u, "MoeRunner: tile grid too large (R too big for one call)");
  const int Tm = merge ? kMoeFp8MergeTokens : T;  // merged tiles are fewer: max_tiles still bounds them

  // The weighted sum of the pairs' rows Y: into out, or left to the caller (defer, !accumulate).
  // Y16: the rows as bf16 instead (the FP8 prefill tiles: half the bytes of the [pairs, d] round trip).
  const auto finish = [&](const float* Y, const uint16_t* Y16 = nullptr) {
    const RoutedRows rows{Y16 ? nullptr : Y, experts, weights, static_cast<int>(K), E, Y16};
    if (defer && !accumulate) {
      *defer = rows;
      return;
    }
    combine(rows, R, d, accumulate, out, s);
  };
  grow(m.slot_pair, pairs * sizeof(int32_t));
  grow(m.tiles, max_tiles * sizeof(Tile));
  grow(m.n_tiles, sizeof(int32_t));
  grow(m.H, pairs * I * sizeof(float));
  grow(m.Y, pairs * d * sizeof(float));
  const DevWeight* tab = tb.tab.as<DevWeight>();
  int32_t* sp = m.slot_pair.as<int32_t>();
  Tile* tiles = m.tiles.as<Tile>();
  int32_t* nt = m.n_tiles.as<int32_t>();
  float* H = m.H.as<float>();
  float* Y = m.Y.as<float>();
  if (m.poison) {
    DSV4_CUDA_CHECK(cudaMemsetAsync(H, 0xFF, pairs * I * sizeof(float), s));
    DSV4_CUDA_CHECK(cudaMemsetAsync(Y, 0xFF, pairs * d * sizeof(float), s));
  }

  if (route)
    route_group_kernel<<<1, (E + 31) / 32 * 32, 0, s>>>(*route, static_cast<int>(R), static_cast<int>(K), E, T, Tm,
                                                         route->experts, route->weights, sp, tiles, nt);
  else
    group_kernel<<<1, 1024, 0, s>>>(experts, static_cast<int>(pairs), E, T, Tm, sp, tiles, nt);
  DSV4_CUDA_LAUNCH_CHECK();

  if (fp8_wide) {
    grow(m.xq8, R * d);
    grow(m.xsc, d / 128 * R * sizeof(float));
    grow(m.hq8, pairs * I);
    grow(m.hsc, I / 128 * pairs * sizeof(float));
    uint8_t *xq = m.xq8.as<uint8_t>(), *hq = m.hq8.as<uint8_t>();
    float *xs = m.xsc.as<float>(), *hs = m.hsc.as<float>();
    act_quant_fp8_wgmma_b(x, R, d, d, xq, d, xs, s);
    const Fp8TileKernels k = merge ? fp8_ws_persistent_kernels(true) : fp8_tile_kernels(fp8_ws);
    DSV4_CHECK(k.max_tokens >= Tm, "MoeRunner: tiles of ", Tm, " tokens for kernels of ", k.max_tokens);
    DSV4_CHECK(wgmma_available() && d % 128 == 0 && I % 128 == 0 && R * d < int64_t{UINT32_MAX} &&
                   pairs * I < int64_t{UINT32_MAX},
               "MoeRunner: FP8 prefill tiles need an sm_90a device and build, d and I multiples of 128 and "
               "activations within 32-bit offsets");
    launch_fp8_tiles(k.gateup, k, I / 64, max_tiles, s,
                     Fp8GateUpArgs{tab, tiles, nt, sp, static_cast<int>(K), xq, xs, R, d, I, limit, H});
    act_quant_fp8_wgmma_b(H, pairs, I, I, hq, I, hs, s);
    __nv_bfloat16* Yh = reinterpret_cast<__nv_bfloat16*>(Y);
    launch_fp8_tiles(k.down, k, d / 128, max_tiles, s, Fp8DownArgs{tab, tiles, nt, sp, hq, hs, pairs, d, I, Yh});
    finish(nullptr, reinterpret_cast<const uint16_t*>(Yh));
    return;
  }
  if (wgmma) {
    grow(m.xb, R * d * sizeof(__nv_bfloat16));
    grow(m.hb, pairs * I * sizeof(__nv_bfloat16));
    __nv_bfloat16 *xb = m.xb.as<__nv_bfloat16>(), *hb = m.hb.as<__nv_bfloat16>();
    act_quant_bf16_wgmma(x, R, d, d, xb, d, s);
    wgmma_gateup(T, tab, tiles, nt, max_tiles, sp, static_cast<int>(K), xb, R, d, I, limit, H, s);
    act_quant_bf16_wgmma(H, pairs, I, I, hb, I, s);
    wgmma_down(T, tab, tiles, nt, max_tiles, sp, hb, pairs, d, I, Y, s);
    finish(Y);
    return;
  }
  if (mma) {
    const int64_t kbd = d / 128, kbi = I / 128;
    grow(m.xq8, R * d);
    grow(m.xsc, kbd * R * sizeof(float));
    grow(m.hq8, pairs * I);
    grow(m.hsc, kbi * pairs * sizeof(float));
    act_quant_fp8(x, R, d, d, R, m.xq8.as<uint8_t>(), d, m.xsc.as<float>(), s, tb.packed);
    const uint8_t *xq = m.xq8.as<uint8_t>(), *hq = m.hq8.as<uint8_t>();
    const float *xs = m.xsc.as<float>(), *hs = m.hsc.as<float>();
    const int k = static_cast<int>(K);
    if (wide)
      mma_gateup_wide(tab, tiles, nt, max_tiles, sp, k, xq, xs, R, d, I, limit, H, s);
    else if (fp8)
      fp8_decode_gateup(T, tab, tiles, nt, max_tiles, sp, k, xq, xs, R, d, I, limit, H, s);
    else
      mma_gateup(tab, tb.packed, tiles, nt, max_tiles, sp, k, xq, xs, R, d, I, limit, H, s);
    act_quant_fp8(H, pairs, I, I, pairs, m.hq8.as<uint8_t>(), I, m.hsc.as<float>(), s, tb.packed);
    if (wide)
      mma_down_wide(tab, tiles, nt, max_tiles, sp, hq, hs, pairs, d, I, Y, s);
    else if (fp8)
      fp8_decode_down(T, tab, tiles, nt, max_tiles, sp, hq, hs, pairs, d, I, Y, s);
    else
      mma_down(tab, tb.packed, tiles, nt, max_tiles, sp, hq, hs, pairs, d, I, Y, s);
    finish(Y);
    return;
  }

  const float* xin = x;
  if (p == Precision::Fast) {
    grow(m.xq, R * d * sizeof(float));
    act_fake_quant_fp8(x, R, d, d, m.xq.as<float>(), d, s);
    xin = m.xq.as<float>();
  }

  if (gemv) {
    // The GEMV reads x rows (ld d) and h rows (ld I) with float4 loads.
    const bool vec = tb.aligned && reinterpret_cast<uintptr_t>(xin) % 16 == 0 && d % 32 == 0 && I % 32 == 0;
    // Tokens per tile are at most R (one slot per token per expert): bound the kernel's rows by it.
    const int maxr = R <= 1 ? 1 : R <= 2 ? 2 : R <= 4 ? 4 : kGemvTile;
    auto run_gemv = [&](bool gate) {
      if (vec)
        dispatch_gemv<true>(tb.fmt, maxr, tab, tiles, nt, sp, static_cast<int>(K), xin, d, I, limit, H, H, Y,
                            max_tiles, gate, s);
      else
        dispatch_gemv<false>(tb.fmt, maxr, tab, tiles, nt, sp, static_cast<int>(K), xin, d, I, limit, H, H, Y,
                             max_tiles, gate, s);
    };
    run_gemv(true);
    if (p == Precision::Fast) act_fake_quant_fp8(H, pairs, I, I, H, I, s);
    run_gemv(false);
  } else {
    grow(m.G, pairs * I * sizeof(float));
    float* G = m.G.as<float>();
    const dim3 g1(static_cast<unsigned>((I + kTileN - 1) / kTileN), max_tiles, 2);
    gateup_tile<<<g1, kTileThreads, 0, s>>>(tab, tiles, nt, sp, static_cast<int>(K), xin, d, I, G, H);
    DSV4_CUDA_LAUNCH_CHECK();
    swiglu_kernel<<<blocks256(pairs * I), 256, 0, s>>>(G, H, pairs * I, limit);
    DSV4_CUDA_LAUNCH_CHECK();
    if (p == Precision::Fast) act_fake_quant_fp8(G, pairs, I, I, G, I, s);
    const dim3 g2(static_cast<unsigned>((d + kTileN - 1) / kTileN), max_tiles);
    down_tile<<<g2, kTileThreads, 0, s>>>(tab, tiles, nt, sp, G, d, I, Y);
    DSV4_CUDA_LAUNCH_CHECK();
  }
  finish(Y);
}

}  // namespace dsv4::cuda
