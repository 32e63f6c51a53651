// Shared-KV sparse attention on bf16 tensor cores (Fast precision; the fp32 kernel of
// ops_attention.cu is the Exact twin). Every head of a row attends to the same keys (K = V), so
// one row is two small GEMMs: S = Q K^T (64 heads x 32 keys per tile, K-dim 512) and O += P V
// (64 heads x 512 columns, K-dim the tile's 32 keys). A CTA takes one row and 64 heads: q as
// bf16 in shared memory once, each tile of 32 keys converted to bf16 into shared memory, S and
// O on mma.m16n8k16 (fp32 accumulation), an online softmax per head whose running max starts at
// the sink logit. The fp32 kernel did the same work with FMAs: ~12 TFLOP/s on 4096 prefill rows
// of 640 keys (28.5 ms, 47% of a 4096-token prefill); this one took 3.5 ms there with one CTA per
// SM (242 registers) waiting on each key tile's loads, so the next tile's fp32 keys now arrive
// by cp.async into a staging buffer while this tile is multiplied. Same split / merge scheme as
// the fp32 kernel, with up to 32 splits so that a decode row's keys spread over ~20 CTAs of one
// tile each (a split without keys writes only m = -inf, which the merge skips).
// 16 warps (one CTA per SM: 2 warps per scheduler left it latency-bound, 0.38 eligible warps,
// IPC 1.3). Warp w: S of heads 16 (w % 4).. x all 32 keys over dims 128 (w / 4).. (the four
// parts' partial scores are added by the softmax), O of all 64 heads x columns 32 w... Each q
// fragment is read from shared memory once per tile and each V fragment once (8 warps of 16
// heads x 16 keys / 16 heads x 256 columns re-read q twice and V four times). Fragments come from
// ldmatrix (x4; .trans for V, which is stored key-major).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/bf16_fragments.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/ops_attention_keys.cuh"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kH = kAttnMmaHeads, kD = kAttnMmaDim;
constexpr int kKeys = 32;               // keys per tile
constexpr int kThreads = 512;           // 16 warps
constexpr int kWarps = kThreads / 32;
constexpr int kDimParts = kWarps / 4;   // S: warps per head group, each over kD / kDimParts dims
constexpr int kHeadLanes = kThreads / 64;  // softmax: threads per head
constexpr int kLaneKeys = kKeys / kHeadLanes;
constexpr int kQPitch = kD + 8;         // bf16 per q / key row: 1040 bytes, rows 4 banks apart
constexpr int kPPitch = kKeys + 8;      // bf16 per probability row: 80 bytes
constexpr int kSPitch = kKeys + 1;      // floats per score row
constexpr int kOCols = kD / kWarps;     // output columns per warp (all heads)
constexpr int kONt = kOCols / 8;        // n tiles of 8 columns per warp

struct Smem {
  __nv_bfloat16 q[kH][kQPitch];
  __nv_bfloat16 k[kKeys][kQPitch];
  float s[kDimParts][kH][kSPitch];  // partial scores over the parts of the dims
  __nv_bfloat16 p[kH][kPPitch];
  float m[kH], l[kH], alpha[kH];
  // Key rows of this tile and the next two (nullptr: past the range), a ring: the row pointers
  // of a CSA tile come from the selection list in global memory, and loading them between the
  // tile's two barriers put that load's latency on every tile's critical path.
  const float* kp[3][kKeys];
  float kf[kKeys][kD];        // the next tile's fp32 keys (cp.async)
};

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// n rows of kD fp32 (src(i) nullptr: zeros) into bf16 rows of dst; eight float4 loads in flight
// per thread before any is stored.
template <typename Src>
__device__ __forceinline__ void stage_bf16(__nv_bfloat16 (*dst)[kQPitch], int n, Src src) {
  constexpr int d4 = kD / 4, batch = 8;
  const int total = n * d4;
  for (int i0 = threadIdx.x; i0 < total; i0 += kThreads * batch) {
    float4 v[batch];
#pragma unroll
    for (int b = 0; b < batch; ++b) {
      const int i = i0 + b * kThreads;
      const float* p = i < total ? src(i / d4) : nullptr;
      v[b] = p ? __ldg(reinterpret_cast<const float4*>(p) + i % d4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int b = 0; b < batch; ++b) {
      const int i = i0 + b * kThreads;
      if (i < total)
        *reinterpret_cast<uint2*>(&dst[i / d4][4 * (i % d4)]) = make_uint2(pack_bf16(v[b].x, v[b].y), pack_bf16(v[b].z, v[b].w));
    }
  }
}

// bf16 keys (a model storing them so): the tile's rows copied as they are into a bf16 tile (zeros
// for missing keys; one commit group) — no fp32 staging, no conversion pass.
__device__ __forceinline__ void fetch_keys_bf16(__nv_bfloat16 (*dst)[kQPitch], const float* const* kp) {
  constexpr int c16 = kD * 2 / 16;  // 16-byte chunks per key
  for (int i = threadIdx.x; i < kKeys * c16; i += kThreads) {
    const float* p = kp[i / c16];
    uint8_t* d = reinterpret_cast<uint8_t*>(&dst[i / c16][0]) + 16 * (i % c16);
    if (p)
      cp_async16(d, reinterpret_cast<const uint8_t*>(p) + 16 * (i % c16));
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
  }
  cp_async_commit();
}

// Issues the cp.async copies of the tile whose key rows are kp into kf (zeros for missing keys;
// one commit group).
__device__ __forceinline__ void fetch_keys(float (*kf)[kD], const float* const* kp) {
  constexpr int d4 = kD / 4;
  for (int i = threadIdx.x; i < kKeys * d4; i += kThreads) {
    const float* p = kp[i / d4];
    float* dst = &kf[i / d4][4 * (i % d4)];
    if (p)
      cp_async16(dst, p + 4 * (i % d4));
    else
      *reinterpret_cast<float4*>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  cp_async_commit();
}

// kBf16: the keys are stored as bf16 (D / 2 float slots per key): tiles alternate between k and
// the fp32 staging buffer's bytes, each loaded while the other is multiplied.
// q rows stored as bf16 (D / 2 float slots each) copied as they are into the padded q tile.
__device__ __forceinline__ void stage_q_bf16(__nv_bfloat16 (*dst)[kQPitch], const float* q) {
  constexpr int c16 = kD * 2 / 16;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kH * c16; i += kThreads)
    *reinterpret_cast<uint4*>(&dst[i / c16][8 * (i % c16)]) =
        __ldg(reinterpret_cast<const uint4*>(q + (i / c16) * (kD / 2)) + i % c16);
}

// kBf16Q: q is stored as bf16 (rms_norm_rope's bf16 output: the same values this kernel's
// staging rounds fp32 q to).
template <bool kBf16, bool kBf16Q>
__global__ void __launch_bounds__(kThreads, 1)
    attention_mma_kernel(const float* __restrict__ q, const AttnRow* __restrict__ rows, int64_t H, int64_t W,
                         const float* __restrict__ sink, float scale, int nsplit, float* __restrict__ o,
                         float* __restrict__ partial, float2* __restrict__ ml) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int64_t r = blockIdx.y, h0 = static_cast<int64_t>(blockIdx.x) * kH;
  const int split = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
  const AttnRow row = rows[r];
  const SplitKeys sk = split_keys(row, W, nsplit, split, kKeys);
  const int64_t lo = sk.lo, nwin = sk.nwin, kb = sk.kb, ke = sk.ke;
  if (kb >= ke && partial) return mark_empty_split(ml, r, H, h0, nsplit, split, kH);

  constexpr int64_t kStride = kBf16 ? kD / 2 : kD;  // float slots per stored key
  // bf16 tiles: k, and the fp32 staging buffer's bytes (33 of its 64 KB), alternately.
  __nv_bfloat16 (*const kalt)[kQPitch] = reinterpret_cast<__nv_bfloat16 (*)[kQPitch]>(&S.kf[0][0]);
  if (tid < kKeys)
#pragma unroll
    for (int t = 0; t < 2; ++t)
      S.kp[t][tid] = kb + kKeys * t + tid < ke ? key_ptr(row, kb + kKeys * t + tid, lo, nwin, W, kStride) : nullptr;
  __syncthreads();
  if (kb < ke) {  // the first tile's keys load while q is staged
    if constexpr (kBf16)
      fetch_keys_bf16(S.k, S.kp[0]);
    else
      fetch_keys(S.kf, S.kp[0]);
  }
  if constexpr (kBf16Q)
    stage_q_bf16(S.q, q + (r * H + h0) * (kD / 2));
  else
    stage_bf16(S.q, kH, [&](int h) { return q + (r * H + h0 + h) * kD; });
  if (tid < kH) {
    S.m[tid] = sink[h0 + tid];
    S.l[tid] = 0.f;
  }
  const int hs = 16 * (warp & 3);     // S: this warp's heads
  const int sd0 = (kD / kDimParts) * (warp >> 2);  // S: its part of the dims
  const int oc0 = kOCols * warp;      // O: its output columns
  constexpr int kMt = kH / 16;        // O: m tiles (16 heads each)
  float acc[kMt][kONt][4];
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int t = 0; t < kONt; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[m][t][i] = 0.f;

  int cur = 0, bi = 0;  // ring slot of tile t0; its bf16 buffer (kBf16)
  for (int64_t t0 = kb; t0 < ke; t0 += kKeys, cur = cur == 2 ? 0 : cur + 1, bi ^= 1) {
    const int nxt = cur == 2 ? 0 : cur + 1, after = nxt == 2 ? 0 : nxt + 1;
    const int64_t t2 = t0 + 2 * kKeys;  // the tile whose rows this one looks up, loaded before the wait
    const float* p2 = tid < kKeys && t2 + tid < ke ? key_ptr(row, t2 + tid, lo, nwin, W, kStride) : nullptr;
    const int64_t t1 = t0 + kKeys;
    cp_async_wait<0>();
    __syncthreads();  // this tile's keys are in kf (or bf16 in k / kalt by bi); the previous tile's keys and probabilities are no longer read
    __nv_bfloat16 (*const Kt)[kQPitch] = kBf16 && bi ? kalt : S.k;  // this tile's bf16 keys
    if constexpr (kBf16) {
      if (tid < kKeys) S.kp[after][tid] = p2;  // its slot was last read by the previous tile's softmax
      if (t1 < ke) fetch_keys_bf16(bi ? S.k : kalt, S.kp[nxt]);  // the previous tile's buffer, free since the barrier
    } else {
      {  // kf (fp32) -> k (bf16)
        constexpr int d4 = kD / 4;
        for (int i = tid; i < kKeys * d4; i += kThreads) {
          const float4 v = *reinterpret_cast<const float4*>(&S.kf[i / d4][4 * (i % d4)]);
          *reinterpret_cast<uint2*>(&S.k[i / d4][4 * (i % d4)]) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
        }
      }
      if (tid < kKeys) S.kp[after][tid] = p2;  // its slot was last read by the previous tile's softmax
      __syncthreads();  // k ready, kf free
      if (t1 < ke) fetch_keys(S.kf, S.kp[nxt]);
    }
    const float* const* kp = S.kp[cur];
    {  // partial S = Q K^T for 16 heads x 32 keys over a part of the dims
      float c[kKeys / 8][4] = {};
      const int mi = lane >> 3, rr = lane & 7;
#pragma unroll 4
      for (int k0 = sd0; k0 < sd0 + kD / kDimParts; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, a_addr(S.q, hs, k0));
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          // B = K^T, stored key-major ([n][k]): matrices (keys 0-7 | 8-15) x (k 0-7 | 8-15).
          uint32_t b[4];
          ldsm_x4(b, &Kt[16 * kk + rr + 8 * (mi >> 1)][k0 + 8 * (mi & 1)]);
          mma_bf16(c[2 * kk], a, b[0], b[1]);
          mma_bf16(c[2 * kk + 1], a, b[2], b[3]);
        }
      }
      float(*sp)[kSPitch] = S.s[warp >> 2];
#pragma unroll
      for (int t = 0; t < kKeys / 8; ++t) {
        const int col = 8 * t + 2 * qd;
        sp[hs + g][col] = c[t][0];
        sp[hs + g][col + 1] = c[t][1];
        sp[hs + g + 8][col] = c[t][2];
        sp[hs + g + 8][col + 1] = c[t][3];
      }
    }
    __syncthreads();
    {  // online softmax: head tid / kHeadLanes, kLaneKeys keys per lane (a head's lanes are adjacent)
      const int h = tid / kHeadLanes, k0 = kLaneKeys * (tid % kHeadLanes);
      const float m_old = S.m[h], l_old = S.l[h];
      float v[kLaneKeys], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kLaneKeys; ++j) {
        float sc = S.s[0][h][k0 + j];
#pragma unroll
        for (int part = 1; part < kDimParts; ++part) sc += S.s[part][h][k0 + j];
        v[j] = kp[k0 + j] ? sc * scale : -INFINITY;
        mx = fmaxf(mx, v[j]);
      }
#pragma unroll
      for (int o = 1; o < kHeadLanes; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
      const float m_new = fmaxf(m_old, mx);
      uint32_t pk[kLaneKeys / 2];
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kLaneKeys; j += 2) {
        // The sum takes the probabilities as the PV product sees them (rounded to bf16).
        pk[j / 2] = pack_bf16(v[j] == -INFINITY ? 0.f : expf(v[j] - m_new), v[j + 1] == -INFINITY ? 0.f : expf(v[j + 1] - m_new));
        const __nv_bfloat162 pr = *reinterpret_cast<const __nv_bfloat162*>(&pk[j / 2]);
        sum += __low2float(pr) + __high2float(pr);
      }
#pragma unroll
      for (int o = 1; o < kHeadLanes; o <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
      static_assert(kLaneKeys == 4, "two words of probabilities per lane");
      *reinterpret_cast<uint2*>(&S.p[h][k0]) = make_uint2(pk[0], pk[1]);
      if (tid % kHeadLanes == 0) {  // after the shuffles: every lane of the head has read m_old / l_old
        const float a = expf(m_old - m_new);
        S.alpha[h] = a;
        S.m[h] = m_new;
        S.l[h] = l_old * a + sum;
      }
    }
    __syncthreads();
    {  // O = alpha O + P V for 64 heads x kOCols columns
#pragma unroll
      for (int m = 0; m < kMt; ++m) {
        const float a_lo = S.alpha[16 * m + g], a_hi = S.alpha[16 * m + g + 8];
#pragma unroll
        for (int t = 0; t < kONt; ++t) {
          acc[m][t][0] *= a_lo;
          acc[m][t][1] *= a_lo;
          acc[m][t][2] *= a_hi;
          acc[m][t][3] *= a_hi;
        }
      }
      const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
      for (int k0 = 0; k0 < kKeys; k0 += 16) {
        uint32_t a[kMt][4];
#pragma unroll
        for (int m = 0; m < kMt; ++m) ldsm_x4(a[m], a_addr(S.p, 16 * m, k0));
#pragma unroll
        for (int t = 0; t < kONt; t += 2) {
          // B = V, stored key-major ([k][n]): transposed matrices (k 0-7 | 8-15) x (n 0-7 | 8-15).
          uint32_t b[4];
          ldsm_x4_trans(b, &Kt[k0 + rr + 8 * (mi & 1)][oc0 + 8 * t + 8 * (mi >> 1)]);
#pragma unroll
          for (int m = 0; m < kMt; ++m) {
            mma_bf16(acc[m][t], a[m], b[0], b[1]);
            mma_bf16(acc[m][t + 1], a[m], b[2], b[3]);
          }
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kMt; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // rows g and g + 8 of m tile m
      const int hl = 16 * m + g + 8 * half;
      const int64_t hh = h0 + hl;
      float* dst;
      float mul = 1.f;
      if (partial) {
        const int64_t slot = (r * H + hh) * nsplit + split;
        dst = partial + slot * kD;
        if (warp == 0 && qd == 0) ml[slot] = make_float2(S.m[hl], S.l[hl]);
      } else {
        dst = o + (r * H + hh) * kD;
        mul = 1.0f / (S.l[hl] + expf(sink[hh] - S.m[hl]));
      }
#pragma unroll
      for (int t = 0; t < kONt; ++t)
        *reinterpret_cast<float2*>(dst + oc0 + 8 * t + 2 * qd) =
            make_float2(acc[m][t][2 * half] * mul, acc[m][t][2 * half + 1] * mul);
    }
}

}  // namespace

void attention_mma(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t W, const float* sink, float scale,
                   int nsplit, float* o, float* partial, float2* ml, cudaStream_t s, bool bf16_keys, bool bf16_q) {
  DSV4_CHECK(attention_mma_ok(H, kD), "attention_mma: needs H % 64 == 0 and D == 512");
  DSV4_CHECK(bf16_keys || !bf16_q, "attention_mma: bf16 q goes with bf16 keys");
  const size_t smem = sizeof(Smem);
  auto* kernel = bf16_q      ? attention_mma_kernel<true, true>
                 : bf16_keys ? attention_mma_kernel<true, false>
                             : attention_mma_kernel<false, false>;
  launch_attention_rows(kernel, kThreads, smem, q, bf16_q ? kD / 2 : kD, rows, R, H, W, sink, scale, nsplit, o, partial,
                        ml, s);
}

}  // namespace dsv4::cuda::detail
