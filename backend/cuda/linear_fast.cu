// FastLinear: tensor-core linears through cuBLASLt.
//  * FP8Block: activations quantised per row per 128 channels (act_quant.h), then an FP8 GEMM
//    with fp32 accumulation and VEC128 (1x128) fp32 scales on both operands; the weight's
//    128x128 E8M0 grid is expanded once per weight (and row range) to per-row 1x128 fp32 scales
//    and cached, so sub-ranges starting at any row (e.g. 96) work.
//  * Dense BF16: activations rounded to bf16, bf16 GEMM, fp32 accumulate and output.
//  * Decode (rows <= gemv_max_rows()), FP4, F32 and shapes cuBLASLt cannot take (K % 128 for FP8, K % 8 for
//    bf16, out % 16): linear_exact, on FP8-quantised activations for FP8/FP4 weights (the same
//    numbers the FP8 GEMM multiplies, fp32 accumulation; the GEMV is bandwidth bound anyway).
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/gemm_fp8_grouped.h"
#include "backend/cuda/gemv_fp8_mma.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/linear_kernels.cuh"
#include "backend/cuda/ops.h"

namespace dsv4::cuda {
namespace {

constexpr size_t kWorkspace = 32ull << 20;
// Grouped FP8 weights take the wgmma grouped GEMM up to this many rows; past it cuBLASLt per group
// (wo_a, bench_linear on an H100: 256 rows 70 vs 99 us, 4096 rows 866 vs 567 us).
constexpr int64_t kOwnGroupedMaxRows = 512;

void grow(DeviceBuffer& b, size_t bytes) { grow_scratch(b, bytes); }

// ws[kb * n + j] = scale(block row (row_begin + j) / 128, kb): 128x128 grid -> per-row 1x128.
__global__ void expand_scales_kernel(detail::DevWeight w, int64_t row_begin, int64_t n, int64_t kblocks, float* ws) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * kblocks) return;
  const int64_t kb = i / n, j = i % n;
  ws[i] = detail::scale_at(w, (row_begin + j) / 128, kb);
}

// ws[bi * l4 + kb] = scale(block row b0 + bi, kb), zero in the K padding.
__global__ void expand_blk_kernel(detail::DevWeight w, int64_t b0, int64_t nb, int64_t kblocks, int64_t l4,
                                  float* ws) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nb * l4) return;
  const int64_t bi = i / l4, kb = i % l4;
  ws[i] = kb < kblocks ? detail::scale_at(w, b0 + bi, kb) : 0.f;
}

__global__ void to_bf16_kernel(const float* x, int64_t rows, int64_t in, int64_t ldx, __nv_bfloat16* xb) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * in) return;
  const int64_t r = i / in, k = i % in;
  xb[i] = __float2bfloat16_rn(x[r * ldx + k]);
}

__global__ void bf16_to_f32_kernel(const __nv_bfloat16* yb, int64_t rows, int64_t n, float* y, int64_t ldy) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  y[(i / n) * ldy + i % n] = __bfloat162float(yb[i]);
}

unsigned blocks256(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

struct FastLinear::Impl {
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  enum Kind { kFp8 = 0, kBf16 = 1 };

  cublasLtHandle_t lt = nullptr;
  DeviceBuffer workspace{kWorkspace};
  DeviceBuffer xq, xs, xf, yb;
  std::map<std::tuple<const void*, const void*, int64_t, int64_t>, DeviceBuffer> wscales;
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int, int64_t, int64_t>, Plan> plans;
  DeviceBuffer yb16;
  bool warned = false;

  Impl() { DSV4_CUBLAS_CHECK(cublasLtCreate(&lt)); }
  ~Impl() {
    for (auto& [key, p] : plans) {
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.d) cublasLtMatrixLayoutDestroy(p.d);
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
    }
    if (lt) cublasLtDestroy(lt);
  }

  // m = outputs, n = activation rows, k = in; A = W (row-major [m, k] = column-major k x m, op T),
  // B = activations (column-major k x n, op N), D = y (column-major m x n = row-major [n, m]).
  // a_blk: weight scales as the native 128x128 grid (BLK128x128_32F) instead of per-row VEC128.
  // ldb: B's leading dimension (0: k). batch > 1: strided batches of A (m x k apart), B (k apart:
  // column slices of wider rows) and D (m apart), for block-diagonal (grouped) weights.
  Plan& plan(Kind kind, int64_t m, int64_t n, int64_t k, int64_t ldd, cudaDataType_t d_type = CUDA_R_32F,
             bool a_blk = false, int64_t ldb = 0, int64_t batch = 1) {
    if (ldb == 0) ldb = k;
    auto key = std::make_tuple(static_cast<int>(kind) + (a_blk ? 2 : 0), m, n, k, ldd, static_cast<int>(d_type), ldb,
                               batch);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan& p = plans[key];
    const cudaDataType_t in_t = kind == kFp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    DSV4_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opt = CUBLAS_OP_T, opn = CUBLAS_OP_N;
    DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opt, sizeof(opt)));
    DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opn, sizeof(opn)));
    if (kind == kFp8) {
      const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      const cublasLtMatmulMatrixScale_t amode = a_blk ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : mode;
      DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof(amode)));
      DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    }
    DSV4_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in_t, k, m, k));
    DSV4_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_t, k, n, ldb));
    DSV4_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, d_type, m, n, ldd));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      const int64_t strides[3] = {m * k, k, m};
      cublasLtMatrixLayout_t layouts[3] = {p.a, p.b, p.d};
      for (int i = 0; i < 3; ++i) {
        DSV4_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                           sizeof(count)));
        DSV4_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                           &strides[i], sizeof(strides[i])));
      }
    }
    cublasLtMatmulPreference_t pref;
    DSV4_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = kWorkspace;
    DSV4_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    if (kind == kFp8) {
      // Block-scaled FP8 is only offered when the scale pointers are set; placeholders here,
      // the real per-call pointers are set in matmul().
      const void* placeholder = workspace.get();
      DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder,
                                                       sizeof(placeholder)));
      DSV4_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder,
                                                       sizeof(placeholder)));
    }
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.d, p.d, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.ok) p.algo = res.algo;
    if (!p.ok && std::getenv("DSV4_LT_DEBUG"))
      std::fprintf(stderr, "cuBLASLt %zu heuristic: kind %d m=%lld n=%lld k=%lld d_type %d: status %d, %d algos\n",
                   cublasLtGetVersion(), static_cast<int>(kind), static_cast<long long>(m), static_cast<long long>(n),
                   static_cast<long long>(k), static_cast<int>(d_type), static_cast<int>(st), found);
    return p;
  }

  // Runs a plan; false (nothing enqueued) when cuBLASLt refuses, so the caller falls back.
  bool matmul(Plan& p, const void* a, const void* b, void* d, const float* a_scale, const float* b_scale,
              cudaStream_t s) {
    if (!p.ok) return false;
    if (a_scale) {
      DSV4_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
      DSV4_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    }
    const float alpha = 1.f, beta = 0.f;
    const cublasStatus_t st = cublasLtMatmul(lt, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo,
                                             workspace.get(), kWorkspace, s);
    if (st != CUBLAS_STATUS_SUCCESS) p.ok = false;
    return st == CUBLAS_STATUS_SUCCESS;
  }

  void warn_fallback(const char* what, int64_t m, int64_t n, int64_t k) {
    if (warned) return;
    warned = true;
    std::fprintf(stderr, "dsv4 FastLinear: cuBLASLt refused %s GEMM m=%lld n=%lld k=%lld; using linear_exact\n", what,
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
  }

  // blk = false: per-row [kb][n] (row fastest); true: the 128x128 grid [ceil(n/128)][L4] with
  // K blocks padded to a multiple of 4 (row_begin % 128 == 0).
  const float* weight_scales(const WeightView& w, int64_t row_begin, int64_t n, cudaStream_t s, bool blk = false) {
    auto key = std::make_tuple(static_cast<const void*>(w.data), static_cast<const void*>(w.scale),
                               blk ? -1 - row_begin : row_begin, n);
    auto it = wscales.find(key);
    if (it != wscales.end()) return it->second.as<float>();
    const int64_t kb = (w.in + 127) / 128;
    DeviceBuffer buf;
    if (blk) {
      const int64_t l4 = (kb + 3) / 4 * 4, nb = (n + 127) / 128;
      buf = DeviceBuffer(static_cast<size_t>(nb * l4) * sizeof(float));
      expand_blk_kernel<<<blocks256(nb * l4), 256, 0, s>>>(detail::dev_weight(w), row_begin / 128, nb, kb, l4,
                                                          buf.as<float>());
    } else {
      buf = DeviceBuffer(static_cast<size_t>(n * kb) * sizeof(float));
      expand_scales_kernel<<<blocks256(n * kb), 256, 0, s>>>(detail::dev_weight(w), row_begin, n, kb, buf.as<float>());
    }
    DSV4_CUDA_LAUNCH_CHECK();
    note_scratch_alloc();  // a graph captured around this first use would replay the expansion
    return wscales.emplace(key, std::move(buf)).first->second.as<float>();
  }

  // Per-row VEC128 scales of the groups' row ranges one after another: [g][kb][ng], the batch
  // stride of a strided-batched GEMM over the groups.
  const float* grouped_weight_scales(const WeightView& w, int64_t groups, cudaStream_t s) {
    const int64_t ng = w.out / groups, kb = (w.in + 127) / 128;
    auto key = std::make_tuple(static_cast<const void*>(w.data), static_cast<const void*>(w.scale),
                               std::numeric_limits<int64_t>::min() + groups, ng);
    auto it = wscales.find(key);
    if (it != wscales.end()) return it->second.as<float>();
    DeviceBuffer buf(static_cast<size_t>(w.out * kb) * sizeof(float));
    for (int64_t g = 0; g < groups; ++g)
      expand_scales_kernel<<<blocks256(ng * kb), 256, 0, s>>>(detail::dev_weight(w), g * ng, ng, kb,
                                                              buf.as<float>() + g * ng * kb);
    DSV4_CUDA_LAUNCH_CHECK();
    note_scratch_alloc();
    return wscales.emplace(key, std::move(buf)).first->second.as<float>();
  }

  // Grouped (block-diagonal) FP8 weight past the GEMV sizes (groups = 1: a plain one): the
  // activations of all groups quantised in one launch (with the inverse RoPE when rope is set),
  // then the wgmma grouped GEMM (own = true), or one strided-batched cuBLASLt GEMM over the
  // groups, or one GEMM per group where cuBLASLt has no batched block-scaled kernel (per group,
  // each a quantisation and a GEMM of a 16-CTA grid, wo_a at 256 rows took ~120 us). False
  // (nothing enqueued) when the shape does not fit.
  // fp8_grouped's activations: rows padded to 4 for cuBLASLt, none with the rope (or own GEMM).
  static int64_t grouped_rows_pad(int64_t rows, bool rope) { return rope ? rows : (rows + 3) / 4 * 4; }
  // Whether fp8_grouped takes (w, groups) at these rows; own: the wgmma grouped GEMM runs it.
  bool fp8_grouped_takes(const WeightView& w, int64_t groups, int64_t rows, bool rope, bool& own) const {
    const int64_t k = w.in, ng = w.out / groups;
    own = own && (groups == 1 || rows <= kOwnGroupedMaxRows) && detail::fp8_grouped_gemm_ok(detail::dev_weight(w), groups);
    if (k % 128 != 0 || ng % 16 != 0 || !aligned16(w.data)) return false;
    return own || grouped_rows_pad(rows, rope) % 4 == 0;
  }
  void grow_grouped_input(int64_t rows_pad, int64_t cols) {
    grow(xq, static_cast<size_t>(rows_pad * cols));
    grow(xs, static_cast<size_t>(rows_pad * (cols / 128)) * sizeof(float));
  }
  bool fp8_grouped(const WeightView& w, int64_t groups, float* x, int64_t rows, float* y, int64_t ldx, int64_t ldy,
                   const InverseRope* rope, bool own, cudaStream_t s) {
    const int64_t cols = groups * w.in, rows_pad = grouped_rows_pad(rows, rope != nullptr);
    if (!fp8_grouped_takes(w, groups, rows, rope != nullptr, own) || (rope && ldx != cols)) return false;
    grow_grouped_input(rows_pad, cols);
    if (rope)
      act_quant_fp8_inverse_rope(x, rows, cols, ldx, *rope, xq.as<uint8_t>(), cols, xs.as<float>(), s);
    else
      act_quant_fp8(x, rows, cols, ldx, rows_pad, xq.as<uint8_t>(), cols, xs.as<float>(), s);
    return grouped_on_quantised(w, groups, rows, rows_pad, y, ldy, own, s);
  }
  // The GEMM half of fp8_grouped, on xq / xs as quantised.
  bool grouped_on_quantised(const WeightView& w, int64_t groups, int64_t rows, int64_t rows_pad, float* y, int64_t ldy,
                            bool own, cudaStream_t s) {
    const int64_t k = w.in, ng = w.out / groups, cols = groups * k, kbg = k / 128;
    if (own) {
      detail::fp8_grouped_gemm(detail::dev_weight(w), groups, xq.as<uint8_t>(), cols, xs.as<float>(), rows_pad, rows,
                               y, ldy, s);
      return true;
    }
    if (groups == 1) return false;  // plain weights: fp8_gemm
    const float* ws = grouped_weight_scales(w, groups, s);
    const int64_t sb = kbg * rows_pad;  // one group's activation scales
    if (with_output(y, rows, rows_pad, w.out, ldy, s, [&](float* d, int64_t ldd) {
          if (batched_ok && matmul(plan(kFp8, ng, rows_pad, k, ldd, CUDA_R_32F, false, cols, groups), w.data, xq.get(),
                                   d, ws, xs.as<float>(), s))
            return true;
          if (batched_ok)
            std::fprintf(stderr, "dsv4 FastLinear: cuBLASLt refused the strided-batched block-scaled FP8 GEMM "
                                 "(%lld groups of %lld x %lld x %lld); one GEMM per group\n",
                         static_cast<long long>(groups), static_cast<long long>(ng), static_cast<long long>(rows_pad),
                         static_cast<long long>(k));
          batched_ok = false;
          for (int64_t g = 0; g < groups; ++g)
            if (!matmul(plan(kFp8, ng, rows_pad, k, ldd, CUDA_R_32F, false, cols), w.data + g * ng * k,
                        xq.as<uint8_t>() + g * k, d + g * ng, ws + g * ng * kbg, xs.as<float>() + g * sb, s))
              return false;  // only the first can refuse (plans are per shape), before anything ran
          return true;
        }))
      return true;
    return false;
  }
  // False once cuBLASLt refused the strided-batched block-scaled GEMM (DSV4_LT_BATCHED=0 too).
  bool batched_ok = [] {
    const char* env = std::getenv("DSV4_LT_BATCHED");
    return !(env && env[0] == '0');
  }();

  // D either straight into y, or (padded rows / unaligned y) into yb, then copied.
  template <class Gemm>
  bool with_output(float* y, int64_t rows, int64_t rows_pad, int64_t n, int64_t ldy, cudaStream_t s, Gemm gemm) {
    if (rows_pad == rows && ldy % 4 == 0 && aligned16(y)) return gemm(y, ldy);
    grow(yb, static_cast<size_t>(rows_pad * n) * sizeof(float));
    if (!gemm(yb.as<float>(), n)) return false;
    DSV4_CUDA_CHECK(cudaMemcpy2DAsync(y, ldy * sizeof(float), yb.get(), n * sizeof(float), n * sizeof(float), rows,
                                      cudaMemcpyDeviceToDevice, s));
    return true;
  }

  bool fp8_gemm(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t n,
                int64_t ldx, int64_t ldy, cudaStream_t s) {
    quantise_for_gemm(x, rows, w.in, ldx, s);
    return fp8_gemm_quantised(w, rows, y, row_begin, n, ldy, s);
  }
  // x's rows as fp8_gemm's operand (xq, xs; rows padded to 4).
  void quantise_for_gemm(const float* x, int64_t rows, int64_t k, int64_t ldx, cudaStream_t s) {
    const int64_t kb = k / 128, rows_pad = (rows + 3) / 4 * 4;
    grow(xq, static_cast<size_t>(rows_pad * k));
    grow(xs, static_cast<size_t>(rows_pad * kb) * sizeof(float));
    act_quant_fp8(x, rows, k, ldx, rows_pad, xq.as<uint8_t>(), k, xs.as<float>(), s);
  }
  bool fp8_gemm_quantised(const WeightView& w, int64_t rows, float* y, int64_t row_begin, int64_t n, int64_t ldy,
                          cudaStream_t s) {
    const int64_t k = w.in, rows_pad = (rows + 3) / 4 * 4;
    const float* ws = weight_scales(w, row_begin, n, s);
    const uint8_t* a = w.data + row_begin * k;
    if (with_output(y, rows, rows_pad, n, ldy, s, [&](float* d, int64_t ldd) {
          return matmul(plan(kFp8, n, rows_pad, k, ldd), a, xq.get(), d, ws, xs.as<float>(), s);
        }))
      return true;
    // Then the weight's native 128x128 grid (row ranges on 128-row blocks only).
    const float* wsb = row_begin % 128 == 0 ? weight_scales(w, row_begin, n, s, true) : nullptr;
    if (wsb && with_output(y, rows, rows_pad, n, ldy, s, [&](float* d, int64_t ldd) {
          return matmul(plan(kFp8, n, rows_pad, k, ldd, CUDA_R_32F, true), a, xq.get(), d, wsb, xs.as<float>(), s);
        }))
      return true;
    // Block-scaled FP8 may only offer 16-bit outputs: bf16 D (fp32 accumulation inside), then
    // widened into y. Costs one bf16 rounding of the result (~2e-3 relative).
    grow(yb16, static_cast<size_t>(rows_pad * n) * 2);
    bool ok = matmul(plan(kFp8, n, rows_pad, k, n, CUDA_R_16BF), a, xq.get(), yb16.get(), ws, xs.as<float>(), s);
    if (!ok && wsb)
      ok = matmul(plan(kFp8, n, rows_pad, k, n, CUDA_R_16BF, true), a, xq.get(), yb16.get(), wsb, xs.as<float>(), s);
    if (!ok) return false;
    bf16_to_f32_kernel<<<blocks256(rows * n), 256, 0, s>>>(yb16.as<__nv_bfloat16>(), rows, n, y, ldy);
    DSV4_CUDA_LAUNCH_CHECK();
    return true;
  }

  // fp8_gemm with a bf16 D straight into y16 [rows, w.out] (no padding rows: rows % 4 == 0).
  bool fp8_gemm_bf16(const WeightView& w, const float* x, int64_t rows, uint16_t* y16, cudaStream_t s) {
    const int64_t k = w.in, kb = k / 128, n = w.out;
    if (rows % 4 != 0 || reinterpret_cast<uintptr_t>(y16) % 16 != 0) return false;
    grow(xq, static_cast<size_t>(rows * k));
    grow(xs, static_cast<size_t>(rows * kb) * sizeof(float));
    act_quant_fp8(x, rows, k, k, rows, xq.as<uint8_t>(), k, xs.as<float>(), s);
    if (matmul(plan(kFp8, n, rows, k, n, CUDA_R_16BF), w.data, xq.get(), y16, weight_scales(w, 0, n, s),
               xs.as<float>(), s))
      return true;
    return matmul(plan(kFp8, n, rows, k, n, CUDA_R_16BF, true), w.data, xq.get(), y16,
                  weight_scales(w, 0, n, s, true), xs.as<float>(), s);
  }

  bool bf16_gemm(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t n,
                 int64_t ldx, int64_t ldy, cudaStream_t s) {
    round_for_bf16_gemm(x, rows, w.in, ldx, s);
    return bf16_gemm_rounded(w, rows, y, row_begin, n, ldy, s);
  }
  // x's rows as bf16_gemm's operand (xq as bf16).
  void round_for_bf16_gemm(const float* x, int64_t rows, int64_t k, int64_t ldx, cudaStream_t s) {
    grow(xq, static_cast<size_t>(rows * k) * 2);
    to_bf16_kernel<<<blocks256(rows * k), 256, 0, s>>>(x, rows, k, ldx, xq.as<__nv_bfloat16>());
    DSV4_CUDA_LAUNCH_CHECK();
  }
  bool bf16_gemm_rounded(const WeightView& w, int64_t rows, float* y, int64_t row_begin, int64_t n, int64_t ldy,
                         cudaStream_t s) {
    const int64_t k = w.in;
    const uint8_t* a = w.data + row_begin * k * 2;
    return with_output(y, rows, rows, n, ldy, s, [&](float* d, int64_t ldd) {
      return matmul(plan(kBf16, n, rows, k, ldd), a, xq.get(), d, nullptr, nullptr, s);
    });
  }

  // FP8 weights at <= 8 rows on tensor cores (gemv_fp8_mma.cu); groups > 1: block-diagonal with
  // x of groups * w.in columns. False (nothing enqueued) when the shape does not fit.
  DeviceBuffer xq8, xs8;
  // Past 8 rows (2-4 activation blocks per weight fragment, fewer resident warps) the GEMV beats
  // cuBLASLt on small weights and on grouped ones (one launch for all groups), not on 32 MB
  // plain ones (bench_linear, 32 rows: wq_a 16.1 vs 18.9 us, wo_b 34.4 vs 25.0 us).
  int64_t wide_max_bytes = FastLinear::kDefaultWideMmaMaxBytes;
  bool mma_fp8_fits(const WeightView& w, int64_t rows, int64_t row_begin, int64_t n, int64_t groups) const {
    const bool wide_ok = rows <= 8 || groups > 1 || n * w.in <= wide_max_bytes;
    return w.format == WeightFormat::FP8Block && rows <= detail::kMmaGemvMaxRows && wide_ok &&
           detail::fp8_mma_gemv_ok(detail::dev_weight(w), row_begin, n, n / groups);
  }
  void quantise_for_mma(const float* x, int64_t rows, int64_t cols, int64_t ldx, cudaStream_t s) {
    grow(xq8, static_cast<size_t>(rows * cols));
    grow(xs8, static_cast<size_t>(rows * (cols / 128)) * sizeof(float));
    act_quant_fp8(x, rows, cols, ldx, rows, xq8.as<uint8_t>(), cols, xs8.as<float>(), s);
  }
  void mma_on_quantised(const WeightView& w, int64_t rows, float* y, int64_t row_begin, int64_t n, int64_t ldy,
                        int64_t groups, cudaStream_t s) {
    const int64_t cols = groups * w.in;
    detail::fp8_mma_gemv(detail::dev_weight(w), xq8.as<uint8_t>(), cols, xs8.as<float>(), rows, static_cast<int>(rows),
                         y, row_begin, n, ldy, n / groups, groups > 1 ? w.in : 0, s);
  }
  bool mma_fp8_inverse_rope(const WeightView& w, float* x, int64_t rows, float* y, int64_t ldx, int64_t ldy,
                            int64_t groups, const InverseRope& rope, cudaStream_t s) {
    if (!mma_fp8_fits(w, rows, 0, w.out, groups)) return false;
    const int64_t cols = groups * w.in;
    grow(xq8, static_cast<size_t>(rows * cols));
    grow(xs8, static_cast<size_t>(rows * (cols / 128)) * sizeof(float));
    act_quant_fp8_inverse_rope(x, rows, cols, ldx, rope, xq8.as<uint8_t>(), cols, xs8.as<float>(), s);
    mma_on_quantised(w, rows, y, 0, w.out, ldy, groups, s);
    return true;
  }
  bool mma_fp8(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t n, int64_t ldx,
               int64_t ldy, int64_t groups, cudaStream_t s) {
    if (!mma_fp8_fits(w, rows, row_begin, n, groups)) return false;
    quantise_for_mma(x, rows, groups * w.in, ldx, s);
    mma_on_quantised(w, rows, y, row_begin, n, ldy, groups, s);
    return true;
  }

  // linear_exact on FP8-quantised activations (official W8A8 / W4A8 numerics).
  void exact_on_quantised(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin,
                          int64_t row_end, int64_t ldx, int64_t ldy, cudaStream_t s) {
    grow(xf, static_cast<size_t>(rows * w.in) * sizeof(float));
    act_fake_quant_fp8(x, rows, w.in, ldx, xf.as<float>(), w.in, s);
    linear_exact(w, xf.as<float>(), rows, y, row_begin, row_end, w.in, ldy, s);
  }
};

FastLinear::FastLinear() : impl_(std::make_unique<Impl>()) {
  if (const char* env = std::getenv("DSV4_FAST_GEMV_MAX_ROWS")) set_gemv_max_rows(std::atoi(env));
  if (const char* env = std::getenv("DSV4_FP8_MMA_GEMV")) mma_gemv_ = std::string(env) != "0";
  if (const char* env = std::getenv("DSV4_FP8_GEMM")) set_fp8_gemm(std::atoi(env));
}

void FastLinear::set_fp8_gemm(int mode) {
  DSV4_CHECK(mode >= -1 && mode <= 1, "FastLinear::set_fp8_gemm: -1 (cuBLASLt), 0 (grouped weights on the wgmma "
             "GEMM), 1 (all FP8 weights on it)");
  fp8_gemm_ = mode;
}

void FastLinear::set_gemv_max_rows(int r) {
  DSV4_CHECK(r >= 0 && r <= detail::kGemvMaxRows, "FastLinear: GEMV row bound must be in [0, ", detail::kGemvMaxRows,
             "]");
  gemv_max_rows_ = r;
}
FastLinear::~FastLinear() = default;

void FastLinear::set_wide_mma_max_bytes(int64_t b) { impl_->wide_max_bytes = b; }

void FastLinear::forget_weights() {
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());  // queued GEMMs may still read the scales
  impl_->wscales.clear();
}

void FastLinear::run(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
                     int64_t ldx, int64_t ldy, cudaStream_t s) {
  DSV4_CHECK(row_begin >= 0 && row_end <= w.out && row_begin <= row_end, "FastLinear: bad row range");
  const int64_t n = row_end - row_begin;
  if (rows <= 0 || n == 0) return;
  const bool big = rows > gemv_max_rows_ && n % 16 == 0 && aligned16(w.data);
  if (w.format == WeightFormat::FP8Block) {
    if (mma_gemv_ && impl_->mma_fp8(w, x, rows, y, row_begin, n, ldx, ldy, 1, s)) return;
    if (big && w.in % 128 == 0) {
      if (fp8_gemm_ > 0 && row_begin == 0 && n == w.out &&
          impl_->fp8_grouped(w, 1, const_cast<float*>(x), rows, y, ldx, ldy, nullptr, true, s))
        return;
      if (impl_->fp8_gemm(w, x, rows, y, row_begin, n, ldx, ldy, s)) return;
      impl_->warn_fallback("FP8", n, rows, w.in);
    }
    return impl_->exact_on_quantised(w, x, rows, y, row_begin, row_end, ldx, ldy, s);
  }
  if (w.format == WeightFormat::FP4Group32) return impl_->exact_on_quantised(w, x, rows, y, row_begin, row_end, ldx, ldy, s);
  if (w.dtype == DType::BF16 && big && w.in % 8 == 0) {
    if (impl_->bf16_gemm(w, x, rows, y, row_begin, n, ldx, ldy, s)) return;
    impl_->warn_fallback("bf16", n, rows, w.in);
  }
  linear_exact(w, x, rows, y, row_begin, row_end, ldx, ldy, s);
}

bool FastLinear::run_bf16_out(const WeightView& w, const float* x, int64_t rows, uint16_t* y16, cudaStream_t s) {
  if (rows <= 0 || w.format != WeightFormat::FP8Block || fp8_gemm_ > 0) return false;
  // run()'s order: the tensor-core GEMV where it fits, cuBLASLt past the GEMV sizes.
  if (mma_gemv_ && impl_->mma_fp8_fits(w, rows, 0, w.out, 1)) return false;
  if (rows <= gemv_max_rows_ || w.out % 16 != 0 || !aligned16(w.data) || w.in % 128 != 0) return false;
  return impl_->fp8_gemm_bf16(w, x, rows, y16, s);
}

void FastLinear::run_shared_input(std::initializer_list<Output> outs, const float* x, int64_t rows, int64_t ldx,
                                  cudaStream_t s) {
  if (rows <= 0 || outs.size() == 0) return;
  const int64_t k = outs.begin()->w->in;
  bool shared = mma_gemv_;
  for (const Output& o : outs) {
    DSV4_CHECK(o.w->in == k, "FastLinear::run_shared_input: the weights disagree on the input width");
    shared = shared && impl_->mma_fp8_fits(*o.w, rows, 0, o.w->out, 1);
  }
  if (!shared) {
    // Past the GEMV sizes: where every weight takes run()'s cuBLASLt path of one kind (FP8 block,
    // or dense bf16), x is quantised (or rounded) once for all of them: the same operand bytes as
    // one run() each, one pass over x instead of one per weight.
    const auto gemm_kind = [&](const WeightView& w) {
      if (rows <= gemv_max_rows_ || w.out % 16 != 0 || !aligned16(w.data)) return 0;
      if (w.format == WeightFormat::FP8Block && w.in % 128 == 0 && fp8_gemm_ <= 0 &&
          !(mma_gemv_ && impl_->mma_fp8_fits(w, rows, 0, w.out, 1)))
        return 1;
      if (w.format != WeightFormat::FP8Block && w.format != WeightFormat::FP4Group32 && w.dtype == DType::BF16 &&
          w.in % 8 == 0)
        return 2;
      return 0;
    };
    static const bool share_past_gemv = [] {  // DSV4_SHARED_INPUT_GEMM=0: one pass over x a weight (A/B)
      const char* e = std::getenv("DSV4_SHARED_INPUT_GEMM");
      return !(e && e[0] == '0');
    }();
    int kind = share_past_gemv ? gemm_kind(*outs.begin()->w) : 0;
    for (const Output& o : outs) kind = gemm_kind(*o.w) == kind ? kind : 0;
    if (kind == 0 || outs.size() < 2) {
      for (const Output& o : outs) run(*o.w, x, rows, o.y, 0, o.w->out, ldx, o.ldy, s);
      return;
    }
    if (kind == 1)
      impl_->quantise_for_gemm(x, rows, k, ldx, s);
    else
      impl_->round_for_bf16_gemm(x, rows, k, ldx, s);
    for (const Output& o : outs) {
      const bool done = kind == 1 ? impl_->fp8_gemm_quantised(*o.w, rows, o.y, 0, o.w->out, o.ldy, s)
                                  : impl_->bf16_gemm_rounded(*o.w, rows, o.y, 0, o.w->out, o.ldy, s);
      if (!done) {  // run()'s fallback for this weight (cuBLASLt refused the shape)
        impl_->warn_fallback(kind == 1 ? "FP8" : "bf16", o.w->out, rows, k);
        if (kind == 1)
          impl_->exact_on_quantised(*o.w, x, rows, o.y, 0, o.w->out, ldx, o.ldy, s);
        else
          linear_exact(*o.w, x, rows, o.y, 0, o.w->out, ldx, o.ldy, s);
      }
    }
    return;
  }
  impl_->quantise_for_mma(x, rows, k, ldx, s);
  // One launch for both where the shapes allow (fp8_mma_gemv_pair); DSV4_GEMV_PAIR=0: two (A/B).
  static const bool pair = [] {
    const char* e = std::getenv("DSV4_GEMV_PAIR");
    return !(e && e[0] == '0');
  }();
  if (pair && outs.size() == 2) {
    const Output &a = outs.begin()[0], &b = outs.begin()[1];
    const uint8_t* xq = impl_->xq8.as<uint8_t>();
    const detail::GemvOut ga{detail::dev_weight(*a.w), a.y, 0, a.w->out, a.ldy, a.w->out, 0};
    const detail::GemvOut gb{detail::dev_weight(*b.w), b.y, 0, b.w->out, b.ldy, b.w->out, 0};
    return detail::fp8_mma_gemv_pair(ga, gb, xq, k, impl_->xs8.as<float>(), rows, static_cast<int>(rows), s);
  }
  for (const Output& o : outs) impl_->mma_on_quantised(*o.w, rows, o.y, 0, o.w->out, o.ldy, 1, s);
}

bool FastLinear::quantise_rms_norm(const WeightView& w, float* x, const float* gamma, float eps, int64_t rows,
                                   cudaStream_t s) {
  static const bool on = [] {
    const char* e = std::getenv("DSV4_NORM_QUANT");
    return !(e && e[0] == '0');
  }();
  if (!on || !mma_gemv_ || rows <= 0 || !impl_->mma_fp8_fits(w, rows, 0, w.out, 1)) return false;
  grow(impl_->xq8, static_cast<size_t>(rows * w.in));
  grow(impl_->xs8, static_cast<size_t>(rows * (w.in / 128)) * sizeof(float));
  return act_quant_fp8_rms_norm(x, gamma, eps, rows, w.in, impl_->xq8.as<uint8_t>(), w.in, impl_->xs8.as<float>(), s);
}

void FastLinear::run_quantised(const WeightView& w, int64_t rows, float* y, int64_t ldy, cudaStream_t s) {
  impl_->mma_on_quantised(w, rows, y, 0, w.out, ldy, 1, s);
}

void FastLinear::run_grouped(const WeightView& w, int64_t groups, const float* x, int64_t rows, float* y, int64_t ldx,
                             int64_t ldy, cudaStream_t s) {
  DSV4_CHECK(groups >= 1 && w.out % groups == 0, "FastLinear::run_grouped: ", w.out, " rows do not split in ", groups,
             " groups");
  const int64_t ng = w.out / groups, k = w.in;
  if (rows <= 0) return;
  if (mma_gemv_ && w.format == WeightFormat::FP8Block && k % 128 == 0 &&
      impl_->mma_fp8(w, x, rows, y, 0, w.out, ldx, ldy, groups, s))
    return;
  if (rows > gemv_max_rows_ && groups > 1 && w.format == WeightFormat::FP8Block &&
      impl_->fp8_grouped(w, groups, const_cast<float*>(x), rows, y, ldx, ldy, nullptr, fp8_gemm_ >= 0, s))
    return;  // (x is only written with a rope)
  if (rows <= gemv_max_rows_) {
    const bool quantised = w.format == WeightFormat::FP8Block || w.format == WeightFormat::FP4Group32;
    if (!quantised) return linear_exact_grouped(w, groups, x, rows, y, ldx, ldy, s);
    if (k % 128 == 0) {  // 128-channel quant blocks never straddle a group: quantise all at once
      grow(impl_->xf, static_cast<size_t>(rows * groups * k) * sizeof(float));
      act_fake_quant_fp8(x, rows, groups * k, ldx, impl_->xf.as<float>(), groups * k, s);
      return linear_exact_grouped(w, groups, impl_->xf.as<float>(), rows, y, groups * k, ldy, s);
    }
  }
  for (int64_t g = 0; g < groups; ++g) run(w, x + g * k, rows, y + g * ng, g * ng, (g + 1) * ng, ldx, ldy, s);
}

bool FastLinear::grouped_input_fp8(const WeightView& w, int64_t groups, int64_t rows, uint8_t** q, float** scales) {
  const int64_t cols = groups * w.in;
  if (rows <= 0 || groups < 1 || w.out % groups != 0 || w.format != WeightFormat::FP8Block) return false;
  // run_grouped_inverse_rope's order: the GEMV where it fits, then the grouped GEMM.
  if (mma_gemv_ && w.in % 128 == 0 && impl_->mma_fp8_fits(w, rows, 0, w.out, groups)) return false;
  bool own = fp8_gemm_ >= 0;
  if (rows <= gemv_max_rows_ || groups <= 1 || !impl_->fp8_grouped_takes(w, groups, rows, true, own)) return false;
  impl_->grow_grouped_input(rows, cols);
  *q = impl_->xq.as<uint8_t>();
  *scales = impl_->xs.as<float>();
  return true;
}

void FastLinear::run_grouped_quantised(const WeightView& w, int64_t groups, int64_t rows, float* y, int64_t ldy,
                                       cudaStream_t s) {
  bool own = fp8_gemm_ >= 0;
  DSV4_CHECK(impl_->fp8_grouped_takes(w, groups, rows, true, own),
             "FastLinear::run_grouped_quantised: no grouped_input_fp8 for this weight and row count");
  DSV4_CHECK(impl_->grouped_on_quantised(w, groups, rows, rows, y, ldy, own, s),
             "FastLinear::run_grouped_quantised: cuBLASLt refused the grouped FP8 GEMM");
}

void FastLinear::run_grouped_inverse_rope(const WeightView& w, int64_t groups, float* x, int64_t rows, float* y,
                                          int64_t ldx, int64_t ldy, const InverseRope& rope, cudaStream_t s) {
  const int64_t cols = groups * w.in;
  DSV4_CHECK(rope.head_len > 0 && cols % rope.head_len == 0 && ldx == cols,
             "FastLinear::run_grouped_inverse_rope: x must be contiguous rows of heads of ", rope.head_len,
             " channels (", cols, " wide, ldx ", ldx, ")");
  if (rows <= 0) return;
  if (mma_gemv_ && w.format == WeightFormat::FP8Block && w.in % 128 == 0 &&
      impl_->mma_fp8_inverse_rope(w, x, rows, y, ldx, ldy, groups, rope, s))
    return;
  if (rows > gemv_max_rows_ && groups > 1 && w.format == WeightFormat::FP8Block &&
      impl_->fp8_grouped(w, groups, x, rows, y, ldx, ldy, &rope, fp8_gemm_ >= 0, s))
    return;
  cuda::rope(x, rows, cols / rope.head_len, rope.head_len, rope.inv_freq, rope.pairs, rope.pos, true, s);
  run_grouped(w, groups, x, rows, y, ldx, ldy, s);
}

}  // namespace dsv4::cuda
