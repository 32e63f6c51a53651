// Routed experts at prefill sizes on FP8 warpgroup MMA (sm_90a). The bf16 wgmma kernels
// (moe_wgmma.cu) convert every e2m1 weight to bf16 with its scale and run at about half the bf16
// rate. Here a weight becomes an e4m3 byte with its E8M0 group scale folded in (moe_fp8_fold.cuh),
// in the consumer's registers (the A operand). The four k32 steps of a block then chain on the
// tensor core into one accumulator, promoted once per block into the fp32 sum with the row's
// 2^(base - 127) times the column's activation scale (DeepGEMM's per-128 promotion).
// The activation codes (act_quant_fp8_wgmma_b: 16-byte chunks are core-matrix rows) are the B
// operand, staged by cp.async into the 128-byte swizzle.
//
// CTA: two warpgroups, each one 64-row slice of one weight (gate/up: W1 and W3 of the same rows,
// joined by SwiGLU through shared memory; down: two slices of W2), one tile of <= 128 tokens
// (wgmma N = 128, or 64 for tiles of <= 64), all of K; kStages stages of one 128-block copied by
// cp.async kStages - 1 blocks ahead. Software pipeline per warpgroup: block kb + 1's weights are
// converted while block kb's wgmmas run. The grid's x is the row slice: the CTAs of one tile run
// together and read its activation codes (128 tokens x K: twice a slice's weight bytes) from L2
// once; with the tile as x (step 9's order) each slice re-read them from DRAM.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/mma_e4m3.cuh"
#include "backend/cuda/moe_fp8_fold.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kTok = kMoeFp8WideTokens;  // tile tokens: the widest wgmma N
constexpr int kThreads = 256;            // two warpgroups
constexpr int kSliceRows = kPackTileRows;  // one warpgroup's weight rows (one packed tile)
constexpr int kStages = 6;
constexpr int kExPitch = kTok + 4;  // the epilogue's [row][token] floats

// One 128-block: the tile's codes (token t's 128 bytes at 128 t, 16-byte chunk c at c ^ (t % 8))
// and scales, and each warpgroup's 64 rows of packed FP4 (one 4 KB piece) with their E8M0 words.
struct alignas(1024) Stage {
  uint8_t act[kTok * 128];
  float xs[kTok];
  uint8_t w[2][kSliceRows][64];
  uint32_t e[2][kSliceRows];
};
constexpr size_t kSmem = 1024 + kStages * sizeof(Stage) + kTok * sizeof(int32_t);  // + alignment
static_assert(2 * kSliceRows * kExPitch * sizeof(float) <= kStages * sizeof(Stage), "epilogue fits the stages");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Block kb into a stage (every thread; one cp.async group): the first N tokens' codes (off[n]:
// element offset of this thread's chunk n, its token's row x ld + 16 c) and scales (rows: the
// tile's activation rows), the two weight slices' pieces (w[s]: the slice's packed tile) and
// E8M0 words (e[s]: the slice's first row).
template <int N>
__device__ __forceinline__ void stage_block(Stage& st, const uint8_t* xq, const uint32_t (&off)[N * 8 / kThreads],
                                            const float* xs, int64_t ldxs, const int32_t* rows,
                                            const uint8_t* const (&w)[2], const uint8_t* const (&e)[2], int64_t sc,
                                            int kb) {
#pragma unroll
  for (int n = 0; n < N * 8 / kThreads; ++n) {
    const int i = threadIdx.x + kThreads * n, t = i >> 3, c = i & 7;
    cp_async16(st.act + t * 128 + ((c ^ (t & 7)) << 4), xq + kb * 128 + off[n]);
  }
  if (threadIdx.x < N) cp_async4(&st.xs[threadIdx.x], xs + kb * ldxs + rows[threadIdx.x]);
#pragma unroll
  for (int s = 0; s < 2; ++s) {  // thread i copies 16 bytes of each slice's 4 KB piece
    const int o = threadIdx.x * 16;
    cp_async16(&st.w[s][o >> 6][o & 63], w[s] + static_cast<int64_t>(kb) * kPackedBlockStride + o);
  }
  if (threadIdx.x < 2 * kSliceRows) {
    const int r = threadIdx.x % kSliceRows;
    cp_async4(&st.e[threadIdx.x / kSliceRows][r], (threadIdx.x < kSliceRows ? e[0] : e[1]) + r * sc + kb * 4);
  }
  cp_async_commit();
}

// A warpgroup's A fragments of one block: a[j] = k-step j in wgmma order (row g even, row g + 8
// even, row g odd, row g + 8 odd).
struct Frag {
  uint32_t a[4][4];
};

// Blocks where a group of row g or g + 8 needs rounded tables (needs_rounding): every group's
// table rounded. Out of line: the common path stays free of calls.
__device__ __noinline__ Frag fold_rounded(uint4 wa, uint4 wb, uint32_t ea, uint32_t eb, int base_a, int base_b) {
  Frag f;
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j) {
      uint32_t lo, hi;
      rounded_tables(static_cast<int>(((r ? eb : ea) >> (8 * j)) & 0xFFu) - (r ? base_b : base_a), lo, hi);
      e2m1x8_e4m3_folded(word_of(r ? wb : wa, j), lo, hi, f.a[j][r], f.a[j][r + 2]);
    }
  return f;
}

// This warpgroup's fragments of a stage's block (rows lr, lr + 8 of slice s).
__device__ __forceinline__ void fold_block(const Stage& st, const RowBase& ra, const RowBase& rb,
                                           uint32_t (&a)[4][4]) {
  const int s = threadIdx.x >> 7, lr = 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2), q = threadIdx.x & 3;
  const uint4 wa = *reinterpret_cast<const uint4*>(&st.w[s][lr][16 * q]);
  const uint4 wb = *reinterpret_cast<const uint4*>(&st.w[s][lr + 8][16 * q]);
  const uint32_t ea = st.e[s][lr], eb = st.e[s][lr + 8];
  if (__builtin_expect(needs_rounding(ra, ea) || needs_rounding(rb, eb), 0)) {
    const Frag f = fold_rounded(wa, wb, ea, eb, ra.base, rb.base);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[j][i] = f.a[j][i];
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t ba = (ea >> (8 * j)) & 0xFFu, bb = (eb >> (8 * j)) & 0xFFu;
    uint32_t lo, hi;
    exact_tables(ra, ba, lo, hi);
    e2m1x8_e4m3_folded(word_of(wa, j), lo, hi, a[j][0], a[j][2]);
    exact_tables(rb, bb, lo, hi);
    e2m1x8_e4m3_folded(word_of(wb, j), lo, hi, a[j][1], a[j][3]);
  }
}

// c = this warpgroup's 64 rows x N tokens of one block: four k32 steps chained on the tensor core.
template <int N>
__device__ __forceinline__ void issue_block(float (&c)[N / 2], const uint32_t (&a)[4][4], const Stage& st) {
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (N == 128)
      wgmma_m64n128k32_e4m3_rs(c, a[j], wgmma_desc_sw128(st.act + 32 * j), j > 0);
    else
      wgmma_m64n64k32_e4m3_rs(c, a[j], wgmma_desc_sw128(st.act + 32 * j), j > 0);
  }
  wgmma_commit();
}

// What the pipeline steps share.
template <int N>
struct Pipe {
  Stage* st;
  int nkb;
  const uint8_t* xq;
  uint32_t off[N * 8 / kThreads];
  const float* xs;
  int64_t ldxs;
  const int32_t* rows;
  const uint8_t* wp[2];
  const uint8_t* ep[2];
  int64_t sc;
  RowBase ra, rb;
};

// One pipeline step: block kb's wgmmas (on a_cur) are in flight; stage the block kStages - 1
// ahead, convert block kb + 1 into a_next, wait, promote kb, issue kb + 1. s: kb's stage.
template <int N>
__device__ __forceinline__ void pipeline_step(const Pipe<N>& p, int kb, int s, float (&c)[N / 2], float (&acc)[N / 2],
                                              uint32_t (&a_next)[4][4]) {
  // Block kb + 1 has landed for every thread; every warpgroup has waited for and promoted block
  // kb - 1, whose stage block kb + kStages - 1 takes.
  cp_async_wait<kStages - 3>();
  fence_proxy_async_smem();
  __syncthreads();
  const int nb = kb + kStages - 1, sp = s == 0 ? kStages - 1 : s - 1, sn = s == kStages - 1 ? 0 : s + 1;
  if (nb < p.nkb)
    stage_block<N>(p.st[sp], p.xq, p.off, p.xs, p.ldxs, p.rows, p.wp, p.ep, p.sc, nb);
  else
    cp_async_commit();
  const bool more = kb + 1 < p.nkb;
  if (more) fold_block(p.st[sn], p.ra, p.rb, a_next);
  wgmma_wait<0>();
  wgmma_pin(c);
  promote<N>(c, p.st[s].xs, acc);
  if (more) issue_block<N>(c, a_next, p.st[sn]);
}

// acc = this warpgroup's 64 rows (slice s = threadIdx.x / 128: packed tile cs.wp[s], E8M0 rows cs.ep[s]) ·
// the tile's first N tokens over all in / 128 blocks of K, unscaled by the rows' 2^6 · scale
// (rs: rows g, g + 8). rows[t]: the activation row of tile column t (columns past count repeat
// column 0; not stored).
template <int N>
__device__ __forceinline__ void slice_times_tile(unsigned char* smem, const CtaSlices& cs, const int32_t* rows,
                                                 const uint8_t* xq, const float* xs, int64_t ldxs, int64_t in,
                                                 float (&acc)[N / 2], float (&rs)[2]) {
  Pipe<N> p;
  p.st = reinterpret_cast<Stage*>(smem);
  p.nkb = static_cast<int>(in / 128);
  p.xq = xq;
  p.xs = xs;
  p.ldxs = ldxs;
  p.rows = rows;
  p.sc = cs.sc;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    p.wp[i] = cs.wp[i];
    p.ep[i] = cs.ep[i];
  }
#pragma unroll
  for (int n = 0; n < N * 8 / kThreads; ++n) {
    const int i = threadIdx.x + kThreads * n;
    p.off[n] = static_cast<uint32_t>(rows[i >> 3] * in + 16 * (i & 7));
  }
  {  // the weights' scales are not written by the kernel before this one (pdl.cuh)
    const int ws = threadIdx.x >> 7, lr = 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);
    const uint8_t* e = ws ? cs.ep[1] : cs.ep[0];
    p.ra = row_base_quad(e + lr * cs.sc, cs.sc);
    p.rb = row_base_quad(e + (lr + 8) * cs.sc, cs.sc);
    rs[0] = p.ra.scale;
    rs[1] = p.rb.scale;
  }
  pdl_wait();
  for (int b = 0; b < kStages - 1; ++b) {
    if (b < p.nkb)
      stage_block<N>(p.st[b], xq, p.off, xs, ldxs, rows, p.wp, p.ep, p.sc, b);
    else
      cp_async_commit();
  }
  float c[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = c[i] = 0.f;
  uint32_t a0[4][4], a1[4][4];
  cp_async_wait<kStages - 2>();
  fence_proxy_async_smem();
  __syncthreads();
  fold_block(p.st[0], p.ra, p.rb, a0);
  issue_block<N>(c, a0, p.st[0]);
  int s = 0;  // block kb's stage
  for (int kb = 0; kb < p.nkb; kb += 2) {
    pipeline_step<N>(p, kb, s, c, acc, a1);
    s = s == kStages - 1 ? 0 : s + 1;
    if (kb + 1 < p.nkb) {
      pipeline_step<N>(p, kb + 1, s, c, acc, a0);
      s = s == kStages - 1 ? 0 : s + 1;
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free for the epilogue
}

// The epilogue's [128 rows][kExPitch] floats (warpgroup s at rows 64 s).
template <int N>
__device__ __forceinline__ void stash(const float (&acc)[N / 2], const float (&rs)[2], float* ex) {
  stash_rows<N>(acc, rs[0], rs[1], 64 * (threadIdx.x >> 7), threadIdx.x & 127, ex, kExPitch);
  __syncthreads();
}

// The CTA's 128 rows x the tile's tokens (rows[t]: the activation row of column t, set before)
// into the epilogue's floats, on N = 64 wgmmas for tiles of <= 64 tokens.
__device__ __forceinline__ void tile_into(unsigned char* smem, const CtaSlices& cs, const int32_t* rows,
                                          const uint8_t* act, const float* scales, int64_t ld, int64_t in, int count,
                                          float* ex) {
  float rs[2];
  if (count <= 64) {
    float acc[32];
    slice_times_tile<64>(smem, cs, rows, act, scales, ld, in, acc, rs);
    stash<64>(acc, rs, ex);
  } else {
    float acc[64];
    slice_times_tile<128>(smem, cs, rows, act, scales, ld, in, acc, rs);
    stash<128>(acc, rs, ex);
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Gate/up (Fp8GateUpArgs: h rows r0 .. r0 + 63, SwiGLU of the W1 and W3 slices) or down
// (Fp8DownArgs: y rows r0 .. r0 + 127) of one tile.
template <class Args>
__global__ void __launch_bounds__(kThreads, 1) fp8_wide_kernel(const Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kGateUp = std::is_same_v<Args, Fp8GateUpArgs>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  MoeTile t;
  if (!cta_tile(a, t)) return;
  int32_t* rows = reinterpret_cast<int32_t*>(smem + kStages * sizeof(Stage));
  if (threadIdx.x < kTok) rows[threadIdx.x] = act_row(a, t, threadIdx.x < t.count ? threadIdx.x : 0);
  __syncthreads();
  float* ex = reinterpret_cast<float*>(smem);
  if constexpr (kGateUp) {
    const CtaSlices cs = gateup_slices(a.tab, t.expert);
    tile_into(smem, cs, rows, a.xq, a.xs, a.ldxs, a.d, t.count, ex);
    store_h(ex, kExPitch, t, cs.r0, a.I, a.limit, a.H, threadIdx.x, kThreads);
  } else {
    const CtaSlices cs = down_slices(a.tab, t.expert);
    tile_into(smem, cs, rows, a.hq, a.hs, a.ldhs, a.I, t.count, ex);
    store_y(ex, kExPitch, t, a.slot_pair, cs.r0, a.d, a.Y, threadIdx.x, kThreads);
  }
#endif
}

}  // namespace

Fp8TileKernels fp8_wide_kernels() {
  return {fp8_wide_kernel<Fp8GateUpArgs>, fp8_wide_kernel<Fp8DownArgs>, kThreads, kSmem};
}

}  // namespace dsv4::cuda::detail
