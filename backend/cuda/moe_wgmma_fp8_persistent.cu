// Routed experts at prefill sizes on FP8 warpgroup MMA, warp-specialised and persistent (sm_90a):
// moe_wgmma_fp8_ws.cu's form 2 (one producer warpgroup copying and folding, two consumer
// warpgroups running the wgmmas, the proxy fence in the consumers) with a CTA an SM walking the
// (tile, row slice) items b, b + grid, ... on one ring that runs on across items, so the producers
// fold the next item's first blocks while the consumers finish the last and store its outputs
// (form 2 pays a per-CTA prologue and epilogue that nothing overlaps: ~19% of its time, step 26's
// sampling). Step 26's two persistent tries lost 7-14% (bench/NOTES.md): their ring index and
// phase came from a running count (divisions and generic-to-shared conversions every block), each
// item's metadata was loaded where first needed (dependent round trips on the producers' path,
// the kernel's bound), and the outputs left as predicated 4-byte stores from registers. Here the
// ring cursors step by one (32-bit shared addresses formed once); an item's tile, weight fields,
// token rows and E8M0 row are loaded a chain step ahead (tile two items ahead, weight fields one
// item ahead, rows and exponents during the item before); the consumers find their rows' scales
// from the E8M0 words already in the stages; and the outputs go through the item's last stage
// (held until stored) as coalesced 16-byte stores. Gate/up's A rows are interleaved so that a
// consumer thread holds the W1 and W3 sums of one h row (A row 16 w + j of slice s = h row 32 s +
// 8 w + j % 8, W1 for j < 8, W3 for j >= 8; a row's products do not depend on its place in A).
// Same stage bytes, wgmmas, promotion and roundings as form 2: the same bits. 5-8% faster than
// form 2 at 4096-8192 tokens on an H100 (bench/NOTES.md step 29).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/moe_wgmma_fp8_ws.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::detail {
namespace {
using namespace fp8ws;

constexpr uint32_t kStageBytes = sizeof(Stage);
// Items of up to 192 tokens (W: the merged tiles of group_pairs' merge width, kMoeFp8MergeTokens):
// the codes and scales of tokens 128-191 sit in a second ring beside the stages (Stage keeps form
// 2's layout), and 4 stages fit instead of 5.
struct alignas(1024) Extra {
  uint8_t act[64 * 128];
  float xs[64];
};
constexpr uint32_t kExtraBytes = sizeof(Extra), kExtraXsOff = offsetof(Extra, xs);
template <bool W>
struct Ring {
  static constexpr int kS = W ? 4 : kStages, kAhead = kS - 2;
  // The stages, the extra ring (W), then the full and empty barriers (+ 1024 for the alignment).
  static constexpr size_t kSmem = 1024 + kS * (sizeof(Stage) + (W ? sizeof(Extra) : 0)) + 2 * kS * sizeof(uint64_t);
  static_assert(kSmem <= 227 * 1024, "one CTA's shared memory");
};
constexpr uint32_t kActOff = offsetof(Stage, act), kWOff = offsetof(Stage, w),
                   kXsOff = offsetof(Stage, xs), kEOff = offsetof(Stage, e);
constexpr int kHPitch = 64 + 4;    // the gate/up output tile: [token][64 h rows] fp32
constexpr int kYPitch = 128 + 8;   // the down output tile: [token][128 y rows] bf16
static_assert(kTok * kHPitch * 4 <= sizeof(Stage) && kTok * kYPitch * 2 <= sizeof(Stage), "outputs fit a stage");
static_assert(kTok == 128, "a stage's codes are tokens 0-127; the extra ring's 128-191");

// Registers by role (setmaxnreg; the pool is the 168 a thread the CTA is launched with). W: the
// producers' 12 code chunks and second token scale and the consumers' second accumulator set;
// ptxas spills least at 136 / 184 (32-100 bytes; 120 / 192: 76-180 bytes, 152 / 176: 72-148).
template <bool W>
struct Regs {
  static constexpr int kProducer = W ? 136 : 120, kConsumer = W ? 184 : 192;
  static_assert(Roles<1>::kProducers * kProducer + kConsumers * kConsumer <=
                    Roles<1>::kThreads * (65536 / Roles<1>::kThreads / 8 * 8),
                "setmaxnreg shares beyond the registers the CTA is launched with");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// A ring position: stage index and phase parity, stepped one block at a time (S stages).
template <int S>
struct Cursor {
  uint32_t idx = 0, phase = 0;
  __device__ __forceinline__ void next() {
    if (++idx == S) {
      idx = 0;
      phase ^= 1u;
    }
  }
};

__device__ __forceinline__ int interleaved_row(int s, int rho) { return 32 * s + 8 * (rho >> 4) + (rho & 7); }

// A producer thread's weight for an item: W1 / W3 (gate/up, by its A row) or W2 (down) of the
// tile's expert, the DevWeight fields as loaded (used a block later).
struct WRaw {
  const uint8_t *data, *scale;
  int64_t in, sc;
};
template <bool kGateUp>
__device__ __forceinline__ WRaw weight_raw(const DevWeight* tab, int expert, int lr) {
  const DevWeight& w = tab[3 * expert + (kGateUp ? (((lr >> 3) & 1) ? 2 : 0) : 1)];
  return {w.data, w.scale, w.in, w.scale_cols};
}

// The next item's per-thread loads, issued while this one runs (a round trip each where first
// needed otherwise): its weight row, gate/up's token rows (slot pairs) of the thread's code chunks
// and of its scale's token, and its E8M0 row, asked of L2 first and then read 64 bytes at a
// time into ev (16-byte words where the row allows; else read when the base is made).
struct RRaw {
  const uint8_t *w, *e;
  int32_t pair[14];  // 8 (12 for 192-token items) chunks' tokens, then the thread's token(s)
  uint4 ev[4];
  uint32_t m;  // the exponents' running maximum (4 bytes)
  bool fast;
};
// L2 prefetch of one line from this thread's own address. (The bulk prefetch, prefetch_l2_span,
// takes uniform operands: with a row per lane ptxas looped it over the 32 lanes, ~220
// instructions a warp an item; bench/NOTES.md step 32.)
__device__ __forceinline__ void prefetch_l2_line(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
template <bool kGateUp, bool W, class Args>
__device__ __forceinline__ void rows_raw(RRaw& r, const Args& a, const MoeTile& t, const WRaw& wr, int x, int s,
                                         int lr) {
  int64_t row;
  if constexpr (kGateUp) {
    row = 64 * int64_t{x} + interleaved_row(s, lr);
  } else {
    row = 128 * int64_t{x} + 64 * s + lr;
  }
  r.w = wr.data + packed_row_offset(row, wr.in / 2);
  r.e = wr.scale + row * wr.sc;
  r.fast = wr.sc % 16 == 0 && wr.sc <= 128 && (reinterpret_cast<uintptr_t>(r.e) & 15) == 0;
  r.m = 0;
  if (r.fast) {  // at most two 128-byte lines
    prefetch_l2_line(r.e);
    if (((reinterpret_cast<uintptr_t>(r.e) + wr.sc - 1) ^ reinterpret_cast<uintptr_t>(r.e)) >= 128)
      prefetch_l2_line(r.e + wr.sc - 1);
  }
  if constexpr (kGateUp) {
    constexpr int kChunks = W ? 12 : 8;
#pragma unroll
    for (int n = 0; n < kChunks + (W ? 2 : 1); ++n) {
      const int tid = static_cast<int>(threadIdx.x);
      const int tok = n < kChunks ? (tid + 128 * n) >> 3 : n == kChunks ? tid : 128 + tid;
      r.pair[n] = a.slot_pair[t.start + (tok < t.count ? tok : 0)];
    }
  }
}
// Half h of the E8M0 row (16-byte words 4h .. 4h + 3 of sc / 16) into ev, after the last half's
// maximum.
__device__ __forceinline__ void exps_half(RRaw& r, int h, int64_t sc) {
  if (!r.fast) return;
  if (h > 0)
#pragma unroll
    for (int i = 0; i < 4; ++i) r.m = __vmaxu4(__vmaxu4(r.m, __vmaxu4(r.ev[i].x, r.ev[i].y)), __vmaxu4(r.ev[i].z, r.ev[i].w));
  const int n16 = static_cast<int>(sc / 16);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    r.ev[i] = 4 * h + i < n16 ? __ldg(reinterpret_cast<const uint4*>(r.e) + 4 * h + i) : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ RowBase row_base_raw(RRaw& r, int64_t sc) {
  if (!r.fast) return row_base_thread(r.e, sc);
  exps_half(r, 2, 0);  // the second half's maximum (loads nothing)
  return row_base_of(r.m);
}

// What a producer thread copies for an item (built from RRaw when its first block is copied).
struct PItem {
  const uint8_t *w, *e;
  uint32_t off[12];  // the codes' offsets (token row x in + 16 chunk) of its chunks, N / 16 of them
  int32_t xrow;      // its token's activation row (its scale; threads < min(N, 128))
  int32_t xrow2;     // 192-token items: token 128 + thread's (threads < 64)
  int n;             // item tokens: 64, 128 or (W) 192
};
__device__ __forceinline__ int item_tokens(int count) { return count <= 64 ? 64 : count <= 128 ? 128 : 192; }
template <bool kGateUp, bool W, class Args>
__device__ __forceinline__ PItem make_item(const Args& a, const MoeTile& t, const RRaw& r, int64_t in) {
  constexpr int kChunks = W ? 12 : 8;
  PItem p;
  p.w = r.w;
  p.e = r.e;
  p.n = item_tokens(t.count);
  auto act = [&](int n, int tok) -> int32_t {
    if constexpr (kGateUp) {
      return r.pair[n] / a.K;
    } else {
      return t.start + (tok < t.count ? tok : 0);
    }
  };
#pragma unroll
  for (int n = 0; n < kChunks; ++n) {
    const int i = static_cast<int>(threadIdx.x) + 128 * n;
    p.off[n] = static_cast<uint32_t>(act(n, i >> 3) * in + 16 * (i & 7));
  }
  p.xrow = act(kChunks, static_cast<int>(threadIdx.x));
  if constexpr (W) p.xrow2 = act(kChunks + 1, 128 + static_cast<int>(threadIdx.x));
  return p;
}

// Block kb of an item into the stage at shared address sa (and, for 192 tokens, the extra ring's
// entry at xa): the thread's code chunks and token scale(s), its row's four packed pieces and
// E8M0 word; one cp.async group.
template <int N>
__device__ __forceinline__ void pcopy(uint32_t sa, uint32_t xa, const PItem& p, const uint8_t* xq, const float* xs,
                                      int64_t ldxs, int kb, int s, int lr) {
  const int tid = threadIdx.x;
  const uint8_t* xb = xq + kb * 128;
#pragma unroll
  for (int n = 0; n < N / 16; ++n) {
    const int i = tid + 128 * n, t = i >> 3, c = i & 7;  // chunks n >= 8: tokens 128-191, t & 7 as theirs
    const uint32_t row = N == 192 && n >= 8 ? xa + (t - 128) * 128 : sa + kActOff + t * 128;
    cp_async16(row + ((c ^ (t & 7)) << 4), xb + p.off[n]);
  }
  if (tid < N) cp_async4(sa + kXsOff + 4 * tid, xs + kb * ldxs + p.xrow);
  if (N == 192 && tid < 64) cp_async4(xa + kExtraXsOff + 4 * tid, xs + kb * ldxs + p.xrow2);
  const uint8_t* w = p.w + static_cast<int64_t>(kb) * kPackedBlockStride;
  const uint32_t wrow = sa + kWOff + (64 * s + lr) * 64;
#pragma unroll
  for (int k = 0; k < 4; ++k) cp_async16(wrow + raw_piece(lr, k), w + 16 * k);
  cp_async4(sa + kEOff + (64 * s + lr) * 8, p.e + kb * 4);
  cp_async_commit();
}

__device__ __forceinline__ void cp_async_wait_upto3(int n) {
  if (n >= 3)
    cp_async_wait<3>();
  else if (n == 2)
    cp_async_wait<2>();
  else if (n == 1)
    cp_async_wait<1>();
  else
    cp_async_wait<0>();
}

// The producer's state across items: ring cursors (copy, fold), the item being folded and its
// row base, the next item's tile and weight fields (loaded an item ahead), the next item's loads
// and copy list once made.
template <bool W>
struct PState {
  Cursor<Ring<W>::kS> cc, fc;
  PItem cur, nxt;
  RowBase rb, rb_next;
  MoeTile t1;
  WRaw w1;
  RRaw r1;
};

// One block of the fold: this thread's copies of block kb have landed (A groups may still fly),
// its part of the row is folded into the stage, the full barrier told.
template <bool W>
__device__ __forceinline__ void fold_block(PState<W>& ps, Stage* st, uint32_t full0, int A, int s, int lr) {
  cp_async_wait_upto3(A);
  fold<1>(st[ps.fc.idx], s, lr, 0, ps.rb);
  mbar_arrive(full0 + 8 * ps.fc.idx);
  ps.fc.next();
}

// One item's blocks: while kb < nkb - A, copy block kb + A of this item (N its tile tokens);
// from there the next item's first blocks (its N at run time) or nothing. The next item's loads
// go out at fixed blocks (rows at 1, the exponents' halves at nkb - A - 2 and - 1, clamped), one
// compare a block; its copy list and row base are made at nkb - A, between the two loops.
// Block kb of item p into ring entry idx (its stage at sa0 + idx stages, its extra at xa0 + idx
// extras), by p's width.
template <bool W>
__device__ __forceinline__ void pcopy_any(uint32_t sa0, uint32_t xa0, uint32_t idx, const PItem& p,
                                          const uint8_t* xq, const float* xs, int64_t ldxs, int kb, int s, int lr) {
  const uint32_t sa = sa0 + idx * kStageBytes, xa = xa0 + idx * kExtraBytes;
  if (p.n == 64)
    pcopy<64>(sa, xa, p, xq, xs, ldxs, kb, s, lr);
  else if (!W || p.n == 128)
    pcopy<128>(sa, xa, p, xq, xs, ldxs, kb, s, lr);
  else
    pcopy<192>(sa, xa, p, xq, xs, ldxs, kb, s, lr);
}

template <int N, bool kGateUp, bool W, class Args>
__device__ __forceinline__ void produce_item(const Args& a, PState<W>& ps, Stage* st, uint32_t sa0, uint32_t xa0,
                                             uint32_t full0, uint32_t empty0, int nitem, bool has_next, int slices,
                                             int nkb, int A, int64_t in, const uint8_t* xq, const float* xs,
                                             int64_t ldxs) {
  const int s = threadIdx.x >> 6, lr = threadIdx.x & 63;
  const int d_at = nkb - A, c_at = min(1, d_at);
  const int e0 = max(c_at, d_at - 2), e1 = max(c_at, d_at - 1);
  auto at = [&](int e) { return e == 0 ? c_at : e == 1 ? e0 : e1; };  // selects, not an indexed array
  int ev = 0;
  auto events_up_to = [&](int kb) {  // the next item's loads due at or before block kb
    for (; ev < 3 && at(ev) <= kb; ++ev) {
      if (ev == 0)
        rows_raw<kGateUp, W>(ps.r1, a, ps.t1, ps.w1, nitem % slices, s, lr);
      else
        exps_half(ps.r1, ev - 1, ps.w1.sc);
    }
  };
  int next_at = has_next ? c_at : nkb;
  for (int kb = 0; kb < d_at; ++kb) {
    if (kb == next_at) {
      events_up_to(kb);
      next_at = ev < 3 ? at(ev) : nkb;
    }
    mbar_wait(empty0 + 8 * ps.cc.idx, ps.cc.phase ^ 1u);  // first lap: the phase before the first completes at once
    pcopy<N>(sa0 + ps.cc.idx * kStageBytes, xa0 + ps.cc.idx * kExtraBytes, ps.cur, xq, xs, ldxs, kb + A, s, lr);
    ps.cc.next();
    fold_block(ps, st, full0, A, s, lr);
  }
  if (has_next) {
    events_up_to(nkb);
    ps.nxt = make_item<kGateUp, W>(a, ps.t1, ps.r1, in);
    ps.rb_next = row_base_raw(ps.r1, ps.w1.sc);
  }
  for (int kb = d_at; kb < nkb; ++kb) {
    if (has_next) {  // the next item's first blocks
      mbar_wait(empty0 + 8 * ps.cc.idx, ps.cc.phase ^ 1u);
      pcopy_any<W>(sa0, xa0, ps.cc.idx, ps.nxt, xq, xs, ldxs, kb - d_at, s, lr);
      ps.cc.next();
    } else {
      cp_async_commit();
    }
    fold_block(ps, st, full0, A, s, lr);
  }
}

// The producers: every item's blocks in ring order (produce_item), the next item's metadata
// loaded a chain step ahead so that no round trip stalls the fold: its tile two items ahead,
// its weight's fields one item ahead, its rows and exponents during the item before.
template <bool W, class Args>
__device__ __forceinline__ void produce_persistent(const Args& a, Stage* st, uint32_t sa0, uint32_t xa0,
                                                   uint32_t full0, uint32_t empty0, int slices, int items, int nkb,
                                                   int64_t in) {
  constexpr bool kGateUp = std::is_same_v<Args, Fp8GateUpArgs>;
  const int s = threadIdx.x >> 6, lr = threadIdx.x & 63, G = gridDim.x;
  const int A = min(Ring<W>::kAhead, nkb - 1);
  const uint8_t* xq;
  const float* xs;
  int64_t ldxs;
  if constexpr (kGateUp) {
    xq = a.xq, xs = a.xs, ldxs = a.ldxs;
  } else {
    xq = a.hq, xs = a.hs, ldxs = a.ldhs;
  }
  int item = blockIdx.x;
  PState<W> ps;
  {  // the first item at once; the next one's tile and weight fields
    const MoeTile t = a.tiles[item / slices];
    const WRaw w0 = weight_raw<kGateUp>(a.tab, t.expert, lr);
    rows_raw<kGateUp, W>(ps.r1, a, t, w0, item % slices, s, lr);
    exps_half(ps.r1, 0, w0.sc);
    exps_half(ps.r1, 1, w0.sc);
    ps.cur = make_item<kGateUp, W>(a, t, ps.r1, in);
    ps.rb = row_base_raw(ps.r1, w0.sc);
    ps.t1 = item + G < items ? a.tiles[(item + G) / slices] : t;
    ps.w1 = weight_raw<kGateUp>(a.tab, ps.t1.expert, lr);
  }
  pdl_wait();
  for (int b = 0; b < A; ++b) {
    mbar_wait(empty0 + 8 * ps.cc.idx, ps.cc.phase ^ 1u);
    pcopy_any<W>(sa0, xa0, ps.cc.idx, ps.cur, xq, xs, ldxs, b, s, lr);
    ps.cc.next();
  }
  for (;;) {
    const int nitem = item + G;
    const bool has_next = nitem < items;
    const MoeTile t2 = nitem + G < items ? a.tiles[(nitem + G) / slices] : ps.t1;  // used an item later
    if (ps.cur.n == 64)
      produce_item<64, kGateUp>(a, ps, st, sa0, xa0, full0, empty0, nitem, has_next, slices, nkb, A, in, xq, xs, ldxs);
    else if (!W || ps.cur.n == 128)
      produce_item<128, kGateUp>(a, ps, st, sa0, xa0, full0, empty0, nitem, has_next, slices, nkb, A, in, xq, xs, ldxs);
    else
      produce_item<192, kGateUp>(a, ps, st, sa0, xa0, full0, empty0, nitem, has_next, slices, nkb, A, in, xq, xs, ldxs);
    if (!has_next) break;
    ps.cur = ps.nxt;
    ps.rb = ps.rb_next;
    item = nitem;
    ps.t1 = t2;
    ps.w1 = weight_raw<kGateUp>(a.tab, ps.t1.expert, lr);
  }
  cp_async_wait<0>();
}

// The n64 wgmmas of a 192-token item's tokens 128-191: the stage's folded A of the slice against
// the extra ring entry's codes at xa (block_product_of's form with another B).
template <int Slice>
__device__ __forceinline__ void block_product_extra_of(float (&c)[32], uint32_t sa, uint32_t xa) {
  wgmma_fence();
  const uint64_t da0 = wgmma_desc_sw128(sa + static_cast<uint32_t>(offsetof(Stage, a) + Slice * kSliceRows * 128)),
                 db0 = wgmma_desc_sw128(xa);
#pragma unroll
  for (int j = 0; j < 4; ++j) wgmma_m64n64k32_e4m3_ss(c, da0 + 2 * j, db0 + 2 * j, j > 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(c);
}

// The outputs of NN tile columns from col0 through the item's last stage (out): gate/up h =
// SwiGLU(W1 sums, W3 sums) [token][64] fp32, down y [token][128] bf16; the same products and
// roundings as stash_rows + store_h / store_y. Ends with the tile read back (the caller's
// barrier before the stage is written again).
template <int NN, class Args>
__device__ __forceinline__ void emit_outputs(const Args& a, unsigned char* out, const float (&acc)[NN / 2], float s0,
                                             float s1, const MoeTile& t, int x, int col0) {
  constexpr bool kGateUp = std::is_same_v<Args, Fp8GateUpArgs>;
  const int ct = threadIdx.x - 128, slice = ct >> 7, wt = ct & 127, q = wt & 3, lane = wt & 31;
  const int r = 16 * (wt >> 5) + (lane >> 2);
  if constexpr (kGateUp) {
    float* T = reinterpret_cast<float*>(out);
    const int o = interleaved_row(slice, r);
#pragma unroll
    for (int i = 0; i < NN / 2; ++i) {
      if (i & 2) continue;  // acc[i]: W1 (A row r), acc[i + 2]: W3 (A row r + 8) of the same column
      const int col = 8 * (i >> 2) + 2 * q + (i & 1);
      T[col * kHPitch + o] = swiglu_clamped(acc[i] * s0, acc[i + 2] * s1, a.limit);
    }
    consumers_sync();
    const int64_t r0 = 64 * int64_t{x};
#pragma unroll
    for (int u = 0; u < NN / 16; ++u) {
      const int tok = (ct >> 4) + 16 * u;
      if (col0 + tok < t.count)
        *reinterpret_cast<float4*>(&a.H[static_cast<int64_t>(t.start + col0 + tok) * a.I + r0 + 4 * (ct & 15)]) =
            *reinterpret_cast<const float4*>(&T[tok * kHPitch + 4 * (ct & 15)]);
    }
  } else {
    int32_t pair[NN / 16];  // the rows of Y the stores go to, asked for before the tile is written
#pragma unroll
    for (int u = 0; u < NN / 16; ++u) {
      const int tok = col0 + (ct >> 4) + 16 * u;
      pair[u] = tok < t.count ? a.slot_pair[t.start + tok] : 0;
    }
    __nv_bfloat16* T = reinterpret_cast<__nv_bfloat16*>(out);
#pragma unroll
    for (int i = 0; i < NN / 2; ++i) {
      const int col = 8 * (i >> 2) + 2 * q + (i & 1), row = 64 * slice + r + (i & 2) * 4;
      T[col * kYPitch + row] = __float2bfloat16_rn(acc[i] * (i & 2 ? s1 : s0));
    }
    consumers_sync();
    const int64_t r0 = 128 * int64_t{x};
#pragma unroll
    for (int u = 0; u < NN / 16; ++u) {
      const int tok = (ct >> 4) + 16 * u;
      if (col0 + tok < t.count)
        *reinterpret_cast<uint4*>(&a.Y[static_cast<int64_t>(pair[u]) * a.d + r0 + 8 * (ct & 15)]) =
            *reinterpret_cast<const uint4*>(&T[tok * kYPitch + 8 * (ct & 15)]);
    }
  }
}

// A consumer thread's item: its slice's sums over all blocks (every stage released after its
// block but the last), its rows' scales from the stages' E8M0 words, then the outputs through
// the last stage (emit_outputs). A 192-token item (W) runs an n128 wgmma set on the stage's codes
// and an n64 set on the extra ring's, both on the slice's one folded A: each column's products
// and promotion are those of its 128- or 64-token tile, so the same bits; its outputs go out in
// two passes (the stage holds 128 columns of them).
template <int N, bool W, class Args>
__device__ __forceinline__ void consume_item(const Args& a, Stage* st, uint32_t sa0, uint32_t xa0, uint32_t full0,
                                             uint32_t empty0, Cursor<Ring<W>::kS>& cc, const MoeTile t, int x,
                                             int nkb, int next_item, int slices, MoeTile& tn) {
  constexpr int N1 = N < 128 ? N : 128;
  constexpr bool kTwo = N == 192;
  const int ct = threadIdx.x - 128, slice = ct >> 7, wt = ct & 127, lane = wt & 31;
  const int r = 16 * (wt >> 5) + (lane >> 2);
  float acc[N1 / 2], acc2[kTwo ? 32 : 1];
#pragma unroll
  for (int i = 0; i < N1 / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < (kTwo ? 32 : 1); ++i) acc2[i] = 0.f;
  uint32_t m0 = 0, m1 = 0;
  for (int kb = 0;; ++kb) {
    mbar_wait(full0 + 8 * cc.idx, cc.phase);
    fence_proxy_async_smem();  // what the producers wrote, to the wgmmas
    const uint32_t sa = sa0 + cc.idx * kStageBytes;
    float c[N1 / 2];
    block_product<N1>(c, sa, slice);
    const Stage& S = st[cc.idx];
    promote<N1>(c, S.xs, acc);
    if constexpr (kTwo) {
      const uint32_t xa = xa0 + cc.idx * kExtraBytes;
      float c2[32];
      if (slice == 0)
        block_product_extra_of<0>(c2, sa, xa);
      else
        block_product_extra_of<1>(c2, sa, xa);
      const Extra& X = reinterpret_cast<const Extra*>(st + Ring<W>::kS)[cc.idx];
      promote<64>(c2, X.xs, acc2);
    }
    m0 = __vmaxu4(m0, S.e[slice][r][0]);
    m1 = __vmaxu4(m1, S.e[slice][r + 8][0]);
    if (kb + 1 == nkb) break;
    __syncwarp();
    if (lane == 0) mbar_arrive(empty0 + 8 * cc.idx);
    cc.next();
  }
  if (next_item >= 0) tn = a.tiles[next_item / slices];  // the next item's tile, read during the outputs
  const float s0 = row_base_of(m0).scale * kE2m1E4m3Unscale, s1 = row_base_of(m1).scale * kE2m1E4m3Unscale;
  consumers_sync();  // both warpgroups' wgmmas on the last stage are done: it takes the outputs
  unsigned char* out = reinterpret_cast<unsigned char*>(&st[cc.idx]);
  emit_outputs<N1>(a, out, acc, s0, s1, t, x, 0);
  if constexpr (kTwo) {
    consumers_sync();  // the first pass's tile is read
    emit_outputs<64>(a, out, acc2, s0, s1, t, x, 128);
  }
  __syncwarp();
  if (lane == 0) mbar_arrive(empty0 + 8 * cc.idx);  // this warp's reads of the outputs are done
  cc.next();
}

template <bool W, class Args>
__device__ __forceinline__ void consume_persistent(const Args& a, Stage* st, uint32_t sa0, uint32_t xa0,
                                                   uint32_t full0, uint32_t empty0, int slices, int items, int nkb) {
  const int G = gridDim.x;
  Cursor<Ring<W>::kS> cc;
  MoeTile t = a.tiles[blockIdx.x / slices];
  for (int item = blockIdx.x; item < items; item += G) {
    const int next = item + G < items ? item + G : -1;
    MoeTile tn = t;
    if (t.count <= 64)
      consume_item<64, W>(a, st, sa0, xa0, full0, empty0, cc, t, item % slices, nkb, next, slices, tn);
    else if (!W || t.count <= 128)
      consume_item<128, W>(a, st, sa0, xa0, full0, empty0, cc, t, item % slices, nkb, next, slices, tn);
    else
      consume_item<192, W>(a, st, sa0, xa0, full0, empty0, cc, t, item % slices, nkb, next, slices, tn);
    t = tn;
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The persistent form: grid <= SMs x 1 CTA, items = tiles x row slices (adjacent items: the same
// tile's slices, so the CTAs at work share the tile's codes in L2). W: tiles of up to 192 tokens.
template <class Args, bool W>
__global__ void __launch_bounds__(Roles<1>::kThreads, 1) fp8_ws_persistent_kernel(const Args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kGateUp = std::is_same_v<Args, Fp8GateUpArgs>;
  constexpr int kS = Ring<W>::kS;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  Stage* st = reinterpret_cast<Stage*>(smem);
  const size_t extras = W ? kS * sizeof(Extra) : 0;  // the extra ring after the stages
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kS * sizeof(Stage) + extras);  // full, then empty
  if (threadIdx.x == 0) {
    for (int s = 0; s < kS; ++s) {
      mbar_init(&bars[s], Roles<1>::kProducers);
      mbar_init(&bars[kS + s], kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int slices = static_cast<int>(kGateUp ? a.I / 64 : a.d / 128);
  const int items = *a.n_tiles * slices;
  const int64_t in = kGateUp ? a.d : a.I;
  const int nkb = static_cast<int>(in / 128);
  const uint32_t sa0 = smem_addr(smem), xa0 = sa0 + kS * kStageBytes, full0 = smem_addr(bars), empty0 = full0 + 8 * kS;
  if (static_cast<int>(blockIdx.x) >= items) return;
  // Registers by role (Regs).
  if (threadIdx.x < Roles<1>::kProducers) {
    setmaxnreg_dec<Regs<W>::kProducer>();
    produce_persistent<W>(a, st, sa0, xa0, full0, empty0, slices, items, nkb, in);
  } else {
    setmaxnreg_inc<Regs<W>::kConsumer>();
    consume_persistent<W>(a, st, sa0, xa0, full0, empty0, slices, items, nkb);
  }
#endif
}

}  // namespace

Fp8TileKernels fp8_ws_persistent_kernels(bool wide) {
  if (wide)
    return {fp8_ws_persistent_kernel<Fp8GateUpArgs, true>, fp8_ws_persistent_kernel<Fp8DownArgs, true>,
            Roles<1>::kThreads, Ring<true>::kSmem, true, kMoeFp8MergeTokens};
  return {fp8_ws_persistent_kernel<Fp8GateUpArgs, false>, fp8_ws_persistent_kernel<Fp8DownArgs, false>,
          Roles<1>::kThreads, Ring<false>::kSmem, true};
}

}  // namespace dsv4::cuda::detail
