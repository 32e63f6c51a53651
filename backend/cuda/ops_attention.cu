// Shared-KV sparse attention (twin: attend() over the key list built in attention_forward).
// All H heads of a row attend to the same keys (K = V), so a block takes one row and a group
// of 8 heads, streams the row's keys through shared memory 32 at a time and uses every staged
// key for all 8 heads (QK^T: warps split the head dim; PV: threads own output columns), with
// an online softmax whose running max starts at the sink logit (always finite; a masked key
// contributes exactly 0). Small batches also split the key list across blocks (flash-decoding)
// and a second kernel merges the partial (max, sum, acc) triples with the sink term.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/async_scratch.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_attention_keys.cuh"
#include "backend/cuda/ops_common.cuh"

namespace dsv4::cuda {

using detail::ceil_div;
using detail::key_ptr;
using detail::sm_count;

namespace {

constexpr int kAH = 8;        // heads per block (= warps)
constexpr int kAK = 32;       // keys per tile (= lanes)
constexpr int kAThreads = 256;
constexpr int kMaxD = 2 * kAThreads;  // PV: each thread owns two output columns
constexpr int kMaxSplit = 16;         // key-list splits per (row, head group) at small batches
// The tensor-core kernel's splits when a call is one row of 64 heads: that CTA holds all heads,
// so the row needs more splits to spread its keys (640: 20 CTAs of one 32-key tile each) over the
// SMs (bench_ops, 1 row: 35.4 -> 27.4 us). At 8 rows 17 splits instead of 16 measured slower
// (33.1 -> 39.4 us, the wider merge), so batches keep kMaxSplit.
constexpr int kMaxSplitMma = 32;

struct AttnSmem {
  // Offsets (in floats) into the dynamic shared buffer for a head dim D.
  int64_t ks, qs, red, p, total;
  explicit __host__ __device__ AttnSmem(int64_t D)
      : ks(0), qs(kAK * (D + 4)), red(qs + kAH * D), p(red + kAH * kAH * kAK), total(p + kAK * kAH) {}
};

// dst[j * ld + 4c ..] = src(j)[4c ..] for n rows of d4 float4 (src nullptr: zeros). Each thread
// issues kStageBatch independent loads before storing any: the former one-load-then-store loop
// left one load in flight per thread, and staging a 64 KB key tile took most of a decode
// attention's ~28 us.
constexpr int kStageBatch = 8;
template <typename Src>
__device__ __forceinline__ void stage_rows(float* dst, int64_t ld, int n, int d4, Src src) {
  const int total = n * d4;
  for (int i0 = threadIdx.x; i0 < total; i0 += kAThreads * kStageBatch) {
    float4 v[kStageBatch];
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = i0 + b * kAThreads;
      const float* p = i < total ? src(i / d4) : nullptr;
      v[b] = p ? __ldg(reinterpret_cast<const float4*>(p) + i % d4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = i0 + b * kAThreads;
      if (i < total) reinterpret_cast<float4*>(dst + (i / d4) * ld)[i % d4] = v[b];
    }
  }
}

// partial == nullptr: write normalised o. Else write [R, H, nsplit] (m, l) pairs to ml and
// unnormalised accumulators [R, H, nsplit, D] to partial.
__global__ void __launch_bounds__(kAThreads, 2)  // 2 blocks per SM (the shared memory allows 2)
    attention_kernel(const float* q, const AttnRow* rows, int64_t H, int64_t D, int64_t W, const float* sink,
                     float scale, float* o, int nsplit, float* partial, float2* ml) {
  extern __shared__ __align__(16) float sm[];
  const AttnSmem L(D);
  float* Ks = sm + L.ks;   // [kAK][D + 4]: the pad keeps lanes of one column on distinct banks
  float* Qs = sm + L.qs;   // [kAH][D]
  float* red = sm + L.red;  // [kAH warps][kAH heads][kAK]
  float* Ps = sm + L.p;     // [kAK][kAH] probabilities; then alpha [kAH]
  __shared__ const float* kp[kAK];
  __shared__ float alpha[kAH], s_m[kAH], s_l[kAH];

  const int64_t r = blockIdx.y, h0 = blockIdx.x * int64_t(kAH);
  const int split = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const AttnRow row = rows[r];
  const detail::SplitKeys sk = detail::split_keys(row, W, nsplit, split, kAK);
  const int64_t lo = sk.lo, nwin = sk.nwin, kb = sk.kb, ke = sk.ke;
  const int64_t D4 = D / 4, ldk = D + 4;

  stage_rows(Qs, D, static_cast<int>(kAH), static_cast<int>(D4),
             [&](int h) { return h0 + h < H ? q + (r * H + h0 + h) * D : nullptr; });
  // Softmax state of head `warp` lives in that warp's registers (warp-uniform).
  const int64_t hw = h0 + warp;
  float m_run = hw < H ? sink[hw] : 0.f, l_run = 0.f;
  float2 acc[kAH];
#pragma unroll
  for (int h = 0; h < kAH; ++h) acc[h] = make_float2(0.f, 0.f);

  for (int64_t t0 = kb; t0 < ke; t0 += kAK) {
    if (tid < kAK) kp[tid] = t0 + tid < ke ? key_ptr(row, t0 + tid, lo, nwin, W, D) : nullptr;
    __syncthreads();  // kp ready; previous tile's Ks / Ps no longer read
    stage_rows(Ks, ldk, kAK, static_cast<int>(D4), [&](int j) { return kp[j]; });
    __syncthreads();
    // QK^T: lane = key, warp = slice of the head dim, 8 head accumulators.
    float dots[kAH];
#pragma unroll
    for (int h = 0; h < kAH; ++h) dots[h] = 0.f;
    for (int64_t c = warp; c < D4; c += kAH) {
      const float4 kv = reinterpret_cast<const float4*>(Ks + lane * ldk)[c];
#pragma unroll
      for (int h = 0; h < kAH; ++h) {
        const float4 qv = reinterpret_cast<const float4*>(Qs + h * D)[c];
        dots[h] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
      }
    }
#pragma unroll
    for (int h = 0; h < kAH; ++h) red[(warp * kAH + h) * kAK + lane] = dots[h];
    __syncthreads();
    // Online softmax: warp = head, lane = key.
    {
      float logit = 0.f;
      for (int w = 0; w < kAH; ++w) logit += red[(w * kAH + warp) * kAK + lane];
      logit *= scale;
      const bool valid = kp[lane] != nullptr;
      const float tmax = detail::warp_max(valid ? logit : -INFINITY);
      const float m_new = fmaxf(m_run, tmax);
      const float p = valid ? expf(logit - m_new) : 0.f;
      const float psum = detail::warp_sum(p);
      const float a = expf(m_run - m_new);
      l_run = l_run * a + psum;
      m_run = m_new;
      Ps[lane * kAH + warp] = p;
      if (lane == 0) alpha[warp] = a;
    }
    __syncthreads();
    // PV: thread owns columns 2 tid, 2 tid + 1 of all 8 heads.
    if (2 * tid < D) {
#pragma unroll
      for (int h = 0; h < kAH; ++h) {
        acc[h].x *= alpha[h];
        acc[h].y *= alpha[h];
      }
      const int ns = static_cast<int>(std::min<int64_t>(kAK, ke - t0));
      for (int s = 0; s < ns; ++s) {
        const float2 kv = reinterpret_cast<const float2*>(Ks + s * ldk)[tid];
        const float4 pa = reinterpret_cast<const float4*>(Ps + s * kAH)[0];
        const float4 pb = reinterpret_cast<const float4*>(Ps + s * kAH)[1];
        const float pv[kAH] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
        for (int h = 0; h < kAH; ++h) {
          acc[h].x += pv[h] * kv.x;
          acc[h].y += pv[h] * kv.y;
        }
      }
    }
  }
  if (lane == 0) {
    s_m[warp] = m_run;
    s_l[warp] = l_run;
  }
  __syncthreads();
  if (2 * tid >= D) return;
  for (int h = 0; h < kAH; ++h) {
    const int64_t hh = h0 + h;
    if (hh >= H) break;
    if (partial) {
      const int64_t slot = (r * H + hh) * nsplit + split;
      reinterpret_cast<float2*>(partial + slot * D)[tid] = acc[h];
      if (tid == 0) ml[slot] = make_float2(s_m[h], s_l[h]);
    } else {
      const float inv = 1.0f / (s_l[h] + expf(sink[hh] - s_m[h]));
      reinterpret_cast<float2*>(o + (r * H + hh) * D)[tid] = make_float2(acc[h].x * inv, acc[h].y * inv);
    }
  }
}

// o[r, h] = Σ_s e^{m_s - M} acc_s / (Σ_s e^{m_s - M} l_s + e^{sink - M}).
// Grid (row x head, column block of kMergeCols): one column per thread, so a decode row's 64
// heads x 512 columns spread over 256 blocks (one block per head took 19 us per layer at one
// row, more than the attention). The first warp of each block computes the split weights
// e^{m_s - M} and 1/den (nsplit <= MAXS <= 32 lanes) and compacts the splits of non-zero weight
// (empty ones wrote m = -inf): the loop then loads only those, unrolled and in flight together
// (a per-split weight test before each load serialised them: +18% at 64 rows).
constexpr int kMergeCols = 128;
template <int MAXS, int CPT>
__global__ void __launch_bounds__(kMergeCols)
    attention_merge_kernel(const float* partial, const float2* ml, int64_t H, int64_t D, int nsplit, const float* sink,
                           float* o) {
  __shared__ float wgt[32];
  __shared__ int live_split[32];
  __shared__ int n_live;
  __shared__ float inv_den;
  const int64_t rh = blockIdx.x, h = rh % H;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const float2 m = lane < nsplit ? ml[rh * nsplit + lane] : make_float2(-INFINITY, 0.f);
    const float M = fmaxf(sink[h], detail::warp_max(m.x));
    const float e = lane < nsplit ? expf(m.x - M) : 0.f;
    const float den = detail::warp_sum(e * m.y) + expf(sink[h] - M);
    const unsigned live = __ballot_sync(0xffffffffu, e > 0.f);
    if (e > 0.f) {
      const int slot = __popc(live & ((1u << lane) - 1u));
      wgt[slot] = e;
      live_split[slot] = lane;
    }
    if (lane == 0) {
      inv_den = 1.0f / den;
      n_live = __popc(live);
    }
  }
  __syncthreads();
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kMergeCols * CPT + threadIdx.x;
  const int nl = n_live;
  const float* base = partial + rh * nsplit * D;
  float v[CPT] = {};
#pragma unroll
  for (int s = 0; s < MAXS; ++s)
    if (s < nl)
#pragma unroll
      for (int j = 0; j < CPT; ++j)
        if (c0 + j * kMergeCols < D) v[j] += wgt[s] * base[live_split[s] * D + c0 + j * kMergeCols];
#pragma unroll
  for (int j = 0; j < CPT; ++j)
    if (c0 + j * kMergeCols < D) o[rh * D + c0 + j * kMergeCols] = v[j] * inv_den;
}

// Columns per thread: one at small batches (a decode row's 64 heads need the column blocks to
// fill the GPU), four from kMergeWideRows rows, where (row x head) blocks alone are enough and
// 4x as many blocks each re-deriving the split weights cost +8 us per layer at 64 rows.
constexpr int64_t kMergeWideRows = 16;

template <int MAXS>
void merge(const float* partial, const float2* ml, int64_t R, int64_t H, int64_t D, int nsplit, const float* sink,
           float* o, cudaStream_t s) {
  const bool wide = R >= kMergeWideRows;
  const int64_t cols = kMergeCols * (wide ? 4 : 1);
  const dim3 grid(static_cast<unsigned>(R * H), static_cast<unsigned>(ceil_div(D, cols)));
  if (wide)
    attention_merge_kernel<MAXS, 4><<<grid, kMergeCols, 0, s>>>(partial, ml, H, D, nsplit, sink, o);
  else
    attention_merge_kernel<MAXS, 1><<<grid, kMergeCols, 0, s>>>(partial, ml, H, D, nsplit, sink, o);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool attention_bf16_keys_ok(int64_t H, int64_t D) { return H > 0 && detail::attention_mma_ok(H, D); }
bool attention_norms_q(int64_t H, int64_t D, int64_t pairs) { return H > 0 && detail::attention_norms_q(H, D, pairs); }

bool sparse_attention(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t D, int64_t W,
                      const float* sink, float* o, cudaStream_t s, bool fast, KeyFormat kv, KeyFormat q_format,
                      const AttnFp8Out* fp8_out, const AttnQNorm* q_norm) {
  DSV4_CHECK(D % 4 == 0 && D <= kMaxD, "cuda::sparse_attention: head dim must be a multiple of 4, <= ", kMaxD);
  const bool bf16_keys = kv == KeyFormat::BF16;
  DSV4_CHECK(!bf16_keys || (fast && attention_bf16_keys_ok(H, D)),
             "cuda::sparse_attention: bf16 keys need Fast precision and the tensor-core kernel's shape (H % 64 == 0, "
             "D == 512); got H ", H, ", D ", D, fast ? "" : " in Exact precision");
  const bool bf16_q = q_format == KeyFormat::BF16;
  DSV4_CHECK(!bf16_q || bf16_keys, "cuda::sparse_attention: bf16 q needs bf16 keys (the tensor-core kernels' form)");
  DSV4_CHECK(W >= 1, "cuda::sparse_attention: window must be >= 1");
  DSV4_CHECK(!q_norm || (fast && bf16_keys && q_format == KeyFormat::BF16 && attention_norms_q(H, D, q_norm->pairs)),
             "cuda::sparse_attention: q's norm inside attention needs Fast precision, bf16 keys and q, and the "
             "warpgroup-MMA kernel's shape (attention_norms_q)");
  if (R == 0 || H == 0) return false;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ctas = detail::attention_mma_ok(H, D) ? R * (H / detail::kAttnMmaHeads) : 0;
  if (fast && ctas >= 1) {
    // One CTA per SM (its O accumulators fill the registers): split keys up to about one wave. The
    // wgmma kernel's per-CTA cost is mostly fixed (Q staging, output) with few 64-key tiles, so it
    // takes at most one wave (64 rows: 2 splits in 128 CTAs, not 3 in 192 = two waves).
    const bool wgmma = bf16_keys && detail::attention_wgmma_ok(H, D);
    const int64_t per_row = wgmma ? std::max<int64_t>(sm_count() / ctas, 1) : ceil_div(sm_count(), ctas);
    const int nsplit = static_cast<int>(std::clamp<int64_t>(per_row, 1, ctas == 1 ? kMaxSplitMma : kMaxSplit));
    auto run = [&](int n, float* partial, float2* ml, const AttnFp8Out* f8) {
      if (wgmma)
        detail::attention_wgmma(q, rows, R, H, W, sink, scale, n, o, partial, ml, s, bf16_q, f8, q_norm);
      else
        detail::attention_mma(q, rows, R, H, W, sink, scale, n, o, partial, ml, s, bf16_keys, bf16_q);
    };
    if (nsplit == 1) {
      const bool to_fp8 = fp8_out && wgmma && detail::attention_fp8_out_ok(H, fp8_out->rope);
      run(1, nullptr, nullptr, to_fp8 ? fp8_out : nullptr);
      return to_fp8;
    }
    float* partial = async_scratch_of<float>(R * H * nsplit * D, s);
    float2* ml = async_scratch_of<float2>(R * H * nsplit, s);
    run(nsplit, partial, ml, nullptr);
    if (nsplit > kMaxSplit)
      merge<kMaxSplitMma>(partial, ml, R, H, D, nsplit, sink, o, s);
    else
      merge<kMaxSplit>(partial, ml, R, H, D, nsplit, sink, o, s);
    async_release(partial, s);
    async_release(ml, s);
    return false;
  }
  const int64_t groups = ceil_div(H, kAH);
  // Fewer blocks than ~2 waves: split each row's keys (at most 16 ways).
  const int nsplit = static_cast<int>(std::clamp<int64_t>(ceil_div(2 * sm_count(), R * groups), 1, kMaxSplit));
  const size_t smem = AttnSmem(D).total * sizeof(float);
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  // Stream-ordered scratch: no host sync, capturable into a CUDA graph.
  float* partial = nsplit > 1 ? async_scratch_of<float>(R * H * nsplit * D, s) : nullptr;
  float2* ml = nsplit > 1 ? async_scratch_of<float2>(R * H * nsplit, s) : nullptr;
  detail::for_row_ranges(R, [&](int64_t r0, int64_t n) {
    const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(n), static_cast<unsigned>(nsplit));
    const int64_t slots = r0 * H * nsplit;
    attention_kernel<<<grid, kAThreads, smem, s>>>(q + r0 * H * D, rows + r0, H, D, W, sink, scale, o + r0 * H * D,
                                                   nsplit, partial ? partial + slots * D : nullptr,
                                                   ml ? ml + slots : nullptr);
    DSV4_CUDA_LAUNCH_CHECK();
  });
  if (nsplit == 1) return false;
  merge<kMaxSplit>(partial, ml, R, H, D, nsplit, sink, o, s);
  async_release(partial, s);
  async_release(ml, s);
  return false;
}

}  // namespace dsv4::cuda
