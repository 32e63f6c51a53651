// Routed experts at prefill sizes on FP8 warpgroup MMA, warp-specialised (sm_90a): the products
// and sums of moe_wgmma_fp8_wide.cu, bit for bit, with the work split by role. There, each
// consumer warpgroup converted its own weights in registers between its wgmmas, and the whole CTA
// met at one barrier per 128-block, so conversion, promotion and the tensor work of both
// warpgroups happened in lockstep (bench/NOTES.md step 15: ~375 dependent instructions per warp
// per block at 2 warps per scheduler, longer than the block's tensor time).
//
// CTA: three warpgroups. Warpgroup 0 produces: thread p owns weight row p % 64 of slice p / 64
// (gate/up: W1 and W3 of the same 64 rows; down: two 64-row slices of W2); per 128-block it
// copies its row's packed FP4 bytes, E8M0 word and a share of the tile's activation codes and
// scales into a stage by cp.async, waits for them, writes its row's folded e4m3 bytes
// (moe_fp8_fold.cuh) into the stage's A operand in the 128-byte swizzle, and arrives on the
// stage's full barrier. Warpgroups 1 and 2 consume: each waits for a stage, runs its slice's four
// k32 steps as shared-memory wgmmas (A: its converted slice, B: the codes), promotes the block's
// sums into its fp32 accumulators with the column scales and releases the stage (one arrival per
// warp on its empty barrier). The two consumers never wait for each other, so one's promotion
// runs under the other's wgmmas. Copies run kAhead blocks ahead of the block being converted, the
// conversion up to two blocks ahead of the consumers.
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/moe_fp8_fold.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kTok = kMoeFp8WideTokens;    // tile tokens: the widest wgmma N
constexpr int kSliceRows = kPackTileRows;  // one consumer's weight rows (one packed tile)
constexpr int kProducers = 2 * kSliceRows;  // warpgroup 0: one weight row per thread
constexpr int kThreads = 3 * 128;
constexpr int kConsumerWarps = 8;
constexpr int kStages = 5;
constexpr int kAhead = kStages - 2;  // blocks copied ahead of the one being converted
constexpr int kExPitch = kTok + 4;   // the epilogue's [row][token] floats

// One 128-block: the tile's codes (B: token t's 128 bytes at 128 t, 16-byte chunk c at c ^ (t %
// 8)), the two slices' folded weights (A: the same swizzle, row r of a slice at 128 r), and what
// the producers load for them: each row's 64 bytes of packed FP4 (16-byte piece i at i ^ (r / 2 %
// 4): a warp's reads of its rows hit every bank once) and E8M0 word, and the tokens' scales.
struct alignas(1024) Stage {
  uint8_t act[kTok * 128];
  uint8_t a[2][kSliceRows * 128];
  uint8_t w[2][kSliceRows][64];
  float xs[kTok];
  uint32_t e[2][kSliceRows];
};
struct Shared {  // after the stages (the epilogue reuses those)
  uint64_t full[kStages], empty[kStages];
  int32_t rows[kTok];
  float row_scale[kProducers];
};
constexpr size_t kSmem = 1024 + kStages * sizeof(Stage) + sizeof(Shared);  // + alignment
static_assert(2 * kSliceRows * kExPitch * sizeof(float) <= kStages * sizeof(Stage), "epilogue fits the stages");
static_assert(kSmem <= 227 * 1024, "one CTA's shared memory");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ int raw_piece(int r, int i) { return 16 * (i ^ ((r >> 1) & 3)); }

// What a producer thread copies and converts: its row (slice s, row lr), the activation codes'
// offsets of its chunks (token row x ld + 16 c), the tile's rows.
template <int N>
struct Producer {
  int s, lr;
  const uint8_t* w;  // the row's packed bytes of block 0
  const uint8_t* e;  // the row's E8M0 bytes
  const uint8_t* xq;
  uint32_t off[N / 16];
  const float* xs;
  int64_t ldxs;
  const int32_t* rows;
  RowBase rb;
};

// Block kb into a stage: this thread's share of the codes, one token scale (threads < N), its
// row's packed bytes and E8M0 word; one cp.async group.
template <int N>
__device__ __forceinline__ void copy_block(Stage& st, const Producer<N>& p, int kb) {
  const int t0 = threadIdx.x;
#pragma unroll
  for (int n = 0; n < N / 16; ++n) {
    const int i = t0 + kProducers * n, t = i >> 3, c = i & 7;
    cp_async16(st.act + t * 128 + ((c ^ (t & 7)) << 4), p.xq + kb * 128 + p.off[n]);
  }
  if (t0 < N) cp_async4(&st.xs[t0], p.xs + kb * p.ldxs + p.rows[t0]);
  const uint8_t* w = p.w + static_cast<int64_t>(kb) * kPackedBlockStride;
#pragma unroll
  for (int i = 0; i < 4; ++i) cp_async16(&st.w[p.s][p.lr][raw_piece(p.lr, i)], w + 16 * i);
  cp_async4(&st.e[p.s][p.lr], p.e + kb * 4);
  cp_async_commit();
}

// The row's four pieces as loaded (piece q: word j = group j's values 8q .. 8q + 7).
__device__ __forceinline__ void load_row(const Stage& st, int s, int lr, uint4 (&v)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = *reinterpret_cast<const uint4*>(&st.w[s][lr][raw_piece(lr, i)]);
}

// k32 step j of the row into its A row: the even elements of pieces 0-3 are bytes 32j .. 32j +
// 15 (chunk 2j), the odd ones chunk 2j + 1 (the register fragment order of the wide kernel: same
// k positions, so the same products).
__device__ __forceinline__ void fold_step(const uint4 (&v)[4], int j, uint32_t lo, uint32_t hi, uint8_t* dst, int lr) {
  uint4 ev, od;
  e2m1x8_e4m3_folded(word_of(v[0], j), lo, hi, ev.x, od.x);
  e2m1x8_e4m3_folded(word_of(v[1], j), lo, hi, ev.y, od.y);
  e2m1x8_e4m3_folded(word_of(v[2], j), lo, hi, ev.z, od.z);
  e2m1x8_e4m3_folded(word_of(v[3], j), lo, hi, ev.w, od.w);
  *reinterpret_cast<uint4*>(dst + (((2 * j) ^ (lr & 7)) << 4)) = ev;
  *reinterpret_cast<uint4*>(dst + (((2 * j + 1) ^ (lr & 7)) << 4)) = od;
}

// Rows with a group that needs rounded tables (needs_rounding). Out of line: the common path
// stays free of calls.
__device__ __noinline__ void fold_row_rounded(const Stage& st, int s, int lr, int base, uint32_t e, uint8_t* dst) {
  uint4 v[4];
  load_row(st, s, lr, v);
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    rounded_tables(static_cast<int>((e >> (8 * j)) & 0xFFu) - base, lo, hi);
    fold_step(v, j, lo, hi, dst, lr);
  }
}

// This thread's row of a stage's block, folded into the stage's A operand.
__device__ __forceinline__ void fold_row(Stage& st, int s, int lr, const RowBase& rb) {
  const uint32_t e = st.e[s][lr];
  uint8_t* dst = st.a[s] + lr * 128;
  if (__builtin_expect(needs_rounding(rb, e), 0)) {
    fold_row_rounded(st, s, lr, rb.base, e, dst);
    return;
  }
  uint4 v[4];
  load_row(st, s, lr, v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    exact_tables(rb, (e >> (8 * j)) & 0xFFu, lo, hi);
    fold_step(v, j, lo, hi, dst, lr);
  }
}

// Warpgroup 0: every block's copies (kAhead ahead) and its row's conversion, then the full
// barrier's arrival. A stage is refilled once both consumers released the block it held.
// The row's exponent base is found while the first copies are in flight.
template <int N, bool kConsumerFence>
__device__ __forceinline__ void produce(Stage* st, Shared& sh, Producer<N>& p, int64_t sc, int nkb) {
  for (int b = 0; b < kAhead; ++b) {
    if (b < nkb)
      copy_block<N>(st[b], p, b);
    else
      cp_async_commit();
  }
  p.rb = row_base_thread(p.e, sc);
  sh.row_scale[threadIdx.x] = p.rb.scale;
  for (int kb = 0; kb < nkb; ++kb) {
    const int nb = kb + kAhead;
    if (nb < nkb) {
      if (nb >= kStages) mbar_wait(&sh.empty[nb % kStages], ((nb / kStages) & 1) ^ 1);
      copy_block<N>(st[nb % kStages], p, nb);
    } else {
      cp_async_commit();
    }
    cp_async_wait<kAhead>();  // this thread's copies of block kb have landed
    fold_row(st[kb % kStages], p.s, p.lr, p.rb);
    if constexpr (!kConsumerFence) fence_proxy_async_smem();  // the codes and folded bytes visible to the wgmmas
    mbar_arrive(&sh.full[kb % kStages]);
  }
  cp_async_wait<0>();
}

template <int N>
__device__ __forceinline__ void block_product(float (&c)[N / 2], const Stage& st, int slice) {
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint64_t da = wgmma_desc_sw128(st.a[slice] + 32 * j), db = wgmma_desc_sw128(st.act + 32 * j);
    if constexpr (N == 128)
      wgmma_m64n128k32_e4m3_ss(c, da, db, j > 0);
    else
      wgmma_m64n64k32_e4m3_ss(c, da, db, j > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(c);
}

// Warpgroups 1 and 2: acc = slice · the tile's first N tokens over all blocks, each block's sums
// promoted with the columns' activation scales.
template <int N, bool kConsumerFence>
__device__ __forceinline__ void consume(Stage* st, Shared& sh, int slice, int nkb, float (&acc)[N / 2]) {
  float c[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % kStages;
    mbar_wait(&sh.full[s], (kb / kStages) & 1);
    if constexpr (kConsumerFence) fence_proxy_async_smem();  // what the producers wrote, to the wgmmas
    block_product<N>(c, st[s], slice);
    promote<N>(c, st[s].xs, acc);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&sh.empty[s]);
  }
}

// The CTA's 128 rows x N tokens into the epilogue's [row][kExPitch] floats (row 64 s + r: slice
// s), scaled; wp / ep: the slices' packed weights and E8M0 rows, in: K, rows: the tile's
// activation rows (columns past the count repeat column 0; not stored).
template <int N, bool kConsumerFence>
__device__ __forceinline__ void tile_product(unsigned char* smem, Shared& sh, const CtaSlices& cs, const uint8_t* xq,
                                             const float* xs, int64_t ldxs, int64_t in, float* ex) {
  Stage* st = reinterpret_cast<Stage*>(smem);
  const int nkb = static_cast<int>(in / 128);
  const bool producer = threadIdx.x < kProducers;
  const int slice = (threadIdx.x >> 7) - 1, wt = threadIdx.x & 127;
  float acc[N / 2];  // consumers'
  if (producer) {
    Producer<N> p;
    p.s = threadIdx.x / kSliceRows;
    p.lr = threadIdx.x % kSliceRows;
    p.w = (p.s ? cs.wp[1] : cs.wp[0]) + p.lr * 64;
    p.e = (p.s ? cs.ep[1] : cs.ep[0]) + p.lr * cs.sc;
    p.xq = xq;
    p.xs = xs;
    p.ldxs = ldxs;
    p.rows = sh.rows;
#pragma unroll
    for (int n = 0; n < N / 16; ++n) {
      const int i = threadIdx.x + kProducers * n;
      p.off[n] = static_cast<uint32_t>(sh.rows[i >> 3] * in + 16 * (i & 7));
    }
    pdl_wait();
    produce<N, kConsumerFence>(st, sh, p, cs.sc, nkb);
  } else {
    consume<N, kConsumerFence>(st, sh, slice, nkb, acc);
  }
  // The roles meet here (one barrier for all, at one place): every stage is released, so the
  // epilogue may reuse them.
  __syncthreads();
  if (!producer) {
    const int r = 16 * (wt >> 5) + ((wt & 31) >> 2);
    stash_rows<N>(acc, sh.row_scale[64 * slice + r], sh.row_scale[64 * slice + r + 8], 64 * slice, wt, ex, kExPitch);
  }
  __syncthreads();
}

// Shared state before the roles split: the tile's rows (row_of(t) for t < count, column 0's
// past it) and the barriers. Returns the shared block.
template <class RowOf>
__device__ __forceinline__ Shared& setup(unsigned char* smem, int count, RowOf row_of) {
  Shared& sh = *reinterpret_cast<Shared*>(smem + kStages * sizeof(Stage));
  if (threadIdx.x < kTok) sh.rows[threadIdx.x] = row_of(threadIdx.x < count ? threadIdx.x : 0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sh.full[s], kProducers);
      mbar_init(&sh.empty[s], kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();
  return sh;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <bool kConsumerFence>
__global__ void __launch_bounds__(kThreads, 1) gateup_fp8_ws_kernel(const Fp8GateUpArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.y) >= *a.n_tiles) return;
  const MoeTile t = a.tiles[blockIdx.y];
  Shared& sh = setup(smem, t.count, [&](int c) { return a.slot_pair[t.start + c] / a.K; });
  const CtaSlices cs = gateup_slices(a.tab, t.expert);
  float* ex = reinterpret_cast<float*>(smem);
  if (t.count <= 64)
    tile_product<64, kConsumerFence>(smem, sh, cs, a.xq, a.xs, a.ldxs, a.d, ex);
  else
    tile_product<128, kConsumerFence>(smem, sh, cs, a.xq, a.xs, a.ldxs, a.d, ex);
  store_h(ex, kExPitch, t, cs.r0, a.I, a.limit, a.H);
#endif
}

template <bool kConsumerFence>
__global__ void __launch_bounds__(kThreads, 1) down_fp8_ws_kernel(const Fp8DownArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  if (static_cast<int>(blockIdx.y) >= *a.n_tiles) return;
  const MoeTile t = a.tiles[blockIdx.y];
  Shared& sh = setup(smem, t.count, [&](int c) { return t.start + c; });
  const CtaSlices cs = down_slices(a.tab, t.expert);
  float* ex = reinterpret_cast<float*>(smem);
  if (t.count <= 64)
    tile_product<64, kConsumerFence>(smem, sh, cs, a.hq, a.hs, a.ldhs, a.I, ex);
  else
    tile_product<128, kConsumerFence>(smem, sh, cs, a.hq, a.hs, a.ldhs, a.I, ex);
  store_y(ex, kExPitch, t, a.slot_pair, cs.r0, a.d, a.Y);
#endif
}

}  // namespace

Fp8TileKernels fp8_ws_kernels(bool consumer_fence) {
  if (consumer_fence) return {gateup_fp8_ws_kernel<true>, down_fp8_ws_kernel<true>, kThreads, kSmem};
  return {gateup_fp8_ws_kernel<false>, down_fp8_ws_kernel<false>, kThreads, kSmem};
}

}  // namespace dsv4::cuda::detail
