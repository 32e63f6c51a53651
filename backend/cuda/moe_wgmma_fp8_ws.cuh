// What the two warp-specialised FP8 prefill expert forms share (moe_wgmma_fp8_ws.cu: a CTA a
// (tile, row slice) item; moe_wgmma_fp8_persistent.cu: a CTA an SM walking the items): the stage
// layout of one 128-block, the roles' sizes, the producers' fold of the packed FP4 pieces into the
// stage's e4m3 A operand (moe_fp8_fold.cuh's tables) and the consumers' block product. Both forms
// build the same stage bytes and run the same wgmmas, so their outputs are the same bits. Only
// .cu files include this; the device functions exist where __CUDA_ARCH_FEAT_SM90_ALL is defined.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_fp8_fold.cuh"
#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail::fp8ws {
constexpr int kTok = kMoeFp8WideTokens;    // tile tokens: the widest wgmma N
constexpr int kSliceRows = kPackTileRows;  // one consumer's weight rows (one packed tile)
constexpr int kRows = 2 * kSliceRows;      // the CTA's weight rows
constexpr int kConsumers = 256, kConsumerWarps = kConsumers / 32;
constexpr int kStages = 5;
constexpr int kAhead = kStages - 2;  // blocks copied ahead of the one being converted

// G producer warpgroups: threads, producers, pieces of a row per producer, and for G = 2 the
// registers each role takes (setmaxnreg; the two shares sum to the pool of 128 a thread).
template <int G>
struct Roles {
  static constexpr int kProducers = 128 * G, kThreads = kProducers + kConsumers, kPieces = 4 / G;
  static constexpr int kProducerRegs = 96, kConsumerRegs = 160;
  static_assert(G == 1 || kProducers * kProducerRegs + kConsumers * kConsumerRegs == 65536,
                "setmaxnreg shares must fill the CTA's register pool exactly");
};

// One 128-block: the tile's codes (B: token t's 128 bytes at 128 t, 16-byte chunk c at c ^ (t %
// 8)), the two slices' folded weights (A: the same swizzle, row r of a slice at 128 r), and what
// the producers load for them: each row's 64 bytes of packed FP4 (16-byte piece i at i ^ (r / 2 %
// 4): a warp's reads of its rows spread over the banks), its E8M0 word (one copy per producer of
// the row), and the tokens' scales.
struct alignas(1024) Stage {
  uint8_t act[kTok * 128];
  uint8_t a[2][kSliceRows * 128];
  uint8_t w[2][kSliceRows][64];
  float xs[kTok];
  uint32_t e[2][kSliceRows][2];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ int raw_piece(int r, int i) { return 16 * (i ^ ((r >> 1) & 3)); }

template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// k32 step j of this thread's pieces (v[k] = piece h x kPieces + k; word j = group j's values)
// into the row's A bytes: the even elements of pieces 0-3 are bytes 32j .. 32j + 15 (chunk 2j),
// the odd ones chunk 2j + 1, piece q at 4q within (the register fragment order of the wide
// kernel: same k positions, so the same products).
template <int G>
__device__ __forceinline__ void fold_step(const uint4 (&v)[Roles<G>::kPieces], int j, uint32_t lo, uint32_t hi,
                                          uint8_t* dst, int lr, int h) {
  constexpr int kPieces = Roles<G>::kPieces;
  uint32_t ev[kPieces], od[kPieces];
#pragma unroll
  for (int k = 0; k < kPieces; ++k) e2m1x8_e4m3_folded(word_of(v[k], j), lo, hi, ev[k], od[k]);
  uint8_t* e = dst + (((2 * j) ^ (lr & 7)) << 4) + 4 * kPieces * h;
  uint8_t* o = dst + (((2 * j + 1) ^ (lr & 7)) << 4) + 4 * kPieces * h;
  if constexpr (kPieces == 4) {
    *reinterpret_cast<uint4*>(e) = make_uint4(ev[0], ev[1], ev[2], ev[3]);
    *reinterpret_cast<uint4*>(o) = make_uint4(od[0], od[1], od[2], od[3]);
  } else {
    *reinterpret_cast<uint2*>(e) = make_uint2(ev[0], ev[1]);
    *reinterpret_cast<uint2*>(o) = make_uint2(od[0], od[1]);
  }
}

template <int G>
__device__ __forceinline__ void load_pieces(const Stage& st, int s, int lr, int h, uint4 (&v)[Roles<G>::kPieces]) {
#pragma unroll
  for (int k = 0; k < Roles<G>::kPieces; ++k)
    v[k] = *reinterpret_cast<const uint4*>(&st.w[s][lr][raw_piece(lr, h * Roles<G>::kPieces + k)]);
}

// Rows with a group that needs rounded tables (needs_rounding). Out of line: the common path
// stays free of calls.
template <int G>
__device__ __noinline__ void fold_rounded(const Stage& st, int s, int lr, int h, int base, uint32_t e, uint8_t* dst) {
  uint4 v[Roles<G>::kPieces];
  load_pieces<G>(st, s, lr, h, v);
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    rounded_tables(static_cast<int>((e >> (8 * j)) & 0xFFu) - base, lo, hi);
    fold_step<G>(v, j, lo, hi, dst, lr, h);
  }
}

// This thread's part of its row of a stage's block, folded into the stage's A operand. The pieces
// are loaded with the E8M0 word, ahead of the branch on it: loaded after it, the producer waited
// out two shared-memory round trips a block (ncu, bench/NOTES.md step 35: short_sb stalls at the
// word's first use and again at the pieces').
template <int G>
__device__ __forceinline__ void fold(Stage& st, int s, int lr, int h, const RowBase& rb) {
  uint4 v[Roles<G>::kPieces];
  load_pieces<G>(st, s, lr, h, v);
  const uint32_t e = st.e[s][lr][h];
  uint8_t* dst = st.a[s] + lr * 128;
  if (__builtin_expect(needs_rounding(rb, e), 0)) {
    fold_rounded<G>(st, s, lr, h, rb.base, e, dst);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo, hi;
    exact_tables(rb, (e >> (8 * j)) & 0xFFu, lo, hi);
    fold_step<G>(v, j, lo, hi, dst, lr, h);
  }
}

// A block's four k32 steps of one slice: sa = the stage's shared address (32 bits). The slice is
// a template constant and the k32 steps advance the descriptors by uniform adds, so that they stay
// in uniform registers (with the slice a runtime value each wgmma's descriptors were rebuilt in
// ordinary registers and moved over, as in the attention kernel: bench/NOTES.md step 31).
template <int N, int Slice>
__device__ __forceinline__ void block_product_of(float (&c)[N / 2], uint32_t sa) {
  wgmma_fence();
  const uint64_t da0 = wgmma_desc_sw128(sa + static_cast<uint32_t>(offsetof(Stage, a) + Slice * kSliceRows * 128)),
                 db0 = wgmma_desc_sw128(sa + static_cast<uint32_t>(offsetof(Stage, act)));
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // + 32 bytes a step: + 2 in the address field (16-byte units)
    const uint64_t da = da0 + 2 * j, db = db0 + 2 * j;
    if constexpr (N == 128)
      wgmma_m64n128k32_e4m3_ss(c, da, db, j > 0);
    else
      wgmma_m64n64k32_e4m3_ss(c, da, db, j > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(c);
}
template <int N>
__device__ __forceinline__ void block_product(float (&c)[N / 2], uint32_t sa, int slice) {
  if (slice == 0) block_product_of<N, 0>(c, sa);
  else block_product_of<N, 1>(c, sa);
}

// The consumers' own barrier (the producers may have left).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace dsv4::cuda::detail::fp8ws
