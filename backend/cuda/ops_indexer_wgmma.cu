// Lightning-indexer scores on Hopper's warpgroup MMA at V4's shape (64 heads x 128 dims; Fast
// precision, the same bf16 rounding of q and keys as ops_indexer_mma.cu, fp32 accumulation).
// The mma.sync scorer re-reads the whole bf16 q (16 KB) from shared memory for every 16 keys: at
// 256k entries ncu showed its L1 / shared-memory pipe 70% busy and the scores took 47 us where
// their key bytes take 16. Here q is the A operand of wgmma.m64n64k16 held in registers (64
// heads = the warpgroup's 64 rows, loaded once per CTA), and a block of 64 keys is the B operand
// read by the tensor cores straight from shared memory, where cp.async stages the next blocks
// (bf16 keys; fp32 keys are rounded on the way in). One key byte crosses shared memory twice
// (the copy in, the wgmma read) instead of q's 16 KB per 16 keys.
// Layout of a staged block (K-major, 128-byte swizzle: wgmma_desc_sw128): dims 64h .. 64h + 63 of
// the 64 keys are region h (8 KB), key e's 128 bytes at 128 e in it, its 16-byte chunk c (dims
// 64h + 8c ..) at chunk c ^ (e % 8); k16 step s starts at region s / 4, 32 (s % 4) bytes in.
// (Unswizzled core matrices ran the FP8 wgmma kernels 1.1-1.6x slower: bench/NOTES.md step 11.)
// The D fragment of warp w holds heads 16w + g, 16w + g + 8 for 16 of the 64 keys; the head sum
// of ω ReLU(d) goes over the lane's two heads, the 8 lanes of a column (shuffles) and the 4 warps
// (shared memory, in warp order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/bf16_fragments.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_indexer_mma.h"
#include "backend/cuda/ops_indexer_select.h"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {

namespace {

constexpr int kHeads = 64, kDim = 128;
constexpr int kKeys = 64;                   // keys per block: the wgmma's N
constexpr int kThreads = 128;               // one warpgroup
constexpr int kStages = 3;                  // blocks in shared memory: one in the MMA, two in flight
constexpr int kCtasPerSm = 3;               // ~66 KB of shared memory each
constexpr int kChunks = kDim / 8;           // 16-byte chunks per bf16 key
constexpr int kBlockBytes = kKeys * kDim * 2;               // 16 KB
constexpr int kHalfBytes = kKeys * 128;                     // one K half of a block

__device__ __forceinline__ uint32_t key_offset(int e, int c) {
  return (c >> 3) * kHalfBytes + e * 128 + (((c & 7) ^ (e & 7)) << 4);
}
constexpr int kCopies = kKeys * kChunks / kThreads;        // 16-byte chunks per thread and block

struct alignas(1024) Smem {  // keys first: the swizzle atoms 1024-aligned
  uint8_t keys[kStages][kBlockBytes];
  float red[kThreads / 32][kKeys];  // per-warp head sums of a block's keys
  uint32_t bins[kSelectBins];       // the select's histogram (when asked for)
};

// Copy i of this thread: key (i / 128) * 8 + i % 8, chunk (i / 8) % 16 — a warp's 32 copies are 8
// keys x 4 chunks (64 contiguous bytes per key); the swizzle puts a chunk's 8 keys on all banks.
__device__ __forceinline__ void copy_coords(int i, int& e, int& c) {
  e = (i >> 7) * 8 + (i & 7);
  c = (i >> 3) & 15;
}

// Keys [e0, e0 + 64) of the row into a stage; past n: zeros (their scores are not stored).
[[maybe_unused]] __device__ __forceinline__ void stage_keys(uint8_t* st, const __nv_bfloat16* keys, int64_t e0,
                                                            int64_t n) {
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {
    const int i = threadIdx.x + j * kThreads;
    int e, c;
    copy_coords(i, e, c);
    uint8_t* dst = st + key_offset(e, c);
    if (e0 + e < n)
      cp_async16(dst, keys + (e0 + e) * kDim + 8 * c);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  }
}
[[maybe_unused]] __device__ __forceinline__ void stage_keys(uint8_t* st, const float* keys, int64_t e0, int64_t n) {
#pragma unroll
  for (int j = 0; j < kCopies; ++j) {  // fp32 keys: rounded to bf16 through registers (loads first)
    const int i = threadIdx.x + j * kThreads;
    int e, c;
    copy_coords(i, e, c);
    float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
    if (e0 + e < n) {
      lo = __ldg(reinterpret_cast<const float4*>(keys + (e0 + e) * kDim + 8 * c));
      hi = __ldg(reinterpret_cast<const float4*>(keys + (e0 + e) * kDim + 8 * c + 4));
    }
    *reinterpret_cast<uint4*>(st + key_offset(e, c)) =
        make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y), pack_bf16(hi.z, hi.w));
  }
}

// A CTA scores the blocks blockIdx.x, blockIdx.x + gridDim.x, ... of row blockIdx.y.
template <typename Key>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    indexer_score_wgmma_kernel(const float* __restrict__ q, const float* __restrict__ omega, const IndexerRow* rows,
                               float* __restrict__ scores, int64_t ld, uint32_t* __restrict__ hist) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(align_1024(smem_raw));
  const int64_t r = blockIdx.y;
  const IndexerRow row = rows[r];
  const int64_t n = row.n_visible, nblocks = ceil_div(n, int64_t(kKeys));
  if (static_cast<int64_t>(blockIdx.x) >= nblocks) return;
  const Key* keys = static_cast<const Key*>(row.keys);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const int64_t nmine = (nblocks - blockIdx.x + gridDim.x - 1) / gridDim.x;  // blocks of this CTA
  auto block_start = [&](int64_t i) { return (static_cast<int64_t>(blockIdx.x) + i * gridDim.x) * kKeys; };
  for (int b = 0; b < kStages - 1; ++b) {  // the first blocks in flight while q is loaded
    if (b < nmine) stage_keys(sm.keys[b], keys, block_start(b), n);
    cp_async_commit();
  }
  if (hist)
    for (int b = tid; b < kSelectBins; b += kThreads) sm.bins[b] = 0;
  // q as the A fragments of 8 k-steps: rows (heads) 16w + g and + 8, dims 16s + 2qd (+1, +8, +9).
  uint32_t qa[kDim / 16][4];
  {
    const float* q0 = q + (r * kHeads + 16 * warp + g) * kDim + 2 * qd;
    const float* q1 = q0 + 8 * kDim;
#pragma unroll
    for (int s = 0; s < kDim / 16; ++s) {
      const float2 a = __ldg(reinterpret_cast<const float2*>(q0 + 16 * s));
      const float2 b = __ldg(reinterpret_cast<const float2*>(q1 + 16 * s));
      const float2 c = __ldg(reinterpret_cast<const float2*>(q0 + 16 * s + 8));
      const float2 d = __ldg(reinterpret_cast<const float2*>(q1 + 16 * s + 8));
      qa[s][0] = pack_bf16(a.x, a.y), qa[s][1] = pack_bf16(b.x, b.y);
      qa[s][2] = pack_bf16(c.x, c.y), qa[s][3] = pack_bf16(d.x, d.y);
    }
  }
  const float om0 = __ldg(omega + r * kHeads + 16 * warp + g), om1 = __ldg(omega + r * kHeads + 16 * warp + g + 8);

  for (int64_t i = 0; i < nmine; ++i) {
    cp_async_wait<kStages - 2>();  // this thread's copies of block i landed
    fence_proxy_async_smem();      // generic-proxy writes (cp.async, stores) before wgmma reads
    __syncthreads();               // everyone's copies of block i; block i - 1's stage and red are free
    const int64_t next = i + kStages - 1;
    if (next < nmine) stage_keys(sm.keys[next % kStages], keys, block_start(next), n);
    cp_async_commit();
    const uint8_t* st = sm.keys[i % kStages];
    float d[32];
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kDim / 16; ++s)
      wgmma_m64n64k16_bf16_rs(d, qa[s], wgmma_desc_sw128(st + (s >> 2) * kHalfBytes + 32 * (s & 3)), s > 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(d);
    // d[4c + 2h + x]: head 16w + g + 8h, key 8c + 2qd + x.
    float part[16];
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int x = 0; x < 2; ++x)
        part[2 * c + x] = om0 * fmaxf(d[4 * c + x], 0.f) + om1 * fmaxf(d[4 * c + 2 + x], 0.f);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
      for (int k = 0; k < 16; ++k) part[k] += __shfl_xor_sync(kFull, part[k], o);
    if (g == 0)
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int x = 0; x < 2; ++x) sm.red[warp][8 * c + 2 * qd + x] = part[2 * c + x];
    __syncthreads();
    if (tid < kKeys) {
      const int64_t e = block_start(i) + tid;
      if (e < n) {
        const float v = sm.red[0][tid] + sm.red[1][tid] + sm.red[2][tid] + sm.red[3][tid];
        scores[r * ld + e] = v;
        if (hist) atomicAdd(&sm.bins[float_key(v) >> kSelectBinShift], 1u);
      }
    }
  }
  cp_async_wait<0>();
  if (!hist) return;
  __syncthreads();
  for (int b = tid; b < kSelectBins; b += kThreads)
    if (sm.bins[b]) atomicAdd(&hist[r * kSelectBins + b], sm.bins[b]);
#else
  __trap();  // built without arch 90a: indexer_wgmma_ok() is false and this is never launched
#endif
}

}  // namespace

namespace {
bool g_wgmma_on = [] {
  const char* env = std::getenv("DSV4_INDEXER_WGMMA");  // 0: the mma.sync scorer (A/B runs)
  return !(env && std::string(env) == "0");
}();
}  // namespace

void set_indexer_wgmma(bool on) { g_wgmma_on = on; }

bool indexer_wgmma_ok(int64_t nh, int64_t hd) {
  static const bool available = wgmma_available();
  return g_wgmma_on && available && nh == kHeads && hd == kDim;
}

void indexer_score_wgmma(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t max_visible,
                         float* scores, int64_t ld, cudaStream_t s, KeyFormat keys, uint32_t* hist) {
  DSV4_CHECK(indexer_wgmma_ok(kHeads, kDim), "indexer_score_wgmma: needs an sm_90 device and an arch-90a build");
  if (R == 0 || max_visible == 0) return;
  auto* kernel =
      keys == KeyFormat::BF16 ? indexer_score_wgmma_kernel<__nv_bfloat16> : indexer_score_wgmma_kernel<float>;
  const size_t smem = 1024 + sizeof(Smem);  // + the alignment of the swizzle atoms
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // CTAs per row: kCtasPerSm per SM over the call, at most one per block of keys.
  const int64_t per_row = std::clamp<int64_t>(ceil_div(kCtasPerSm * sm_count(), R), 1, ceil_div(max_visible, kKeys));
  for_row_ranges(R, [&](int64_t r0, int64_t nr) {
    const dim3 grid(static_cast<unsigned>(per_row), static_cast<unsigned>(nr));
    kernel<<<grid, kThreads, smem, s>>>(q + r0 * kHeads * kDim, omega + r0 * kHeads, rows + r0, scores + r0 * ld, ld,
                                        hist ? hist + r0 * kSelectBins : nullptr);
    DSV4_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace dsv4::cuda::detail
