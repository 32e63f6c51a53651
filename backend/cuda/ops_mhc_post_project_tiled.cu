// hc_post that also does the next hc_pre's projection, at batch and prefill sizes (> 4 rows,
// n = 4). Without it the new streams X' (n d fp32 a row: 537 MB at 8192 rows) are written by
// hc_post, read back by hc_pre's projection and read a third time by its mixing; here the
// projection partials come from the values hc_post just made, so hc_pre only mixes (ncu-free
// estimate at 8192 rows: hc_pre 512 -> ~250 us, hc_post unchanged while it stays memory-bound).
//
// A block takes 32 rows and one slice of the columns (all n streams of them). Per step of 32
// columns a stream (a 128-byte line of each), every thread makes one float4 column of its row's
// n new streams (hc_post's post_stream, the same floats as hc_post), stores them to X and to a
// shared tile [32 rows][n x 32], and the 8 warps run that tile against fn on the tensor cores as
// the tiled projection of ops_mhc.cu does (split TF32): warp w takes rows 16 (w % 2).. and a
// quarter of the step's K. (64 rows x 16 columns a step ran at ~60% of hc_post's bandwidth:
// 64-byte pieces of rows 64 KB apart.) Two
// tiles alternate, one barrier a step; a step's loads are issued before the step before it runs
// its products. The partials and Σ X'² go to the stash in the tiled
// projection's layout (row r, slice ks: slots ks (n_out + 1) + [0, n_out]), which
// hc_pre_finish_kernel reduces as it does that projection's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/mhc_common.cuh"
#include "backend/cuda/mma_tf32.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/ops_mhc_decode.h"

namespace dsv4::cuda::detail {
namespace {

constexpr int kN = 4;                           // streams (every DeepSeek-V4 config: hc_mult 4)
constexpr int kOut = (2 + kN) * kN;             // 24 projection rows
constexpr int kRows = 32, kThreads = 256;
constexpr int kCols4 = kThreads / kRows;        // float4 columns of each stream a step (32 floats: a line)
constexpr int kStepK = kN * kCols4 * 4;         // 128 projection columns a step
constexpr int kPitch = kStepK + 4;              // fragment loads: rows 4 banks apart, 32 lanes on 32 banks
constexpr int kRowGroups = kRows / 16, kKParts = kThreads / 32 / kRowGroups;  // warps: 16 rows x a K part
constexpr int kPartK = kStepK / kKParts;
constexpr int kMinStepsPerBlock = 4;

struct Tile {
  float x[kRows][kPitch];
  float f[kOut][kPitch];
};
struct Smem {
  Tile t[2];
  float comb[kRows][kN * kN];            // the rows' comb (post_stream reads it by pointer)
  float w[kRows][mhc::kMaxRoutedK];       // the rows' routed weights
};

struct Args {
  const float *post, *comb, *F, *F2;
  RoutedRows rt;
  const void* Xin;  // the old streams (fp32, or bf16 bits)
  void* Xout;       // the new ones (Xin itself, except fp32 -> bf16)
  const float* fn;  // [(2+n)n, n d]
  int64_t R, d4, slice4, ld;  // slice4: float4 columns of each stream a block; ld: the stash's row stride
  float* stash;
};

// The loads of one step (the old streams and hc_post's inputs at one float4 column): issued a
// step ahead, so that they are in flight while the tensor cores run the step before (with the
// loads and the products of a step in sequence, ~20 KB a block in flight for only part of the
// time bounded the first form at ~60% of hc_post's bandwidth).
// XIn bf16 (uint16_t): the old streams held as loaded (4 bf16 a uint2), widened when used.
template <bool kY16, typename XIn>
struct StepLoads {
  std::conditional_t<std::is_same_v<XIn, float>, float4, uint2> old[kN];
  mhc::PostLoads<kY16> in;
};

// kY16: the routed rows are bf16 (RoutedRows::Y16). XIn / XOut: the old / new streams as stored
// (float, or uint16_t bf16 bits); the tile takes the new streams as stored.
template <bool kY16, typename XIn = float, typename XOut = float>
__global__ void __launch_bounds__(kThreads, 2) hc_post_project_tiled_kernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, row = tid / kCols4, cc = tid % kCols4;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows, r = r0 + row, d4 = a.d4;
  const bool live = r < a.R;
  const int ks = static_cast<int>(blockIdx.y);
  const int64_t c_begin = ks * a.slice4, c_end = std::min(d4, c_begin + a.slice4);
  const int steps = static_cast<int>((c_end - c_begin) / kCols4);
  // The row's gates for the whole block: post_k in registers, comb in shared memory.
  float pk[kN];
#pragma unroll
  for (int k = 0; k < kN; ++k) pk[k] = live ? a.post[r * kN + k] : 0.f;
  if (cc == 0)
#pragma unroll
    for (int e = 0; e < kN * kN; ++e) S.comb[row][e] = live ? a.comb[r * kN * kN + e] : 0.f;
  // Every thread of the row reads the mask; one writes the weights.
  const uint32_t valid = live ? mhc::post_row(a.rt, r, cc == 0 ? S.w[row] : nullptr) : 0u;
  const bool has_f2 = a.F2 != nullptr, routed = a.rt.any();
  const auto* I4 = mhc::stream4(static_cast<const XIn*>(a.Xin)) + r * kN * d4;
  auto* O4 = mhc::stream4(static_cast<XOut*>(a.Xout)) + r * kN * d4;
  const int64_t nd = kN * d4 * 4;
  auto column = [&](int t) { return c_begin + int64_t(t) * kCols4 + cc; };
  auto load = [&](int t, StepLoads<kY16, XIn>& l) {
    if (!live || t >= steps) return;
    const int64_t c = column(t);
#pragma unroll
    for (int j = 0; j < kN; ++j) l.old[j] = I4[j * d4 + c];
    mhc::post_load(l.in, a.F, a.F2, a.rt, valid, r, d4, c);
  };
  // fn's columns of step t into tile b by cp.async (one commit group), issued a step ahead: tile
  // b's f was last read by step t - 2's products (done before step t - 1's barrier, after which
  // this is called). Fetched in the step that used it, its L2 round trip (12 KB) was waited on
  // right away every step.
  auto fetch_fn = [&](int t, int b) {
    if (t >= steps) return;
    for (int i = tid; i < kOut * kN * kCols4; i += kThreads) {
      const int o = i / (kN * kCols4), j = (i / kCols4) % kN, q4 = i % kCols4;
      const int64_t col = 4 * (c_begin + int64_t(t) * kCols4 + q4);
      detail::cp_async16(&S.t[b].f[o][j * kCols4 * 4 + 4 * q4], a.fn + o * nd + j * d4 * 4 + col);
    }
    detail::cp_async_commit();
  };
  // hc_post's new streams from the loads of step t into X and tile b's x.
  auto make = [&](int t, int b, const StepLoads<kY16, XIn>& l) {
    float4 nw[kN];
    if (live) {
      const float4 in = mhc::post_sum(l.in, valid, S.w[row], has_f2, routed);
      float4 old[kN];
#pragma unroll
      for (int j = 0; j < kN; ++j) old[j] = mhc::widen4(l.old[j]);
#pragma unroll
      for (int k = 0; k < kN; ++k)
        nw[k] = mhc::as_stored<XOut>(mhc::post_stream<kN>(in, pk[k], S.comb[row], k, kN, old));
      const int64_t c = column(t);
#pragma unroll
      for (int k = 0; k < kN; ++k) mhc::put4(O4 + k * d4 + c, nw[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) nw[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) *reinterpret_cast<float4*>(&S.t[b].x[row][k * kCols4 * 4 + 4 * cc]) = nw[k];
  };

  const int warp = tid >> 5, g = (tid & 31) >> 2, q = tid & 3;
  const int ra = (warp % kRowGroups) * 16 + g, k_part = (warp / kRowGroups) * kPartK;
  float acc[3][4] = {}, ss[2] = {};
  StepLoads<kY16, XIn> l;  // one set of registers: step t's loads are used up before step t + 1's are issued
  __syncthreads();  // comb
  fetch_fn(0, 0);
  load(0, l);
  for (int t = 0; t < steps; ++t) {
    const int b = t & 1;
    make(t, b, l);  // tile b's last reader (step t - 2) passed the barrier of step t - 1
    load(t + 1, l);
    detail::cp_async_wait<0>();  // fn of step t (asked for a step ago)
    __syncthreads();
    fetch_fn(t + 1, b ^ 1);  // tile b ^ 1's last reader (step t - 1) passed this barrier
#pragma unroll
    for (int k = k_part; k < k_part + kPartK; k += 8) {
      const Tile& T = S.t[b];
      const float x[4] = {T.x[ra][k + q], T.x[ra + 8][k + q], T.x[ra][k + q + 4], T.x[ra + 8][k + q + 4]};
      ss[0] += x[0] * x[0] + x[2] * x[2];
      ss[1] += x[1] * x[1] + x[3] * x[3];
      const float fb[3][2] = {{T.f[g][k + q], T.f[g][k + q + 4]},
                              {T.f[8 + g][k + q], T.f[8 + g][k + q + 4]},
                              {T.f[16 + g][k + q], T.f[16 + g][k + q + 4]}};
      mhc::mma_tf32_split_step(acc, x, fb);
    }
  }
  // The K parts: the warps of parts 1.. hand theirs to those of part 0 through tile 0 (free after
  // this barrier), which add them in part order and write the slice's partials.
  __syncthreads();
  constexpr int kRed = 14;  // a lane's 12 sums and 2 square sums
  static_assert((kThreads - kRowGroups * 32) * kRed <= kRows * kPitch, "the hand-over fits tile 0");
  auto red = [&](int w) { return &S.t[0].x[0][0] + ((w - kRowGroups) * 32 + (tid & 31)) * kRed; };
  if (warp >= kRowGroups) {
    float* mine = red(warp);
#pragma unroll
    for (int nb = 0; nb < 3; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[4 * nb + e] = acc[nb][e];
    mine[12] = ss[0];
    mine[13] = ss[1];
  }
  __syncthreads();
  if (warp >= kRowGroups) return;
  for (int part = 1; part < kKParts; ++part) {
    const float* theirs = red(warp + part * kRowGroups);
#pragma unroll
    for (int nb = 0; nb < 3; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nb][e] += theirs[4 * nb + e];
    ss[0] += theirs[12];
    ss[1] += theirs[13];
  }
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    // The row's Σ x² over its quad (each lane summed a quarter of the columns).
    ss[e] += __shfl_xor_sync(0xFFFFFFFFu, ss[e], 1);
    ss[e] += __shfl_xor_sync(0xFFFFFFFFu, ss[e], 2);
    const int64_t rr = r0 + ra + 8 * e;
    if (rr >= a.R) continue;
    float* dst = a.stash + rr * a.ld + ks * (kOut + 1);
#pragma unroll
    for (int nb = 0; nb < 3; ++nb)
#pragma unroll
      for (int h = 0; h < 2; ++h) dst[8 * nb + 2 * q + h] = acc[nb][2 * e + h];
    if (q == 0) dst[kOut] = ss[e];
  }
}

}  // namespace

int hc_post_project_tiled_slices(int64_t R, int64_t n, int64_t d) {
  if (R <= 4 || n != kN || d % (4 * kCols4) != 0) return 0;
  const int64_t steps = d / (4 * kCols4), row_blocks = ceil_div(R, kRows);
  // Blocks enough for ~4 waves of 3 a SM (a short last wave costs little), at least
  // kMinStepsPerBlock steps each, and the stash row must hold every slice.
  int64_t ks = ceil_div(12 * int64_t{sm_count()}, row_blocks);
  ks = std::min<int64_t>({ks, std::max<int64_t>(1, steps / kMinStepsPerBlock), d / (kOut + 1)});
  if (ks < 1) return 0;
  ks = ceil_div(steps, ceil_div(steps, ks));  // whole steps a slice, no empty slice
  return static_cast<int>(ks);
}

void hc_post_project_tiled(const float* post, const float* comb, const float* F, const float* F2,
                           const RoutedRows* routed, float* X, int64_t R, int64_t n, int64_t d, const float* fn,
                           float* stash, cudaStream_t s, StreamStore store, uint16_t* X16) {
  DSV4_CHECK(store == StreamStore::F32 || X16, "cuda::hc_post_project: bf16 streams need X16");
  const int ks = hc_post_project_tiled_slices(R, n, d);
  DSV4_CHECK(ks > 0, "cuda::hc_post_project: no tiled form for this shape");
  DSV4_CHECK(!routed || routed->K <= mhc::kMaxRoutedK, "cuda::hc_post_project: more than ", mhc::kMaxRoutedK,
             " routed rows a token");
  const int64_t steps = d / (4 * kCols4);
  Args a{};
  a.post = post;
  a.comb = comb;
  a.F = F;
  a.F2 = F2;
  if (routed) a.rt = *routed;
  a.Xin = store == StreamStore::BF16 ? static_cast<const void*>(X16) : X;
  a.Xout = store == StreamStore::F32 ? static_cast<void*>(X) : X16;
  a.fn = fn;
  a.R = R;
  a.d4 = d / 4;
  a.slice4 = ceil_div(steps, ks) * kCols4;
  a.ld = d;
  a.stash = stash;
  const int64_t row_blocks = ceil_div(R, kRows);
  DSV4_CHECK(row_blocks < (int64_t{1} << 31), "cuda::hc_post_project: too many rows");
  using Kernel = void (*)(Args);
  // [routed rows bf16][store]
  static const Kernel kernels[2][3] = {
      {hc_post_project_tiled_kernel<false>, hc_post_project_tiled_kernel<false, uint16_t, uint16_t>,
       hc_post_project_tiled_kernel<false, float, uint16_t>},
      {hc_post_project_tiled_kernel<true>, hc_post_project_tiled_kernel<true, uint16_t, uint16_t>,
       hc_post_project_tiled_kernel<true, float, uint16_t>}};
  static const bool smem_set = [] {
    for (const auto& row : kernels)
      for (Kernel k : row)
        DSV4_CUDA_CHECK(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sizeof(Smem))));
    return true;
  }();
  (void)smem_set;
  const Kernel kernel = kernels[a.rt.Y16 ? 1 : 0][static_cast<int>(store)];
  kernel<<<dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(ks)), kThreads, sizeof(Smem), s>>>(a);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda::detail
