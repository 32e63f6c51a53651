// Shared-KV sparse attention with bf16 keys on Hopper's warpgroup MMA (wgmma, sm_90a): the Fast
// kernel for a model that stores its keys as bf16 (ops_attention_mma.cu's mma.sync kernel takes
// fp32 keys and other builds). One row's 64 heads against its key list, K = V, in tiles of 64 keys:
// S = Q K^T (64 heads x 64 keys over 512 dims) and O += P V (64 heads x 512 columns over the 64
// keys). The mma.sync kernel spent ~4.5 µs per 32-key tile at any batch: Q re-read through
// ldmatrix for every tile, 32 KB of partial scores through shared memory and three barriers, a
// CTA-serial cost that neither the bf16 keys nor a deeper load pipeline removed (bench/NOTES.md
// step 13). Here the tensor cores read Q and the keys from shared memory themselves (128-byte
// swizzle), and the scores stay in registers.
//
// CTA: two warpgroups. Warpgroup w scores keys 32w .. 32w + 31 of the tile for all 64 heads
// (m64n32k16, both operands from shared memory) and owns output columns 256w .. 256w + 255
// (4 x m64n64k16, P from registers, V read MN-major from the same key tile). The heads' running
// maxima are exchanged through shared memory (both warpgroups then compute the same maximum and
// rescale factor, so each keeps a partial sum of its own keys' probabilities, added at the end);
// the probabilities go through shared memory once (8 KB) for the other warpgroup's product. A
// tile's S is issued before the previous tile's P V, so that its softmax's first half runs while
// the tensor cores do that P V; the next tile's keys load by cp.async from the maxima exchange on
// (two 64 KB buffers beside Q's 64 KB: no room for a third). The output leaves through shared
// memory by bulk copies (or, with cuda::AttnFp8Out, as wo_a's FP8 codes: fp8_epilogue). Same
// splits and flash-decoding triples as the mma.sync kernel (attention_merge_kernel merges them).
//
// Measured (H100, bench/NOTES.md step 13): 256 / 4096 rows of 640 keys 188 / 2716 µs (mma.sync,
// bf16 keys) -> 114 / 1348 µs. ncu stall sampling at 4096 rows: no phase dominates (Q staging
// 14%, S issue 14%, key fetch issue 12%, the maxima barrier 11%, epilogue 11%, softmax 16%):
// with 8 warps per SM the phases are latency-bound; the next step is a producer warpgroup.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/bf16_fragments.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/fp8_quant.cuh"
#include "backend/cuda/head_norm_rope.cuh"
#include "backend/cuda/ops_attention_keys.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kH = kAttnMmaHeads, kD = kAttnMmaDim;
constexpr int kKeys = 64;                  // keys per tile
constexpr int kThreads = 256;              // two warpgroups
constexpr int kRegion = kKeys * 128;       // bytes of one 64-dim column block of a key tile
constexpr int kTileBytes = kKeys * kD * 2;  // 64 KB
constexpr int kPPitch = kKeys + 8;         // bf16 per probability row (ldmatrix without bank conflicts)
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kOPitch = kD + 4;            // floats per staged output row (2-way bank conflicts at most)
constexpr int kMaxRotPairs = 64;           // rotary pairs a head (FP8 epilogue)

struct alignas(1024) Smem {  // swizzled operands first: their 1024-byte atoms stay aligned
  uint8_t q[kH * kD * 2];           // Q as bf16: 8 regions of 64 dims x 64 heads x 128 bytes
  uint8_t k[2][kTileBytes];         // key tiles: 8 regions of 64 dims x 64 keys x 128 bytes
  __nv_bfloat16 p[kH][kPPitch];     // this tile's probabilities
  float mx[2][kH];                  // per warpgroup: the heads' maxima over its 32 keys
  float lsum[2][kH];                // per warpgroup: the heads' probability sums (at the end)
  const float* kp[2][kKeys];        // key rows of this tile and the next (nullptr: masked / past the end)
  uint32_t valid[2][2];             // the same as bits: word w for keys 32w .. 32w + 31
  float2 rot[kMaxRotPairs];         // FP8 epilogue, q's norm: (cos, -sin) of the row's rotary pairs
};

// What one launch's rows take beside q and the keys: their rotary pairs (positions pos[r],
// inv_freq) for the FP8 epilogue (cuda::AttnFp8Out: codes of row r at q + r H D, scales at
// scales[kb * stride + r], kb the 128-channel block of the row; q == nullptr: o as fp32) and for
// q's norm (cuda::AttnQNorm, eps; the kernel's kNormQ).
struct RowExtras {
  uint8_t* q = nullptr;
  float* scales = nullptr;
  int64_t stride = 0;
  const float* inv_freq = nullptr;
  const int64_t* pos = nullptr;
  int pairs = 0;
  float eps = 0.f;
};

// The output rows are staged over the key tiles and P (contiguous, free after the last P V).
static_assert(offsetof(Smem, p) == offsetof(Smem, k) + sizeof(Smem::k) &&
                  sizeof(Smem::k) + sizeof(Smem::p) >= sizeof(float) * kH * kOPitch,
              "output staging must fit the key tiles and P");

// Byte offset of 16-byte chunk c (of 64) of row r in a swizzled operand of 8 regions.
__device__ __forceinline__ uint32_t sw_offset(int r, int c, int rows) {
  return (c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// 16-byte cp.async that reads n (16 or 0) bytes and zero-fills the rest: a missing key's row
// becomes zeros without a branch or a generic-proxy store (src must still be a valid address).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, uint32_t n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(n) : "memory");
}

// cp.async copies of the tile whose key rows are kp (bf16, 1 KB each) into dst; zeros for missing
// keys (read from `dummy`, any valid address, with 0 bytes). One commit group. Thread t copies
// chunk c = t % 64 of keys j0 + 4 i (j0 = t / 64): the swizzled offset is one of two per-thread
// values (i even / odd) plus 512 i.
__device__ __forceinline__ void fetch_tile(uint8_t* dst, const float* const* kp, const void* dummy) {
  constexpr int chunks = kD * 2 / 16;  // per key
  constexpr int step = kThreads / chunks;  // keys between a thread's copies
  static_assert(step == 4, "two swizzle phases per thread");
  const int c = threadIdx.x % chunks, j0 = threadIdx.x / chunks;
  uint8_t* const d0 = dst + sw_offset(j0, c, kKeys);
  uint8_t* const d1 = dst + sw_offset(j0 + step, c, kKeys) - step * 128;
#pragma unroll
  for (int i = 0; i < kKeys / step; ++i) {
    const float* p = kp[j0 + step * i];
    cp_async16_zfill((i & 1 ? d1 : d0) + step * 128 * i, p ? reinterpret_cast<const uint8_t*>(p) + 16 * c : dummy,
                     p ? 16u : 0u);
  }
  cp_async_commit();
}

// 2^x (ex2.approx: the probabilities are rounded to bf16 right after).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The FP8 epilogue (no splits): O's rows normalised, inverse-rotated and quantised straight from
// the accumulators, codes out through shared memory by bulk copies. A thread holds, of head
// hr[e], columns 256 wg + 64 n + 8 j + 2 qd (+1) (acc[n][4 j + 2 e] and the next): a rotary pair
// whole, and 32 values of each 128-block 2 wg + nb (n = 2 nb, 2 nb + 1), the other 96 in its
// quad. So a block's amax is 32 values and two shuffles (one warp a block over values staged in
// shared memory took ~6 us a CTA of shuffle chains). The same values, rotation, scale and codes
// as act_quant_fp8_inverse_rope of the fp32 output: its bits.
// The values are made once, in place in acc (dead after): making them again for the codes, and a
// per-lane rotation test, had been ~1/3 of a 2-tile row's instructions (ncu, bench/NOTES.md step
// 31). With the rotated columns starting at a multiple of 8 (pairs % 4 == 0, attention_fp8_out_ok)
// a column block j rotates whole or not at all: the test is warp-uniform.
constexpr int kCodePitch = kD + 16;  // bytes per staged code row (rows 4 banks apart)
__device__ __forceinline__ float clamp448(float v) { return fminf(fmaxf(v, -448.f), 448.f); }  // to_e4m3's
__device__ __forceinline__ void fp8_epilogue(float (&acc)[4][32], Smem& S, const RowExtras& f8, const float (&m)[2],
                                             const float* sink, int64_t r, int64_t H, int64_t h0, int wg,
                                             const int (&hr)[2], int qd) {
  // Columns from tail rotate; rel: where that is in this warpgroup's 256 (a shuffle: known uniform).
  const int rel = __shfl_sync(0xFFFFFFFFu, kD - 2 * f8.pairs - 256 * wg, 0);
  uint8_t(*const cst)[kCodePitch] = reinterpret_cast<uint8_t(*)[kCodePitch]>(S.k[0]);
  float mul[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) mul[e] = 1.0f / (S.lsum[0][hr[e]] + S.lsum[1][hr[e]] + expf(sink[h0 + hr[e]] - m[e]));
  float amax[2][2] = {};  // [e][nb]
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const bool rotates = 64 * n + 8 * j >= rel;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float a = acc[n][4 * j + 2 * e] * mul[e], b = acc[n][4 * j + 2 * e + 1] * mul[e];
        if (rotates) {
          const float2 rt = S.rot[(64 * n + 8 * j - rel) / 2 + qd];
          rope_rotate(a, b, rt.x, rt.y);
        }
        acc[n][4 * j + 2 * e] = a;
        acc[n][4 * j + 2 * e + 1] = b;
        amax[e][n / 2] = fmaxf(amax[e][n / 2], fmaxf(fabsf(a), fabsf(b)));
      }
    }
  float sc[2][2];
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      float x = amax[e][nb];
      x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
      sc[e][nb] = pow2_scale(x);
      const int64_t kb = (h0 + hr[e]) * (kD / 128) + 2 * wg + nb;  // the block among the row's
      if (qd == 0) f8.scales[kb * f8.stride + r] = sc[e][nb];
    }
#pragma unroll
  for (int e = 0; e < 2; ++e)
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float inv = 1.0f / sc[e][n / 2];
#pragma unroll
      for (int j = 0; j < 8; ++j) {  // two codes by one conversion: to_e4m3's each (first value lowest)
        const float2 v = make_float2(clamp448(acc[n][4 * j + 2 * e] * inv), clamp448(acc[n][4 * j + 2 * e + 1] * inv));
        *reinterpret_cast<uint16_t*>(&cst[hr[e]][256 * wg + 64 * n + 8 * j + 2 * qd]) =
            static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3));
      }
    }
  fence_proxy_async_smem();  // the codes visible to the bulk copies
  __syncthreads();
  const int tid = threadIdx.x;
  if (tid < kH) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                     f8.q + (r * H + h0 + tid) * kD),
                 "r"(smem_addr(&cst[tid][0])), "n"(kD) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // shared memory read before exit
  }
}

// kBf16Q: q stored as bf16 (rms_norm_rope's bf16 output), copied by cp.async into the swizzle
// with the first key tile (no register round trip, half the bytes of fp32 q). kNormQ (bf16 q
// only): q not yet normalised; each head's RMS norm and RoPE applied in the swizzle with
// rms_norm_rope's arithmetic (head_norm_rope.cuh), so q is read once instead of in its own pass.
template <bool kBf16Q, bool kNormQ>
__global__ void __launch_bounds__(kThreads, 1)
    attention_wgmma_kernel(const float* __restrict__ q, const AttnRow* __restrict__ rows, int64_t H, int64_t W,
                           const float* __restrict__ sink, float scale, int nsplit, float* __restrict__ o,
                           float* __restrict__ partial, float2* __restrict__ ml, RowExtras f8) {
  static_assert(kBf16Q || !kNormQ, "q's norm in the kernel takes bf16 q");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(align_1024(smem_raw));
  const int64_t r = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.x) * kH;
  const int split = blockIdx.z;
  // wg through a shuffle: the compiler then knows it is warp-uniform and keeps the descriptors
  // built from it in uniform registers.
  const int tid = threadIdx.x, wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wq = (tid >> 5) & 3, lane = tid & 31,
            g = lane >> 2, qd = lane & 3;
  if ((f8.q || kNormQ) && tid < f8.pairs) {  // act_quant_fp8_inverse_rope's table: the same fp32 angle, cosf, sinf
    const float ang = static_cast<float>(f8.pos[r]) * f8.inv_freq[tid];
    S.rot[tid] = make_float2(cosf(ang), -sinf(ang));
  }
  const AttnRow row = rows[r];
  const SplitKeys sk = split_keys(row, W, nsplit, split, kKeys);
  const int64_t lo = sk.lo, nwin = sk.nwin, kb = sk.kb, ke = sk.ke;
  if (kb >= ke && partial) return mark_empty_split(ml, r, H, h0, nsplit, split, kH);
  constexpr int64_t kStride = kD / 2;  // float slots per stored bf16 key
  auto key_at = [&](int64_t j) { return j < ke ? key_ptr(row, j, lo, nwin, W, kStride) : nullptr; };
  // Key rows of a tile into slot b (threads < 64, warps 0 and 1: one ballot word each).
  auto lookup = [&](int b, int64_t j0) {
    if (tid < kKeys) {
      const float* p = key_at(j0 + tid);
      S.kp[b][tid] = p;
      const uint32_t bits = __ballot_sync(0xFFFFFFFFu, p != nullptr);
      if (lane == 0) S.valid[b][tid >> 5] = bits;
    }
  };
  // Q (fp32) -> bf16 in the swizzle, in two rounds of sixteen float4 loads per thread; the first
  // round's loads go out before the first tile's key lookup (whose sel reads are global too).
  constexpr int kQRound = 16, kQRounds = kH * kD / 4 / kThreads / kQRound;
  const float4* qsrc = reinterpret_cast<const float4*>(q + (r * H + h0) * kD);
  float4 qv[kQRound];
  auto q_load = [&](int round) {
#pragma unroll
    for (int b = 0; b < kQRound; ++b) qv[b] = __ldg(qsrc + tid + (round * kQRound + b) * kThreads);
  };
  auto q_store = [&](int round) {
#pragma unroll
    for (int b = 0; b < kQRound; ++b) {
      const int i = tid + (round * kQRound + b) * kThreads, h = i / (kD / 4), d = 4 * (i % (kD / 4));
      *reinterpret_cast<uint2*>(S.q + sw_offset(h, d / 8, kH) + 2 * (d % 8)) =
          make_uint2(pack_bf16(qv[b].x, qv[b].y), pack_bf16(qv[b].z, qv[b].w));
    }
  };
  // kNormQ: q's norm + RoPE in place in the swizzle once its copies landed (under the first key
  // tile's): warp w takes heads 8w .. 8w + 7, a lane the 4-value chunks lane + 32 k of each, as
  // rms_norm_rope_kernel's lanes (the same summation order).
  auto norm_q_in_place = [&] {
    const int warp = tid >> 5;
    const auto cos_sin = [&](int64_t i) { return make_float2(S.rot[i].x, -S.rot[i].y); };
#pragma unroll 2
    for (int b = 0; b < 8; ++b) {
      const int h = 8 * warp + b;
      uint2* chunk[kD / 4 / 32];
      float4 u[kD / 4 / 32];
      double ss = 0.0;
#pragma unroll
      for (int k = 0; k < kD / 4 / 32; ++k) {
        const int c = lane + 32 * k;
        chunk[k] = reinterpret_cast<uint2*>(S.q + sw_offset(h, c >> 1, kH) + 8 * (c & 1));
        u[k] = bf16x4_to_float4(*chunk[k]);
        ss = add_squares(ss, u[k]);
      }
      const float inv = inv_rms(warp_sum(ss), kD, f8.eps);
#pragma unroll
      for (int k = 0; k < kD / 4 / 32; ++k) {
        float v[4];
        norm_rope4(u[k], make_float4(1.f, 1.f, 1.f, 1.f), inv, lane + 32 * k, kD - 2 * f8.pairs, cos_sin, v);
        *chunk[k] = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
      }
    }
  };
  if constexpr (kBf16Q) {
    const uint8_t* q16 = reinterpret_cast<const uint8_t*>(q + (r * H + h0) * (kD / 2));
    constexpr int chunks = kD * 2 / 16;  // per head
    for (int i = tid; i < kH * chunks; i += kThreads)
      cp_async16(S.q + sw_offset(i / chunks, i % chunks, kH), q16 + 16 * i);
    if constexpr (kNormQ) cp_async_commit();  // Q's own group, ahead of the first tile's
    lookup(0, kb);
    __syncthreads();  // (also the rotary table)
    if (kb < ke) fetch_tile(S.k[0], S.kp[0], q);  // commits Q's copies too (without kNormQ)
    else cp_async_commit();
    if constexpr (kNormQ) {
      cp_async_wait<1>();  // this thread's copies of Q
      __syncthreads();     // everyone's
      norm_q_in_place();
    }
  } else {
    q_load(0);
    lookup(0, kb);
    __syncthreads();
    if (kb < ke) fetch_tile(S.k[0], S.kp[0], q);
    q_store(0);
#pragma unroll 1
    for (int round = 1; round < kQRounds; ++round) {
      q_load(round);
      q_store(round);
    }
  }
  // This thread's heads: rows g and g + 8 of its warp's 16 (accumulator i: row (i / 2) % 2).
  const int hr[2] = {16 * wq + g, 16 * wq + g + 8};
  float m[2] = {sink[h0 + hr[0]], sink[h0 + hr[1]]}, l[2] = {0.f, 0.f};
  float acc[4][32];  // O: columns 256 wg + 64 n + 8 (i / 4) + 2 qd + i % 2
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[n][i] = 0.f;

  const int64_t ntiles = ceil_div(ke - kb, int64_t(kKeys));
  // P V of the previous tile (probabilities in S.p, keys in buffer b): A from ldmatrix, issued
  // after this tile's S so that the softmax of S overlaps it. Caller fences and commits.
  uint32_t a[kKeys / 16][4];
  auto load_p = [&] {
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) ldsm_x4(a[kk], a_addr(S.p, 16 * wq, 16 * kk));
#pragma unroll
    for (int n = 0; n < 4; ++n) wgmma_pin(acc[n]);  // the rescale done before the fence, not between the wgmmas
  };
  // The wgmmas are issued with the warpgroup as a constant (Wg), so that each descriptor comes
  // from uniform values alone (built once a tile, advanced by uniform adds): with wg in the
  // address, every wgmma's descriptor was rebuilt in ordinary registers and moved over (~8
  // instructions a wgmma, ~1/3 of a tile's instructions: ncu, bench/NOTES.md step 31).
  auto issue_pv_wg = [&](auto wg_const, const uint8_t* v) {
    constexpr int Wg = decltype(wg_const)::value;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int n = 0; n < 4; ++n)
        wgmma_m64n64k16_bf16_rs_mn(acc[n], a[kk], wgmma_desc_sw128_mn64(v + (4 * Wg + n) * kRegion + kk * 16 * 128));
  };
  auto issue_pv = [&](const uint8_t* v) {
    if (wg == 0) issue_pv_wg(std::integral_constant<int, 0>{}, v);
    else issue_pv_wg(std::integral_constant<int, 1>{}, v);
  };
  // S = Q K^T of this warpgroup's 32 keys of the tile in kt (then a commit), and the previous
  // tile's P V on v (its caller commits).
  auto issue_s_pv = [&](auto wg_const, const uint8_t* kt, float (&s)[16], const uint8_t* v) {
    constexpr int Wg = decltype(wg_const)::value;
#pragma unroll
    for (int k = 0; k < kD / 16; ++k) {
      const uint64_t da = wgmma_desc_sw128(S.q + (k >> 2) * kH * 128) + 2 * (k & 3);
      const uint64_t db = wgmma_desc_sw128(kt + (k >> 2) * kRegion + 32 * Wg * 128) + 2 * (k & 3);
      wgmma_m64n32k16_bf16_ss(s, da, db, true);
    }
    wgmma_commit();
    issue_pv_wg(wg_const, v);
  };
  // Every tile issues a P V group, so that the wgmma groups do not depend on control flow (a
  // conditional group cost a dummy wgmma per tile; a peeled first tile made ptxas serialise the
  // wgmmas, C7515): the first tile's is zeros times Q's bf16 (finite) bytes.
  for (int64_t t = 0; t < ntiles; ++t) {
    const int cur = static_cast<int>(t & 1);
    cp_async_wait<0>();
    fence_proxy_async_smem();
    __syncthreads();  // this tile's keys (and at t = 0, Q) visible to the tensor cores; the previous tile's P complete
    if (t > 0) {
      load_p();
    } else {
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) a[kk][0] = a[kk][1] = a[kk][2] = a[kk][3] = 0u;
    }
    const uint8_t* kt = S.k[cur];
    float s[16];  // zeroed before the fence (a wgmma with scale-d off still made the compiler
#pragma unroll    // define its registers inside the pipeline stage, serialising the wgmmas: C7515)
    for (int i = 0; i < 16; ++i) s[i] = 0.f;
    wgmma_fence();
    const uint8_t* const pv = t > 0 ? S.k[cur ^ 1] : S.q;
    if (wg == 0) issue_s_pv(std::integral_constant<int, 0>{}, kt, s, pv);
    else issue_s_pv(std::integral_constant<int, 1>{}, kt, s, pv);
    wgmma_commit();
    // The next tile's key rows, their global reads under the MMAs (the slot was last read by the
    // previous tile's fetch and softmax, both before this tile's barrier).
    lookup(cur ^ 1, kb + kKeys * (t + 1));
    wgmma_wait<1>();  // S (the previous tile's P V may still run)
    wgmma_pin(s);
    const uint32_t valid = S.valid[cur][wg] >> (2 * qd);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i) {  // key 32 wg + 8 (i / 4) + 2 qd + i % 2
      s[i] = (valid >> (8 * (i >> 2) + (i & 1))) & 1u ? s[i] * scale : -INFINITY;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xFFFFFFFFu, mx[e], 1));
      mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xFFFFFFFFu, mx[e], 2));
      if (qd == 0) S.mx[wg][hr[e]] = mx[e];
    }
    wgmma_wait<0>();
#pragma unroll
    for (int n = 0; n < 4; ++n) wgmma_pin(acc[n]);
    __syncthreads();  // maxima exchanged; both warpgroups' P V of the previous tile done: its buffer and S.p are free
    if (t + 1 < ntiles) fetch_tile(S.k[cur ^ 1], S.kp[cur ^ 1], q);
    float alpha[2], ml2[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float m_new = fmaxf(m[e], fmaxf(S.mx[0][hr[e]], S.mx[1][hr[e]]));
      alpha[e] = exp2_approx((m[e] - m_new) * kLog2e);
      m[e] = m_new;
      ml2[e] = m_new * kLog2e;
      l[e] *= alpha[e];
    }
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const int e = (i >> 1) & 1;
      // exp(s - m) as 2^(s log2 e - m log2 e); masked keys (-inf) give 0. The sum takes the
      // probabilities as the P V product sees them (rounded to bf16).
      const uint32_t pk = pack_bf16(exp2_approx(fmaf(s[i], kLog2e, -ml2[e])), exp2_approx(fmaf(s[i + 1], kLog2e, -ml2[e])));
      const __nv_bfloat162 pr = *reinterpret_cast<const __nv_bfloat162*>(&pk);
      l[e] += __low2float(pr) + __high2float(pr);
      *reinterpret_cast<uint32_t*>(&S.p[hr[e]][32 * wg + 8 * (i >> 2) + 2 * qd]) = pk;
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int i = 0; i < 32; ++i) acc[n][i] *= alpha[(i >> 1) & 1];
  }
  __syncthreads();  // the last tile's P complete
  if (ntiles > 0) {
    load_p();
    wgmma_fence();
    issue_pv(S.k[(ntiles - 1) & 1]);
    wgmma_commit();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int n = 0; n < 4; ++n) wgmma_pin(acc[n]);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l[e] += __shfl_xor_sync(0xFFFFFFFFu, l[e], 1);
    l[e] += __shfl_xor_sync(0xFFFFFFFFu, l[e], 2);
    if (qd == 0) S.lsum[wg][hr[e]] = l[e];
  }
  __syncthreads();
  if (f8.q) return fp8_epilogue(acc, S, f8, m, sink, r, H, h0, wg, hr, qd);
  // O through shared memory (the key tiles and P, free now) and out by 64 bulk copies of one
  // head's 2 KB row each: the fp32 stores had been ~10% of the kernel's stall samples (LSU
  // queue) as 64 8-byte stores per thread.
  float(*const ost)[kOPitch] = reinterpret_cast<float(*)[kOPitch]>(S.k[0]);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const float lt = S.lsum[0][hr[e]] + S.lsum[1][hr[e]];
    float mul = 1.f;
    if (partial) {
      if (wg == 0 && qd == 0) ml[(r * H + h0 + hr[e]) * nsplit + split] = make_float2(m[e], lt);
    } else {
      mul = 1.0f / (lt + expf(sink[h0 + hr[e]] - m[e]));
    }
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int j = 0; j < 8; ++j)  // accumulators 4j + 2e, 4j + 2e + 1: row e, columns 8j + 2qd (+1)
        *reinterpret_cast<float2*>(&ost[hr[e]][256 * wg + 64 * n + 8 * j + 2 * qd]) =
            make_float2(acc[n][4 * j + 2 * e] * mul, acc[n][4 * j + 2 * e + 1] * mul);
  }
  fence_proxy_async_smem();  // the rows visible to the bulk copies
  __syncthreads();
  if (tid < kH) {
    const int64_t hh = h0 + tid;
    float* dst = partial ? partial + ((r * H + hh) * nsplit + split) * kD : o + (r * H + hh) * kD;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(smem_addr(&ost[tid][0])), "n"(kD * 4) : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // shared memory read before exit
  }
#endif
}

}  // namespace

bool g_attention_wgmma_on = [] {
  const char* env = std::getenv("DSV4_ATTN_WGMMA");  // 0: the mma.sync kernel (A/B runs)
  return !(env && std::string(env) == "0");
}();

bool g_fp8_out_on = [] {
  const char* env = std::getenv("DSV4_ATTN_FP8_OUT");  // 0: o in fp32, quantised by wo_a (A/B runs)
  return !(env && std::string(env) == "0");
}();

bool attention_wgmma_ok(int64_t H, int64_t D) {
  static const bool available = wgmma_available();
  return g_attention_wgmma_on && available && attention_mma_ok(H, D);
}

bool attention_fp8_out_ok(int64_t H, const InverseRope& rope) {
  return g_fp8_out_on && attention_wgmma_ok(H, kD) && rope.head_len == kD && rope.pairs >= 0 &&
         rope.pairs <= kMaxRotPairs && 2 * rope.pairs <= kD && rope.pairs % 4 == 0;
}

bool attention_norms_q(int64_t H, int64_t D, int64_t pairs) {
  return attention_wgmma_ok(H, D) && D == kD && pairs >= 0 && pairs <= kMaxRotPairs && 2 * pairs <= kD;
}

void attention_wgmma(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t W, const float* sink,
                     float scale, int nsplit, float* o, float* partial, float2* ml, cudaStream_t s, bool bf16_q,
                     const AttnFp8Out* f8, const AttnQNorm* qn) {
  DSV4_CHECK(attention_wgmma_ok(H, kD), "attention_wgmma: needs H % 64 == 0, D == 512, an sm_90 device and an "
                                        "arch-90a build");
  DSV4_CHECK(!f8 || (nsplit == 1 && attention_fp8_out_ok(H, f8->rope) && f8->q && f8->scales &&
                     reinterpret_cast<uintptr_t>(f8->q) % 16 == 0),
             "attention_wgmma: the FP8 output needs one split, heads of ", kD, " channels with <= ", kMaxRotPairs,
             " rotary pairs (a multiple of 4) and 16-byte aligned codes");
  DSV4_CHECK(!qn || (bf16_q && attention_norms_q(H, kD, qn->pairs)), "attention_wgmma: q's norm needs bf16 q, heads of ",
             kD, " channels with <= ", kMaxRotPairs, " rotary pairs");
  DSV4_CHECK(!f8 || !qn || (f8->rope.inv_freq == qn->inv_freq && f8->rope.pairs == qn->pairs && f8->rope.pos == qn->pos),
             "attention_wgmma: q's norm and the FP8 output must rotate by the same positions and frequencies");
  const size_t smem = 1024 + sizeof(Smem);  // + the alignment of the swizzle atoms
  RowExtras base;
  if (f8) base = {f8->q, f8->scales, R, f8->rope.inv_freq, f8->rope.pos, static_cast<int>(f8->rope.pairs)};
  if (qn) {
    base.inv_freq = qn->inv_freq;
    base.pos = qn->pos;
    base.pairs = static_cast<int>(qn->pairs);
    base.eps = qn->eps;
  }
  const auto at = [&](int64_t r0) {  // the range's rows: codes, scale columns and positions from r0
    RowExtras e = base;
    if (e.q) {
      e.q += r0 * H * kD;
      e.scales += r0;
    }
    if (e.pos) e.pos += r0;
    return e;
  };
  const auto kernel = qn ? attention_wgmma_kernel<true, true>
                         : bf16_q ? attention_wgmma_kernel<true, false> : attention_wgmma_kernel<false, false>;
  launch_attention_rows(kernel, kThreads, smem, q, bf16_q ? kD / 2 : kD, rows, R, H, W, sink, scale, nsplit, o,
                        partial, ml, s, at);
}

}  // namespace dsv4::cuda::detail

namespace dsv4::cuda {
void set_attention_wgmma(bool on) { detail::g_attention_wgmma_on = on; }
}  // namespace dsv4::cuda
