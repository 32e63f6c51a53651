// CUDA kernels of the DeepSeek-V4 forward, one host function each. Every pointer is a device
// pointer; every call enqueues on `stream` and checks the launch. Activations are fp32 (the CPU
// reference's layout), so each op has a CPU twin in backend/cpu or model/ and a parity test.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/inverse_rope.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

// ---- elementwise / normalisation -------------------------------------------------------------

// X[r, i, :] = dequant(table[tok[r], :]) for i < copies (mHC stream expansion).
void embed(const WeightView& table, const int32_t* tok, int64_t rows, int64_t copies, float* X, cudaStream_t s);

// y = gamma ⊙ x / sqrt(mean(x²) + eps) per row of n; gamma == nullptr: unweighted. In place OK.
void rms_norm(const float* x, const float* gamma, float* y, int64_t rows, int64_t n, float eps, cudaStream_t s);

// x [rows, heads, len]: interleaved-pair RoPE on the last 2*pairs channels of each head at
// angle pos[r] * inv_freq[i] (fp32 angle, as the reference), negated when inverse.
void rope(float* x, int64_t rows, int64_t heads, int64_t len, const float* inv_freq, int64_t pairs,
          const int64_t* pos, bool inverse, cudaStream_t s);

// rms_norm over each head's len channels (gamma [len] or nullptr), then rope (forward), in place
// in one launch (q-norm + RoPE, kv-norm + RoPE of the attention). bf16_out: the result rounded
// to bf16 (nearest even) into bf16_out [rows, heads, len] instead (a model that stores its
// attention keys as bf16); x is then scratch (unchanged, or normalised in place by the fallback
// for unaligned shapes).
void rms_norm_rope(float* x, const float* gamma, int64_t rows, int64_t heads, int64_t len, float eps,
                   const float* inv_freq, int64_t pairs, const int64_t* pos, cudaStream_t s, void* bf16_out = nullptr);
// The same on bf16 input (x16 [rows, heads, len] bf16 bits, widened exactly): the result rounded
// back in place, rms_norm_rope(widened x, ..., bf16_out) bit for bit; or with f32_out, written
// there in fp32 (rms_norm_rope on the widened x, in place, bit for bit).
void rms_norm_rope_bf16(void* x16, const float* gamma, int64_t rows, int64_t heads, int64_t len, float eps,
                        const float* inv_freq, int64_t pairs, const int64_t* pos, cudaStream_t s,
                        float* f32_out = nullptr);

// ---- mHC (model/mhc.h is the twin) ---------------------------------------------------------------

struct HcParams {
  const float* fn;     // [(2+n)n, n*d] (sub-layer) or [n, n*d] (head)
  const float* base;   // [(2+n)n] or [n]
  const float* scale;  // [3] or [1]
};

// How hc_post / hc_post_project keep the streams. Fast precision past 4 rows stores them as bf16
// (the official keeps its residual in bf16; half the bytes of the mHC ops' largest stream): BF16
// in place on X16 (bf16 bits, [R, n, d]); F32ToBF16 reads fp32 X and writes X16 (the first
// sub-layer after the fp32 embedding); F32 in place on X (every other case).
enum class StreamStore { F32, BF16, F32ToBF16 };
// Whether the bf16 forms take R rows of n streams of d (hc_post_project's tiled form: past 4
// rows, n = 4, d % 32 == 0, and the projection in hc_post not switched off).
bool hc_streams_bf16_ok(int64_t R, int64_t n, int64_t d);

// pre/post [R, n], comb [R, n, n] (Sinkhorn, `iters` rounds), u [R, d] = Σ pre_i X_i, or with
// norm_w the sub-layer's input norm of it, rms_norm(u, norm_w, norm_eps) (fused at decode sizes).
// With gates_s (and `projected`, an event): pre / post / comb are written on gates_s, which waits
// for the shared projection (recorded on `projected`), while s mixes u: the caller joins gates_s
// before hc_post, and the Sinkhorn chain is off s's critical path. Same bits either way. At up
// to 4 rows everything is one launch on s (ops_mhc_decode.cu) and gates_s gets an empty branch.
// from_post: the stash holds hc_post_project's partials for this X and p (it returned true).
// X16: the streams are bf16 there (X unused; past 4 rows, from_post only).
void hc_pre(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, int64_t iters, float hc_eps,
            float rms_eps, float* pre, float* post, float* comb, float* u, cudaStream_t s,
            cudaStream_t gates_s = nullptr, cudaEvent_t projected = nullptr, const float* norm_w = nullptr,
            float norm_eps = 0.f, bool from_post = false, const uint16_t* X16 = nullptr);
// The routed experts' outputs before their weighted sum (MoeRunner::run with `defer`): row r's
// sum is Σ_k weights[r K + k] Y[r K + k] over k with experts[r K + k] in [0, E), in k order.
struct RoutedRows {
  const float* Y = nullptr;  // [R K, d]
  const int32_t* experts = nullptr;
  const float* weights = nullptr;
  int K = 0, E = 0;
  const uint16_t* Y16 = nullptr;  // instead of Y: the rows as bf16 bits (the FP8 prefill tiles write them)
  constexpr bool any() const { return Y != nullptr || Y16 != nullptr; }  // (constexpr: device code calls it)
};
// X'[k] = post_k F + Σ_j comb[j][k] X[j], in place; F2 (optional) is added to F first (the
// routed experts' sum beside the shared expert's output: F + F2 is the sub-layer output), or
// routed (optional, instead of F2): that sum is made here, the same floats as MoeRunner's
// combine would have written into F2, without its launch and its [R, d] round trip.
// store / X16: StreamStore (n <= 4 for the bf16 forms).
void hc_post(const float* post, const float* comb, const float* F, float* X, int64_t R, int64_t n, int64_t d,
             cudaStream_t s, const float* F2 = nullptr, const RoutedRows* routed = nullptr,
             StreamStore store = StreamStore::F32, uint16_t* X16 = nullptr);
// hc_post that also does the projection of the new streams for the hc_pre of `next` after it
// (ops_mhc_post_project.cu up to 4 rows and n <= 4; ops_mhc_post_project_tiled.cu past that, n = 4,
// d % 32 == 0): call that hc_pre with from_post.
// false: nothing enqueued (another shape, or DSV4_HC_PROJECT_IN_POST=0): call hc_post instead.
// With bf16 streams (store, X16; past 4 rows) the projection is of the stored, rounded streams.
bool hc_post_project(const float* post, const float* comb, const float* F, float* X, int64_t R, int64_t n, int64_t d,
                     const HcParams& next, cudaStream_t s, const float* F2 = nullptr,
                     const RoutedRows* routed = nullptr, StreamStore store = StreamStore::F32,
                     uint16_t* X16 = nullptr);
// h [R, d] = Σ_i (σ(scale·μ_i + base_i) + hc_eps) X_i.
void hc_head(const HcParams& p, const float* X, int64_t R, int64_t n, int64_t d, float hc_eps, float rms_eps, float* h,
             cudaStream_t s);
// false: the projection's 256-row tiles run on fp32 FMAs instead of the split-TF32 tensor cores
// (A/B runs and tests; DSV4_HC_TF32=0 at start-up does the same).
void set_hc_project_tf32(bool on);

// ---- rings and compressor (model/compressor.cpp is the twin) ---------------------------------

// Stores rows of positions [max(p0, p0+n-ring_rows), p0+n) at slot p % ring_rows.
void ring_store(const float* rows, int64_t n, int64_t width, int64_t p0, float* ring, int64_t ring_rows,
                cudaStream_t s);

// ring_store for many (chunk, ring) pairs in one launch, the jobs read from device memory (a
// forward's descriptor blob), so a captured CUDA graph stays valid as positions advance.
struct RingJob {
  const float* rows;  // chunk rows [n, width]: positions p0 .. p0 + n - 1
  int64_t p0, n, width;
  float* ring;        // [ring_rows, width]
  int64_t ring_rows;
};
// max_rows >= min(n, ring_rows) of every job (grid bound; extra blocks exit).
void ring_store_jobs(const RingJob* jobs, int64_t n_jobs, int64_t max_rows, cudaStream_t s);

// z[r, :] += ape[pos[r] % m, :] for rows of `width`.
void add_ape(float* z, const int64_t* pos, const float* ape, int64_t R, int64_t m, int64_t width, cudaStream_t s);

// How a sequence's indexer keys are stored: fp32 (Exact, and Fast where the tensor-core scorer
// does not take the shape) or bf16 (Fast: the scorer rounds keys to bf16 anyway, so storing them
// rounded gives the same scores from half the bytes).
enum class KeyFormat : uint8_t { F32, BF16 };

// One closing compressor window. A position p's projected row is chunk row (p - chunk_p0) when
// p >= chunk_p0, else ring row p % ring_rows. Rows hold coff*c values (coff = 2 with overlap).
struct PoolJob {
  const float* chunk_a;
  const float* chunk_z;
  int64_t chunk_p0;
  const float* ring_a;
  const float* ring_z;
  int64_t ring_rows;
  int64_t w;    // window index: pools positions [w m, (w+1) m) (and [(w-1) m, w m) lo-halves with overlap);
                // w < 0: padding (no window), the block exits — job counts stay fixed per shape
  void* out;    // [c]: written as RMSNorm(pooled; gamma) then RoPE at position w*m, in the call's format
};
// jobs: device array of n_jobs PoolJob. out_format BF16: each value rounded to nearest even.
void compressor_pool(const PoolJob* jobs, int64_t n_jobs, int64_t m, int64_t c, bool overlap, const float* gamma,
                     float eps, const float* inv_freq, int64_t pairs, cudaStream_t s,
                     KeyFormat out_format = KeyFormat::F32);

// ---- indexer (model/indexer.cpp is the twin) ------------------------------------------------------

struct IndexerRow {
  const void* keys;   // [n_visible, hd] indexer keys of this row's sequence, in the call's KeyFormat
  int64_t n_visible;  // floor((pos+1)/4)
};
// Whether Fast scoring takes bf16 keys at this shape (the tensor-core scorer: heads a multiple
// of 8 up to 64, head dim a multiple of 32 up to 128).
bool indexer_bf16_keys_ok(int64_t nh, int64_t hd);
// q [R, nh, hd], omega [R, nh] (already scaled); score(s) = Σ_h omega_h ReLU(q_h · K_s).
// out [R, topk]: indices of the top min(topk, n_visible) scores (descending, ties → lower
// index), remaining slots -1.
void indexer_topk(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                  int64_t topk, int32_t* out, cudaStream_t s);
// Same, given an upper bound of n_visible over the rows (sizes the stream-ordered score
// scratch): no host sync, CUDA-graph capturable. The form above reads `rows` back to find it.
// topk <= 2048. fast: scores on bf16 tensor cores (q and keys rounded to bf16, fp32 sums; the
// official demo's bf16 score einsum) where the shape allows (heads % 8, head dim % 32, <= 64 x
// 128), else the fp32 twin. keys BF16 needs fast and indexer_bf16_keys_ok.
void indexer_topk(const float* q, const float* omega, const IndexerRow* rows, int64_t R, int64_t nh, int64_t hd,
                  int64_t topk, int64_t max_visible, int32_t* out, cudaStream_t s, bool fast = false,
                  KeyFormat keys = KeyFormat::F32);

// ---- attention (model/attention.cpp is the twin) -------------------------------------------------

struct AttnRow {
  int64_t pos;
  // Window keys: positions [max(0, pos-W+1), pos]; position t is chunk_kv row (t - chunk_p0) when
  // t >= chunk_p0, else ring row t % W.
  const float* chunk_kv;
  int64_t chunk_p0;
  const float* ring;
  // Compressed keys: entries[0, n_entries) when sel == nullptr (HCA), else entries[sel[i]] for
  // i < n_sel with sel[i] >= 0 (CSA).
  const float* entries;
  int64_t n_entries;
  const int32_t* sel;
  int64_t n_sel;
};
// The attention rows (and, for CSA, the indexer rows) of one chunk segment of one layer, made on
// the device from the segment's first row: row i has pos + i, n_entries (pos + 1) / ratio (HCA),
// sel + i sel_stride (CSA). A prefill's rows are R per layer; built on the host they cost ~0.1 µs
// each before the first kernel could start.
struct RowPlanJob {
  AttnRow first;
  AttnRow* attn;            // n rows out
  IndexerRow* index;        // CSA: n rows out ({index_keys, (pos + 1) / ratio}); else null
  const void* index_keys;
  int64_t n, ratio, sel_stride;
  int32_t hca;              // n_entries from pos (HCA)
};
void expand_row_plans(const RowPlanJob* jobs, int64_t n_jobs, int64_t max_n, cudaStream_t s);

// q [R, H, D] → o [R, H, D]: softmax over window + compressed keys (K = V) with a sink logit
// per head in the denominator, scale 1/sqrt(D). fast (H % 64 == 0, D == 512): q, keys and
// probabilities rounded to bf16 on tensor cores, fp32 accumulation (ops_attention_mma.cu);
// otherwise (other shapes) the fp32 twin of the CPU.
// kv BF16 (needs attention_bf16_keys_ok and fast): the rows' chunk_kv, ring and entries hold bf16
// keys (D bf16 per key, their pointers typed float), read by the warpgroup-MMA kernel
// (ops_attention_wgmma.cu) on sm_90a, else by the mma.sync one, whose outputs are those of the
// same keys in fp32 (it rounds keys to bf16 before its MMAs) bit for bit. q_format BF16 (with kv
// BF16): q holds bf16 too (rms_norm_rope's bf16 output, D / 2 float slots per head), the values
// both kernels round fp32 q to: the same outputs, half the q bytes.
// fp8_out (optional): the output as the FP8 activations of the projection after it instead of
// o: codes [R, H D] and scales [H D / 128][R], act_quant_fp8_inverse_rope(o, ..., rope) bit for bit
// (the inverse RoPE and the quantisation in the kernel's epilogue: o's fp32 round trip is gone).
// Taken where the warpgroup-MMA kernel runs with no key splits (prefill sizes) and the rotary
// pairs are a multiple of 4 (<= 64); the return says whether it was (false: o was written,
// fp8_out untouched).
struct AttnFp8Out {
  uint8_t* q = nullptr;
  float* scales = nullptr;
  InverseRope rope{};
};
// q_norm: bf16 q as wq_b wrote it, each head's RMS norm (no weight) and the RoPE of its last 2 *
// pairs channels at pos[r] applied inside the kernel once q is staged — rms_norm_rope_bf16's bits,
// without q's own pass over memory. Only with bf16 q, where attention_norms_q says the kernel
// takes it (Fast, bf16 keys).
struct AttnQNorm {
  float eps;
  const float* inv_freq;  // [pairs]
  int64_t pairs;
  const int64_t* pos;  // [R]
};
bool sparse_attention(const float* q, const AttnRow* rows, int64_t R, int64_t H, int64_t D, int64_t W,
                      const float* sink, float* o, cudaStream_t s, bool fast = false, KeyFormat kv = KeyFormat::F32,
                      KeyFormat q_format = KeyFormat::F32, const AttnFp8Out* fp8_out = nullptr,
                      const AttnQNorm* q_norm = nullptr);
// Whether sparse_attention takes q_norm (Fast, bf16 keys) at this shape.
bool attention_norms_q(int64_t H, int64_t D, int64_t pairs);
// Whether sparse_attention takes bf16 keys at this shape (the tensor-core kernel's).
bool attention_bf16_keys_ok(int64_t H, int64_t D);
// false: bf16 keys go to the mma.sync kernel even where the wgmma one runs (A/B runs and tests;
// DSV4_ATTN_WGMMA=0 at start-up does the same).
void set_attention_wgmma(bool on);

// ---- MoE routing and activation (model/moe.cpp is the twin) ---------------------------------------

// logits [R, E] → experts/weights [R, K]. Hash layers: tid2eid [vocab, K] with tokens; else top-K
// of sqrt(softplus(l)) + bias. Weights renormalised over the K picks × scale.
void moe_route(const float* logits, const float* bias, const int32_t* tid2eid, const int32_t* tokens, int64_t R,
               int64_t E, int64_t K, float routed_scale, int32_t* experts, float* weights, cudaStream_t s);

// h = silu(min(g, L)) ⊙ clamp(v, ±L) (no clamp when L <= 0); gu [rows, 2I] holds g then v per row.
void swiglu(const float* gu, int64_t rows, int64_t I, float limit, float* h, cudaStream_t s);

// ---- sampling ----------------------------------------------------------------------------------------

// Per row: argmax when temperature <= 0, else top-k / top-p sampling with a counter-based RNG
// seeded by (seed[r], step[r]). logits [R, V] → tokens [R].
void sample(const float* logits, int64_t R, int64_t V, const float* temperature, const float* top_p,
            const int32_t* top_k, const uint64_t* seed, const uint64_t* step, int32_t* tokens, cudaStream_t s);

}  // namespace dsv4::cuda
