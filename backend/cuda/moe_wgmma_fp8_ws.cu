// Routed experts at prefill sizes on FP8 warpgroup MMA, warp-specialised (sm_90a): the products
// and sums of moe_wgmma_fp8_wide.cu, bit for bit, with the work split by role. There, each
// consumer warpgroup converted its own weights in registers between its wgmmas, and the whole CTA
// met at one barrier per 128-block, so conversion, promotion and the tensor work of both
// warpgroups happened in lockstep (bench/NOTES.md step 15: ~375 dependent instructions per warp
// per block at 2 warps per scheduler, longer than the block's tensor time).
//
// CTA: G producer warpgroups and two consumer warpgroups. Producer thread p owns part of weight
// row p / G (slice row / 64: gate/up W1 and W3 of the same 64 rows; down two 64-row slices of W2):
// per 128-block it copies its share of the row's packed FP4 bytes (4 / G of the 16-byte pieces),
// the row's E8M0 word and a share of the tile's activation codes and scales into a stage by
// cp.async, waits for them, writes its share of the row's folded e4m3 bytes (moe_fp8_fold.cuh)
// into the stage's A operand in the 128-byte swizzle, and arrives on the stage's full barrier.
// The consumers each wait for a stage, run their slice's four k32 steps as shared-memory wgmmas
// (A: the converted slice, B: the codes), promote the block's sums into fp32 accumulators with
// the column scales and release the stage (one arrival per warp on its empty barrier); they never
// wait for each other, and they alone run the epilogue (the producers leave after their loop).
// Copies run kAhead blocks ahead of the block being converted, the conversion up to two blocks
// ahead of the consumers. G = 2 (512 threads) gives the conversion twice the warps to hide its
// latency; its registers come from the consumers' share by setmaxnreg (the pool is 128 a thread).
// What bounds it (bench/NOTES.md step 26): the producer's instruction stream (~290 a block a warp
// at ~4.7 cycles each) with the consumers' wgmma + promotion close behind, and per-CTA prologue and
// epilogue (~19% of the time) that nothing overlaps. Step 28 (run 6) took work out instead: no
// weight copies or conversion at all saved 23%, no wgmma 14%, so ~77% of the time is the codes'
// copies, the stage hand-offs and the per-CTA prologue / epilogue. Forms that lost and were removed: clusters
// sharing the codes by TMA multicast (1.8-2.9x slower, step 25, code at 1c59c9f); copies by warp,
// per-quad token scales, packed weights in registers, codes copied by the consumers, pieces read a
// block ahead, consumer ping-pong (step 26, code at e77ecbd). The by-size default since step 29 is
// this form made persistent (moe_wgmma_fp8_persistent.cu: the prologue and epilogue overlapped);
// the stage layout, fold and block product both use are in moe_wgmma_fp8_ws.cuh.
#include <cuda_runtime.h>

#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/moe_wgmma_fp8_ws.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::detail {
namespace {
using namespace fp8ws;

constexpr int kExPitch = kTok + 4;  // the epilogue's [row][token] floats
struct Shared {  // after the stages (the epilogue reuses those)
  uint64_t full[kStages], empty[kStages];
  int32_t rows[kTok];
  float row_scale[kRows];
};
constexpr size_t kSmem = 1024 + kStages * sizeof(Stage) + sizeof(Shared);  // + alignment
static_assert(kRows * kExPitch * sizeof(float) <= kStages * sizeof(Stage), "epilogue fits the stages");
static_assert(kSmem <= 227 * 1024, "one CTA's shared memory");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// What a producer thread copies and converts: its part h of row lr of slice s (pieces h x kPieces
// on), the activation codes' offsets of its chunks (token row x ld + 16 c), the tile's rows.
template <int N, int G>
struct Producer {
  int s, lr, h;
  const uint8_t* w;   // the row's packed bytes of block 0
  const uint8_t* e;  // the row's E8M0 bytes
  const uint8_t* xq;
  uint32_t off[N * 8 / Roles<G>::kProducers];
  const float* xs;
  int64_t ldxs;
  const int32_t* rows;
  RowBase rb;
};

// Block kb into stage `si`: this thread's share of the codes, one token scale (threads < N),
// kPieces pieces of its row and its row's E8M0 word; one cp.async group.
template <int N, int G>
__device__ __forceinline__ void copy_block(Stage& stage, const Producer<N, G>& p, int kb) {
  constexpr int P = Roles<G>::kProducers, kPieces = Roles<G>::kPieces;
  const int t0 = threadIdx.x;
#pragma unroll
  for (int n = 0; n < N * 8 / P; ++n) {
    const int i = t0 + P * n, t = i >> 3, c = i & 7;
    cp_async16(stage.act + t * 128 + ((c ^ (t & 7)) << 4), p.xq + kb * 128 + p.off[n]);
  }
  if (t0 < N) cp_async4(&stage.xs[t0], p.xs + kb * p.ldxs + p.rows[t0]);
  const uint8_t* w = p.w + static_cast<int64_t>(kb) * kPackedBlockStride;
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int i = p.h * kPieces + k;
    cp_async16(&stage.w[p.s][p.lr][raw_piece(p.lr, i)], w + 16 * i);
  }
  cp_async4(&stage.e[p.s][p.lr][p.h], p.e + kb * 4);
  cp_async_commit();
}

// The producers: every block's copies (kAhead ahead) and this thread's conversion, then the full
// barrier's arrival. A stage is refilled once both consumers released the block it held. The row's
// exponent base is found while the first copies are in flight.
template <int N, int G, bool kConsumerFence>
__device__ __forceinline__ void produce(Stage* st, Shared& sh, Producer<N, G>& p, int64_t sc, int nkb) {
  for (int b = 0; b < kAhead; ++b) {
    if (b < nkb)
      copy_block<N, G>(st[b], p, b);
    else
      cp_async_commit();
  }
  p.rb = row_base_thread(p.e, sc);
  if (p.h == 0) sh.row_scale[64 * p.s + p.lr] = p.rb.scale;
  for (int kb = 0; kb < nkb; ++kb) {
    const int nb = kb + kAhead;
    if (nb < nkb) {
      if (nb >= kStages) mbar_wait(&sh.empty[nb % kStages], ((nb / kStages) & 1) ^ 1);
      copy_block<N, G>(st[nb % kStages], p, nb);
    } else {
      cp_async_commit();
    }
    cp_async_wait<kAhead>();  // this thread's copies of block kb have landed
    fold<G>(st[kb % kStages], p.s, p.lr, p.h, p.rb);
    if constexpr (!kConsumerFence) fence_proxy_async_smem();  // the codes and folded bytes visible to the wgmmas
    mbar_arrive(&sh.full[kb % kStages]);
  }
  cp_async_wait<0>();
}

// A consumer warpgroup: acc = slice · the tile's first N tokens over all blocks, each block's
// sums promoted with the columns' activation scales.
template <int N, bool kConsumerFence>
__device__ __forceinline__ void consume(Stage* st, Shared& sh, int slice, int nkb, float (&acc)[N / 2]) {
  float c[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.f;
  for (int kb = 0; kb < nkb; ++kb) {
    const int s = kb % kStages;
    mbar_wait(&sh.full[s], (kb / kStages) & 1);
    if constexpr (kConsumerFence) fence_proxy_async_smem();  // what the producers wrote, to the wgmmas
    block_product<N>(c, smem_addr(&st[s]), slice);
    promote<N>(c, st[s].xs, acc);
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&sh.empty[s]);
  }
}

// The CTA's 128 rows x N tokens into the epilogue's [row][kExPitch] floats (row 64 s + r: slice
// s), scaled; in: K. Returns whether this thread stores the epilogue (the consumers: the
// producers leave once their blocks are out).
template <int N, int G, bool kConsumerFence>
__device__ __forceinline__ bool tile_product(unsigned char* smem, Shared& sh, const CtaSlices& cs, const uint8_t* xq,
                                             const float* xs, int64_t ldxs, int64_t in, float* ex) {
  using R = Roles<G>;
  Stage* st = reinterpret_cast<Stage*>(smem);
  const int nkb = static_cast<int>(in / 128);
  if (threadIdx.x < R::kProducers) {
    if constexpr (G > 1) setmaxnreg_dec<R::kProducerRegs>();
    Producer<N, G> p;
    const int row = threadIdx.x / G;
    p.s = row / kSliceRows;
    p.lr = row % kSliceRows;
    p.h = threadIdx.x % G;
    p.w = (p.s ? cs.wp[1] : cs.wp[0]) + p.lr * 64;
    p.e = (p.s ? cs.ep[1] : cs.ep[0]) + p.lr * cs.sc;
    p.xq = xq;
    p.xs = xs;
    p.ldxs = ldxs;
    p.rows = sh.rows;
#pragma unroll
    for (int n = 0; n < N * 8 / R::kProducers; ++n) {
      const int i = threadIdx.x + R::kProducers * n;
      p.off[n] = static_cast<uint32_t>(sh.rows[i >> 3] * in + 16 * (i & 7));
    }
    pdl_wait();
    produce<N, G, kConsumerFence>(st, sh, p, cs.sc, nkb);
    return false;
  }
  if constexpr (G > 1) setmaxnreg_inc<R::kConsumerRegs>();
  const int ct = threadIdx.x - R::kProducers, slice = ct >> 7, wt = ct & 127;
  float acc[N / 2];
  consume<N, kConsumerFence>(st, sh, slice, nkb, acc);
  consumers_sync();  // every block consumed (so every copy and conversion landed): the stages are free
  const int r = 16 * (wt >> 5) + ((wt & 31) >> 2);
  stash_rows<N>(acc, sh.row_scale[64 * slice + r], sh.row_scale[64 * slice + r + 8], 64 * slice, wt, ex, kExPitch);
  consumers_sync();
  return true;
}

// Shared state before the roles split: the tile's rows (row_of(t) for t < count, column 0's
// past it) and the barriers. Returns the shared block.
template <int G, class RowOf>
__device__ __forceinline__ Shared& setup(unsigned char* smem, int count, RowOf row_of) {
  Shared& sh = *reinterpret_cast<Shared*>(smem + kStages * sizeof(Stage));
  if (threadIdx.x < kTok) sh.rows[threadIdx.x] = row_of(threadIdx.x < count ? threadIdx.x : 0);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sh.full[s], Roles<G>::kProducers);
      mbar_init(&sh.empty[s], kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();
  return sh;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// One tile's gate/up (Args = Fp8GateUpArgs) or down (Fp8DownArgs), G producer warpgroups.
template <int G, bool kConsumerFence, class Args>
__global__ void __launch_bounds__(Roles<G>::kThreads, 1) fp8_ws_kernel(const Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kGateUp = std::is_same_v<Args, Fp8GateUpArgs>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  MoeTile t;
  if (!cta_tile(a, t)) return;
  Shared& sh = setup<G>(smem, t.count, [&](int c) { return act_row(a, t, c); });
  float* ex = reinterpret_cast<float*>(smem);
  bool stores;
  if constexpr (kGateUp) {
    const CtaSlices cs = gateup_slices(a.tab, t.expert);
    stores = t.count <= 64
                 ? tile_product<64, G, kConsumerFence>(smem, sh, cs, a.xq, a.xs, a.ldxs, a.d, ex)
                 : tile_product<128, G, kConsumerFence>(smem, sh, cs, a.xq, a.xs, a.ldxs, a.d, ex);
    if (stores) store_h(ex, kExPitch, t, cs.r0, a.I, a.limit, a.H, threadIdx.x - Roles<G>::kProducers, kConsumers);
  } else {
    const CtaSlices cs = down_slices(a.tab, t.expert);
    stores = t.count <= 64
                 ? tile_product<64, G, kConsumerFence>(smem, sh, cs, a.hq, a.hs, a.ldhs, a.I, ex)
                 : tile_product<128, G, kConsumerFence>(smem, sh, cs, a.hq, a.hs, a.ldhs, a.I, ex);
    if (stores)
      store_y(ex, kExPitch, t, a.slot_pair, cs.r0, a.d, a.Y, threadIdx.x - Roles<G>::kProducers, kConsumers);
  }
#endif
}

template <int G, bool kConsumerFence>
Fp8TileKernels ws_kernels() {
  return {fp8_ws_kernel<G, kConsumerFence, Fp8GateUpArgs>, fp8_ws_kernel<G, kConsumerFence, Fp8DownArgs>,
          Roles<G>::kThreads, kSmem};
}

}  // namespace

Fp8TileKernels fp8_ws_kernels(int producer_groups, bool consumer_fence) {
  DSV4_CHECK(producer_groups == 1 || producer_groups == 2, "fp8_ws_kernels: 1 or 2 producer warpgroups");
  if (producer_groups == 2) return consumer_fence ? ws_kernels<2, true>() : ws_kernels<2, false>();
  return consumer_fence ? ws_kernels<1, true>() : ws_kernels<1, false>();
}

}  // namespace dsv4::cuda::detail
