#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "backend/cuda/async_scratch.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_misc.h"
#include "core/error.h"

namespace dsv4 {

// Scratch buffers that grow with the largest batch seen; reused across calls.
struct CudaModel::Workspace {
  std::map<std::string, cuda::DeviceBuffer> bufs;
  template <typename T>
  T* get(const std::string& name, int64_t count) {
    auto& b = bufs[name];
    cuda::grow_scratch(b, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T), 2);
    return b.as<T>();
  }
};

// Host-side descriptor blob for one call: every layer's rows and pool jobs, uploaded at once.
struct CallBlob {
  std::vector<uint8_t> bytes;
  template <typename T>
  size_t add(const std::vector<T>& v) {
    const size_t off = (bytes.size() + 15) / 16 * 16;
    bytes.resize(off + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
};

// Host vectors of the call plans, reused from call to call: fresh ones cost more than the plans
// themselves (a prefill of 8192 tokens spent ~7 ms of host time before its first kernel, mostly
// in first touches of new pages). The per-row attention / indexer rows are made on the device
// from per-segment jobs (cuda::expand_row_plans).
struct CudaModel::PlanBuffers {
  CallBlob blob;
  std::vector<cuda::RowPlanJob> rows;  // every layer's, expanded on the device by the call's first kernel
  int64_t max_rows = 0;                // the longest job
  std::vector<cuda::PoolJob> cj, ij;
  std::vector<cuda::RingJob> cr, ir, kr;
};

struct CallSegment {
  DeviceSequence* seq;
  int64_t row0, n, p0;
};

namespace {

// Windows closing inside [p0, p0 + n): w in [p0/m, (p0+n)/m - 1], padded with w = -1 jobs to
// ceil(n/m), the most a chunk of n rows can close: the job count (and so the blob layout and the
// launch) depends only on the call's shape, which a captured CUDA graph needs.
// entries: the closed-entry store, entry_bytes per entry (fp32 entries, fp32 or bf16 indexer keys).
void add_pool_jobs(std::vector<cuda::PoolJob>& jobs, const CallSegment& s, int64_t m, int64_t width, const float* a,
                   const float* z, const float* ring_a, const float* ring_z, int64_t ring_rows, void* entries,
                   int64_t entry_bytes) {
  const int64_t w0 = s.p0 / m, w1 = (s.p0 + s.n) / m;
  for (int64_t w = w0; w < w0 + (s.n + m - 1) / m; ++w)
    jobs.push_back(cuda::PoolJob{a + s.row0 * width, z + s.row0 * width, s.p0, ring_a, ring_z, ring_rows,
                                 w < w1 ? w : -1, w < w1 ? static_cast<uint8_t*>(entries) + w * entry_bytes : nullptr});
}

// Grid bound of indexer_topk's scoring: n_visible rounded up, so that decode steps keep one
// launch shape (and one CUDA graph) for 1024 entries = 4096 tokens at ratio 4.
int64_t visible_bucket(int64_t n) { return (n + 1023) / 1024 * 1024; }

}  // namespace

CudaModel::CudaModel(const ModelWeights& w, cuda::Precision precision)
    : dw_(upload_weights(w)),
      precision_(precision),
      ws_(std::make_unique<Workspace>()),
      plans_(std::make_unique<PlanBuffers>()) {
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cuda::keep_async_pool();  // eager steps synchronise; scratch stays mapped between them
  fast_ = std::make_unique<cuda::FastLinear>();
  for (auto& f : side_fast_) f = std::make_unique<cuda::FastLinear>();
  branches_ = std::make_unique<Branches>(stream_);
  moe_ = std::make_unique<cuda::MoeRunner>();
  const char* env = std::getenv("DSV4_CUDA_GRAPHS");
  graphs_on_ = !(env && std::string(env) == "0");
  const char* ch = std::getenv("DSV4_COMBINE_IN_HC_POST");
  combine_in_post_ = !(ch && std::string(ch) == "0");
  const char* rg = std::getenv("DSV4_ROUTE_IN_GROUP");
  route_in_group_ = !(rg && std::string(rg) == "0");
  const char* nq = std::getenv("DSV4_ATTN_NORM_Q");
  q_norm_in_attention_ = !(nq && std::string(nq) == "0");
  const char* sb = std::getenv("DSV4_STREAMS_BF16");
  streams_bf16_ = !(sb && std::string(sb) == "0");
  const char* br = std::getenv("DSV4_BRANCHES");
  branches_on_ = !(br && std::string(br) == "0");
  const char* ik = std::getenv("DSV4_INDEX_KEYS");
  if (precision_ == cuda::Precision::Fast && !(ik && std::string(ik) == "f32") &&
      cuda::indexer_bf16_keys_ok(dw_.config.index_n_heads, dw_.config.index_head_dim))
    index_keys_ = cuda::KeyFormat::BF16;
  const char* kvf = std::getenv("DSV4_KV");
  if (precision_ == cuda::Precision::Fast && !(kvf && std::string(kvf) == "f32") &&
      cuda::attention_bf16_keys_ok(dw_.config.num_heads, dw_.config.head_dim))
    kv_format_ = cuda::KeyFormat::BF16;
  // With bf16 keys, q reaches attention as bf16 too (the values its kernels round to); DSV4_Q=f32
  // keeps it fp32 (same outputs; an A/B switch).
  const char* qf = std::getenv("DSV4_Q");
  if (kv_format_ == cuda::KeyFormat::BF16 && !(qf && std::string(qf) == "f32")) q_format_ = cuda::KeyFormat::BF16;
  // Fast precision reads FP4 experts only through the tensor-core kernels: re-lay them once for
  // 16-byte loads (this model owns the upload; DSV4_MOE_PACK=0 keeps the stored layout).
  const char* pack = std::getenv("DSV4_MOE_PACK");
  if (precision_ == cuda::Precision::Fast && !(pack && std::string(pack) == "0")) {
    for (const DeviceLayer& L : dw_.layers)
      if (!L.experts.w1.empty()) moe_->pack_for_tensor_cores(L.experts, stream_);
    for (const DeviceMtp& M : dw_.mtp)
      if (!M.block.experts.w1.empty()) moe_->pack_for_tensor_cores(M.block.experts, stream_);
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

CudaModel::~CudaModel() {
  graphs_.clear();
  branches_.reset();  // waits for its side streams
  if (stream_) cudaStreamDestroy(stream_);
}

// A switch of the launch structure: graphs captured with the other structure are dropped.
void CudaModel::set_launch_switch(bool& flag, bool on) {
  if (on != flag) {
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    graphs_.clear();
  }
  flag = on;
}

void CudaModel::set_branches(bool on) { set_launch_switch(branches_on_, on); }
void CudaModel::set_combine_in_hc_post(bool on) { set_launch_switch(combine_in_post_, on); }
void CudaModel::set_route_in_group(bool on) { set_launch_switch(route_in_group_, on); }
void CudaModel::set_q_norm_in_attention(bool on) { set_launch_switch(q_norm_in_attention_, on); }

void CudaModel::set_graphs(bool on) {
  if (!on) {
    DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
    graphs_.clear();
  }
  graphs_on_ = on;
}

void CudaModel::mark(const char* op) {
  if (prof_) prof_->mark(op, stream_);
}

void CudaModel::linear(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin,
                       int64_t row_end, int64_t ldx, int64_t ldy) {
  if (row_end < 0) row_end = w.out;
  if (ldx < 0) ldx = w.in;
  if (ldy < 0) ldy = row_end - row_begin;
  if (precision_ == cuda::Precision::Exact) {
    cuda::linear_exact(w, x, rows, y, row_begin, row_end, ldx, ldy, stream_);
  } else {
    fast_->run(w, x, rows, y, row_begin, row_end, ldx, ldy, stream_);
  }
}

cuda::FastLinear& CudaModel::fast_for(cudaStream_t s) {
  for (int k = 0; k < Branches::kSides; ++k)
    if (s && s == branches_->side(k)) return *side_fast_[k];
  return *fast_;
}

void CudaModel::linear_on(cudaStream_t s, const WeightView& w, const float* x, int64_t rows, float* y) {
  if (precision_ == cuda::Precision::Exact)
    cuda::linear_exact(w, x, rows, y, 0, w.out, w.in, w.out, s);
  else
    fast_for(s).run(w, x, rows, y, 0, w.out, w.in, w.out, s);
}

void CudaModel::linear_shared_input(std::initializer_list<cuda::FastLinear::Output> outs, const float* x, int64_t rows,
                                    int64_t ldx, cudaStream_t s) {
  if (!s) s = stream_;
  if (precision_ == cuda::Precision::Fast) return fast_for(s).run_shared_input(outs, x, rows, ldx, s);
  for (const auto& o : outs) cuda::linear_exact(*o.w, x, rows, o.y, 0, o.w->out, ldx, o.ldy, s);
}

std::vector<float> CudaModel::forward(std::span<const DeviceChunk> chunks, bool all_logits,
                                      std::vector<float>* hidden) {
  const float* d_logits = nullptr;
  const int64_t rows = forward_device(chunks, all_logits, &d_logits, hidden);
  std::vector<float> out(static_cast<size_t>(rows * dw_.config.vocab_size));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(out.data(), d_logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

// Rows of one call, in chunk order.
struct CudaModel::Rows {
  std::vector<CallSegment> segs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> pos, out_rows;
  int64_t R() const { return static_cast<int64_t>(tokens.size()); }
  int64_t O() const { return static_cast<int64_t>(out_rows.size()); }
};

// Per-layer descriptor offsets in the call's blob.
struct CudaModel::LayerDesc {
  const cuda::AttnRow* attn = nullptr;  // R rows (expand_row_plans writes them)
  const cuda::IndexerRow* idx_rows = nullptr;
  size_t cmp_jobs = 0, idx_jobs = 0;
  int64_t n_cmp = 0, n_idx = 0, max_visible = 0;
  // Ring stores: compressor (a, z per segment), indexer compressor, and the window ring.
  size_t cmp_ring = 0, idx_ring = 0, kv_ring = 0;
  int64_t n_cmp_ring = 0, n_idx_ring = 0, n_kv_ring = 0, cmp_ring_rows = 0, idx_ring_rows = 0, kv_ring_rows = 0;
};

// Scratch activations of one call (workspace buffers sized for its rows).
struct CudaModel::Acts {
  float *X, *u, *F, *F2, *pre, *post, *comb, *qr, *q, *kv, *ca, *cz, *ia, *iz, *qI, *omega, *o, *y, *glog, *eweights, *gu,
      *hbuf;
  float* kv_store;  // the chunk's keys as the sequences store them: kv (fp32) or kv16 (bf16 pairs)
  float* q_attn;    // q as attention reads it: q (fp32) or, with bf16 keys, q16 (bf16 pairs)
  int32_t *sel, *experts;
  // Fast past 4 rows: the streams as bf16 from the first hc_post on (null: fp32 X throughout).
  uint16_t* X16 = nullptr;
  cuda::AttnRow* plan_attn;       // [layers][R]
  cuda::IndexerRow* plan_index;   // [layers][R]
  const uint8_t* blob = nullptr;
  const int32_t* tok = nullptr;
  const int64_t* pos = nullptr;
  const int64_t* out = nullptr;
};

CudaModel::Acts CudaModel::scratch(int64_t R) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, H = cfg.num_heads, D = cfg.head_dim, ql = cfg.q_lora_rank;
  const int64_t nI = cfg.index_n_heads, dI = cfg.index_head_dim, E = cfg.n_routed_experts;
  const int64_t K = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size, G = cfg.o_groups, Ro = cfg.o_lora_rank;
  const int64_t topk = std::max<int64_t>(cfg.index_topk, 1);
  Workspace& ws = *ws_;
  Acts a;
  a.X = ws.get<float>("X", R * n * d);
  a.u = ws.get<float>("u", R * d);
  a.F = ws.get<float>("F", R * d);
  a.F2 = ws.get<float>("F2", R * d);
  a.pre = ws.get<float>("pre", R * n);
  a.post = ws.get<float>("post", R * n);
  a.comb = ws.get<float>("comb", R * n * n);
  a.qr = ws.get<float>("qr", R * ql);
  a.q = ws.get<float>("q", R * H * D);
  a.kv = ws.get<float>("kv", R * D);
  a.kv_store = kv_format_ == cuda::KeyFormat::BF16 ? ws.get<float>("kv16", R * D / 2) : a.kv;
  // With bf16 keys q goes to attention as bf16 (q16), and the fp32 q, dead once normed, takes the
  // attention output: 64 KB per token less than separate q and o.
  a.q_attn = q_format_ == cuda::KeyFormat::BF16 ? ws.get<float>("q16", R * H * D / 2) : a.q;
  a.ca = ws.get<float>("ca", R * 2 * D);
  a.cz = ws.get<float>("cz", R * 2 * D);
  a.ia = ws.get<float>("ia", R * 2 * dI);
  a.iz = ws.get<float>("iz", R * 2 * dI);
  a.qI = ws.get<float>("qI", R * nI * dI);
  a.omega = ws.get<float>("omega", R * nI);
  a.sel = ws.get<int32_t>("sel", R * topk);
  a.o = q_format_ == cuda::KeyFormat::BF16 ? a.q : ws.get<float>("o", R * H * D);
  a.y = ws.get<float>("y", R * G * Ro);
  a.glog = ws.get<float>("glog", R * E);
  a.experts = ws.get<int32_t>("experts", R * K);
  a.eweights = ws.get<float>("eweights", R * K);
  a.gu = ws.get<float>("gu", R * 2 * I);
  a.hbuf = ws.get<float>("h", R * I);
  const int64_t layers = std::max<int64_t>(static_cast<int64_t>(dw_.layers.size()), 1);  // (MTP: one)
  a.plan_attn = ws.get<cuda::AttnRow>("plan_attn", layers * R);
  a.plan_index = ws.get<cuda::IndexerRow>("plan_index", layers * R);
  return a;
}

CudaModel::Rows CudaModel::gather_rows_of(std::span<const DeviceChunk> chunks, bool all_logits) const {
  const int64_t V = dw_.config.vocab_size;
  Rows rows;
  std::set<const DeviceSequence*> seen;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.seq && seen.insert(c.seq).second, "forward: each sequence may appear once per call");
    DSV4_CHECK(!c.tokens.empty(), "forward: empty chunk");
    DSV4_CHECK(c.seq->pos + static_cast<int64_t>(c.tokens.size()) <= c.seq->capacity(), "forward: sequence of ",
               c.seq->pos + c.tokens.size(), " tokens exceeds its capacity ", c.seq->capacity());
    const int64_t row0 = rows.R();
    rows.segs.push_back({c.seq, row0, static_cast<int64_t>(c.tokens.size()), c.seq->pos});
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      DSV4_CHECK(c.tokens[i] >= 0 && c.tokens[i] < V, "token id ", c.tokens[i], " out of range [0, ", V, ")");
      rows.tokens.push_back(c.tokens[i]);
      rows.pos.push_back(c.seq->pos + static_cast<int64_t>(i));
      if (all_logits || c.every_row || i + 1 == c.tokens.size()) rows.out_rows.push_back(row0 + static_cast<int64_t>(i));
    }
  }
  return rows;
}

// Descriptors of one layer (state layer `li` of each sequence), built on the host from
// positions alone (no device sync).
CudaModel::LayerDesc CudaModel::describe_layer(const DeviceLayer& L, size_t li, const Rows& rows, const Acts& a,
                                               CallBlob& blob) const {
  const ModelConfig& cfg = dw_.config;
  const int64_t D = cfg.head_dim, m = L.ratio, topk = std::max<int64_t>(cfg.index_topk, 1);
  const int64_t Dk = kv_format_ == cuda::KeyFormat::BF16 ? D / 2 : D;  // float slots per stored key
  LayerDesc ld;
  PlanBuffers& pb = *plans_;
  std::vector<cuda::PoolJob>&cj = pb.cj, &ij = pb.ij;
  std::vector<cuda::RingJob>&cr = pb.cr, &ir = pb.ir, &kr = pb.kr;
  for (auto* v : {&cr, &ir, &kr}) v->clear();
  cj.clear();
  ij.clear();
  const int64_t R = rows.R();
  cuda::AttnRow* attn = a.plan_attn + static_cast<int64_t>(li) * R;
  cuda::IndexerRow* index = a.plan_index + static_cast<int64_t>(li) * R;
  ld.attn = attn;
  ld.idx_rows = L.kind == AttnKind::CSA ? index : nullptr;
  int64_t max_n = 0;
  for (const CallSegment& sg : rows.segs) {
    const DeviceLayerState& st = sg.seq->layers[li];
    // Rows sg.row0 .. + n at positions p0 .. p0 + n - 1.
    cuda::RowPlanJob job{{sg.p0, a.kv_store + sg.row0 * Dk, sg.p0, st.ring, st.entries, 0, nullptr, 0},
                         attn + sg.row0, nullptr, nullptr, sg.n, m, 0, L.kind == AttnKind::HCA};
    if (L.kind == AttnKind::CSA) {
      job.first.sel = a.sel + sg.row0 * topk;
      job.first.n_sel = topk;
      job.sel_stride = topk;
      job.index = index + sg.row0;
      job.index_keys = st.idx_keys;
      ld.max_visible = std::max(ld.max_visible, (sg.p0 + sg.n) / m);  // the last row's
    }
    pb.rows.push_back(job);
    pb.max_rows = std::max(pb.max_rows, sg.n);
    max_n = std::max(max_n, sg.n);
    DSV4_CHECK(sg.seq->kv_format() == kv_format_, "forward: a sequence made by a model with another attention key format");
    kr.push_back({a.kv_store + sg.row0 * Dk, sg.p0, sg.n, Dk, st.ring, cfg.sliding_window});
    if (L.kind != AttnKind::SWA) {
      add_pool_jobs(cj, sg, m, st.cmp_width, a.ca, a.cz, st.cmp_a, st.cmp_z, st.cmp_rows, st.entries,
                    Dk * int64_t(sizeof(float)));
      const int64_t wd = st.cmp_width;
      cr.push_back({a.ca + sg.row0 * wd, sg.p0, sg.n, wd, st.cmp_a, st.cmp_rows});
      cr.push_back({a.cz + sg.row0 * wd, sg.p0, sg.n, wd, st.cmp_z, st.cmp_rows});
      ld.cmp_ring_rows = std::max(ld.cmp_ring_rows, st.cmp_rows);
    }
    if (L.kind == AttnKind::CSA) {
      DSV4_CHECK(sg.seq->index_keys() == index_keys_, "forward: a sequence made by a model with another indexer key format");
      add_pool_jobs(ij, sg, m, st.idx_width, a.ia, a.iz, st.idx_a, st.idx_z, st.idx_rows, st.idx_keys,
                    cfg.index_head_dim * (index_keys_ == cuda::KeyFormat::BF16 ? 2 : 4));
      const int64_t wd = st.idx_width;
      ir.push_back({a.ia + sg.row0 * wd, sg.p0, sg.n, wd, st.idx_a, st.idx_rows});
      ir.push_back({a.iz + sg.row0 * wd, sg.p0, sg.n, wd, st.idx_z, st.idx_rows});
      ld.idx_ring_rows = std::max(ld.idx_ring_rows, st.idx_rows);
    }
  }
  ld.cmp_jobs = blob.add(cj);
  ld.idx_jobs = blob.add(ij);
  ld.n_cmp = static_cast<int64_t>(cj.size());
  ld.n_idx = static_cast<int64_t>(ij.size());
  ld.max_visible = visible_bucket(ld.max_visible);
  ld.cmp_ring = blob.add(cr);
  ld.idx_ring = blob.add(ir);
  ld.kv_ring = blob.add(kr);
  ld.n_cmp_ring = static_cast<int64_t>(cr.size());
  ld.n_idx_ring = static_cast<int64_t>(ir.size());
  ld.n_kv_ring = static_cast<int64_t>(kr.size());
  // Grid rows of each ring store: the longest chunk, at most the ring (older rows are overwritten).
  ld.cmp_ring_rows = std::min(max_n, ld.cmp_ring_rows);
  ld.idx_ring_rows = std::min(max_n, ld.idx_ring_rows);
  ld.kv_ring_rows = std::min(max_n, cfg.sliding_window);
  return ld;
}

// Uploads the call's descriptor blob; the host blob must stay alive until the stream syncs.
void CudaModel::upload_blob(const CallBlob& blob, Acts& a) {
  uint8_t* d = ws_->get<uint8_t>("blob", static_cast<int64_t>(blob.bytes.size()));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(d, blob.bytes.data(), blob.bytes.size(), cudaMemcpyHostToDevice, stream_));
  a.blob = d;
}

// One decoder block (attention then MoE sub-layer) on the streams a.X, state layer li.
bool CudaModel::run_layer(const DeviceLayer& L, size_t li, const float* rope, const LayerDesc& ld, const Rows& rows,
                          const Acts& a, bool projected, const cuda::HcParams* next) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, H = cfg.num_heads, D = cfg.head_dim;
  const int64_t W = cfg.sliding_window, ql = cfg.q_lora_rank, nI = cfg.index_n_heads, dI = cfg.index_head_dim;
  const int64_t E = cfg.n_routed_experts, K = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size;
  const int64_t P = cfg.rope_dim / 2, G = cfg.o_groups, Ro = cfg.o_lora_rank, topk = std::max<int64_t>(cfg.index_topk, 1);
  const float eps = static_cast<float>(cfg.rms_norm_eps), hc_eps = static_cast<float>(cfg.hc_eps);
  const int64_t R = rows.R(), m = L.ratio;
  cudaStream_t s = stream_;
  auto at = [&](size_t off) { return a.blob + off; };
  float *X = a.X, *u = a.u, *F = a.F, *qr = a.qr, *q = a.q, *kv = a.kv, *o = a.o;

  // Side streams (branches.h): the compressor, the current key and the indexer beside the query
  // path, the window ring store and the shared expert beside the routed experts, the mHC gates
  // (Sinkhorn) beside everything up to hc_post.
  // Profiling keeps one stream, so that each mark times the ops before it.
  Branches& br = *branches_;
  br.set_enabled(branches_on_ && !prof_);
  enum : int { kCompressorSide = 0, kIndexerSide = 1, kSharedSide = 0, kGatesSide = 2 };
  cudaStream_t gates = br.side(kGatesSide);
  cudaEvent_t gates_ev = br.fork_event(kGatesSide);

  // ---- attention sub-layer
  // bf16 streams (a.X16): X holds the embedding's fp32 copies until layer 0's first hc_post, which
  // writes X16; every later op reads and writes X16.
  const bool s16 = a.X16 != nullptr, fresh = li == 0;
  const cuda::StreamStore store = !s16 ? cuda::StreamStore::F32
                                  : fresh ? cuda::StreamStore::F32ToBF16
                                          : cuda::StreamStore::BF16;
  cuda::hc_pre(L.hc_attn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, a.pre, a.post, a.comb, u, s, gates, gates_ev,
               L.attn_norm, eps, projected, s16 && !fresh ? a.X16 : nullptr);
  mark("hc_pre+norm");

  // Compressor, indexer weights, router and head have BF16 weights: fp32 math in exact precision (the
  // official demo), bf16 tensor cores with fp32 accumulation in fast (as HF and vLLM run them).
  if (L.kind != AttnKind::SWA) {  // reads u; writes the compressed entries attention reads
    cudaStream_t cs = br.fork(kCompressorSide);
    const int64_t width = (L.kind == AttnKind::CSA ? 2 : 1) * D;
    linear_shared_input(
        {{&L.compressor.wkv, a.ca, L.compressor.wkv.out}, {&L.compressor.wgate, a.cz, L.compressor.wgate.out}}, u, R, d,
        cs);
    mark("compressor linears");
    cuda::add_ape(a.cz, a.pos, L.compressor.ape, R, m, width, cs);
    cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld.cmp_jobs)), ld.n_cmp, m, D,
                          L.kind == AttnKind::CSA, L.compressor.norm, eps, rope, P, cs, kv_format_);
    cuda::ring_store_jobs(reinterpret_cast<const cuda::RingJob*>(at(ld.cmp_ring)), ld.n_cmp_ring, ld.cmp_ring_rows, cs);
    mark("compressor pool+ring");
  }
  cudaStream_t is = s;
  if (L.kind == AttnKind::CSA) {  // lightning indexer, first the parts that need only u
    is = br.fork(kIndexerSide);
    const int64_t width = 2 * dI;
    // The indexer's three linears on u (its compressor's wkv / wgate, weights_proj): one rounding
    // of u to bf16 for all three past the GEMV sizes.
    linear_shared_input({{&L.idx_compressor.wkv, a.ia, L.idx_compressor.wkv.out},
                         {&L.idx_compressor.wgate, a.iz, L.idx_compressor.wgate.out},
                         {&L.idx_weights_proj, a.omega, L.idx_weights_proj.out}},
                        u, R, d, is);
    mark("indexer linears");
    cuda::add_ape(a.iz, a.pos, L.idx_compressor.ape, R, m, width, is);
    cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld.idx_jobs)), ld.n_idx, m, dI, true,
                          L.idx_compressor.norm, eps, rope, P, is, index_keys_);
    cuda::ring_store_jobs(reinterpret_cast<const cuda::RingJob*>(at(ld.idx_ring)), ld.n_idx_ring, ld.idx_ring_rows, is);
    mark("compressor pool+ring");
    cuda::scale_inplace(a.omega, R * nI, 1.0f / std::sqrt(static_cast<float>(dI)) / std::sqrt(static_cast<float>(nI)), is);
    mark("indexer weights scale");
  }
  linear_shared_input({{&L.wq_a, qr, L.wq_a.out}, {&L.wkv, kv, L.wkv.out}}, u, R, d);  // one quantisation of u for both
  mark("wq_a+wkv");
  // q_norm: with wq_b on the tensor-core GEMV, fused with its activation quantisation (the GEMV
  // itself after the side forks below, which read the normed qr).
  const bool wq_b_quantised =
      precision_ == cuda::Precision::Fast && fast_->quantise_rms_norm(L.wq_b, qr, L.q_norm, eps, R, s);
  if (!wq_b_quantised) cuda::rms_norm(qr, L.q_norm, qr, R, ql, eps, s);
  mark("norms");
  if (L.kind == AttnKind::CSA) {  // the indexer's query needs qr
    is = br.fork(kIndexerSide);
    linear_on(is, L.idx_wq_b, qr, R, a.qI);
    cuda::rope(a.qI, R, nI, dI, rope, P, a.pos, false, is);
    mark("indexer wq_b+rope");
    cuda::indexer_topk(a.qI, a.omega, ld.idx_rows, R, nI, dI, topk,
                       std::max<int64_t>(ld.max_visible, 1), a.sel, is, precision_ == cuda::Precision::Fast,
                       index_keys_);
    mark("indexer_topk");
  }
  {  // the current key, after the compressor on its side (attention waits for both)
    cudaStream_t ks = br.fork(kCompressorSide);
    // bf16 keys: written as the sequences store them (the ring store and attention read those).
    cuda::rms_norm_rope(kv, L.kv_norm, R, 1, D, eps, rope, P, a.pos, ks,
                        kv_format_ == cuda::KeyFormat::BF16 ? a.kv_store : nullptr);
    mark("kv norm+rope");
  }
  // Fast past the GEMV sizes: wq_b's GEMM writes q as bf16 — into the attention's bf16 q (bf16
  // keys), where the norm + RoPE then run in place, or into o's buffer (free until attention
  // writes it), from which the norm writes fp32 q. Both key formats round q before its norm alike,
  // so their logits stay the same bit for bit; q's fp32 write and read (8 bytes a value) are gone.
  uint16_t* q16 = reinterpret_cast<uint16_t*>(a.q_attn != q ? a.q_attn : a.o);
  const bool q_bf16 = !wq_b_quantised && precision_ == cuda::Precision::Fast && q16 != reinterpret_cast<uint16_t*>(q) &&
                      fast_->run_bf16_out(L.wq_b, qr, R, q16, s);
  if (wq_b_quantised)
    fast_->run_quantised(L.wq_b, R, q, L.wq_b.out, s);
  else if (!q_bf16)
    linear(L.wq_b, qr, R, q);
  mark("wq_b");
  // q's norm + RoPE inside attention where its kernel takes them (bf16 keys) and wq_b wrote bf16
  // q16 (past the GEMV sizes): q is then read once, with rms_norm_rope's bits. At the GEMV sizes
  // the own pass stays: there the key splits' CTAs would each normalise the row again (b1 +10-17
  // µs on an H100, bench/NOTES.md step 30).
  const bool attn_norms_q = q_bf16 && kv_format_ == cuda::KeyFormat::BF16 && a.q_attn != q && q_norm_in_attention_ &&
                            cuda::attention_norms_q(H, D, P);
  if (!attn_norms_q) {
    if (q_bf16)
      cuda::rms_norm_rope_bf16(q16, nullptr, R, H, D, eps, rope, P, a.pos, s, a.q_attn == q ? q : nullptr);
    else
      cuda::rms_norm_rope(q, nullptr, R, H, D, eps, rope, P, a.pos, s, a.q_attn == q ? nullptr : a.q_attn);
    mark("q norm+rope");
  }
  br.join(kCompressorSide);
  if (L.kind == AttnKind::CSA) br.join(kIndexerSide);
  const bool exact = precision_ == cuda::Precision::Exact;
  const int64_t gin = H * D / G;  // grouped low-rank output
  DSV4_CHECK(L.wo_a.in == gin && L.wo_a.out == G * Ro, "wo_a: expected [", G * Ro, ", ", gin, "]");
  const cuda::InverseRope inverse_rope{rope, P, a.pos, D};
  // At prefill sizes attention writes wo_a's FP8 activations itself (inverse RoPE and
  // quantisation in its epilogue: o's fp32 round trip skipped), where both kernels take it.
  cuda::AttnFp8Out o_fp8{nullptr, nullptr, inverse_rope};
  const bool o_fp8_wanted = !exact && fast_->grouped_input_fp8(L.wo_a, G, R, &o_fp8.q, &o_fp8.scales);
  const cuda::AttnQNorm q_norm{eps, rope, P, a.pos};  // q16 is a.q_attn where it is taken
  const bool o_quantised = cuda::sparse_attention(
      a.q_attn, ld.attn, R, H, D, W, L.sink, o, s, precision_ == cuda::Precision::Fast, kv_format_, q_format_,
      o_fp8_wanted ? &o_fp8 : nullptr, attn_norms_q ? &q_norm : nullptr);
  mark("sparse_attention");
  if (exact) cuda::rope(o, R, H, D, rope, P, a.pos, true, s);  // fast: inside wo_a's quantisation
  // The window ring takes the current keys once attention has read the entries they replace;
  // nothing else in this layer reads it (joined with the shared expert's side below).
  cuda::ring_store_jobs(reinterpret_cast<const cuda::RingJob*>(at(ld.kv_ring)), ld.n_kv_ring, ld.kv_ring_rows,
                        br.fork(kCompressorSide));
  mark(exact ? "inverse rope+kv ring" : "kv ring");
  if (exact)
    cuda::linear_exact_grouped(L.wo_a, G, o, R, a.y, H * D, G * Ro, s);
  else if (o_quantised)
    fast_->run_grouped_quantised(L.wo_a, G, R, a.y, G * Ro, s);
  else
    fast_->run_grouped_inverse_rope(L.wo_a, G, o, R, a.y, H * D, G * Ro, inverse_rope, s);
  mark(exact ? "wo_a" : "inverse rope+wo_a");
  linear(L.wo_b, a.y, R, F);
  mark("wo_b");
  br.join(kGatesSide);
  // hc_post also projects the new streams for the MoE sub-layer's hc_pre (where the shape allows).
  const bool ffn_projected =
      cuda::hc_post_project(a.post, a.comb, F, X, R, n, d, L.hc_ffn, s, nullptr, nullptr, store, a.X16);
  if (!ffn_projected) cuda::hc_post(a.post, a.comb, F, X, R, n, d, s, nullptr, nullptr, store, a.X16);
  mark("hc_post");
  const cuda::StreamStore store_after = s16 ? cuda::StreamStore::BF16 : cuda::StreamStore::F32;

  // ---- MoE sub-layer: the shared expert writes F, the routed experts their sum into F2
  cuda::hc_pre(L.hc_ffn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, a.pre, a.post, a.comb, u, s, gates, gates_ev,
               L.ffn_norm, eps, ffn_projected, a.X16);
  mark("hc_pre+norm");
  cudaStream_t xs = br.fork(kSharedSide);  // after the kv ring store on this side
  linear_shared_input({{&L.shared_w1, a.gu, 2 * I}, {&L.shared_w3, a.gu + I, 2 * I}}, u, R, d, xs);
  cuda::swiglu(a.gu, R, I, static_cast<float>(cfg.swiglu_limit), a.hbuf, xs);
  linear_on(xs, L.shared_w2, a.hbuf, R, F);
  mark("shared expert");
  linear(L.gate, u, R, a.glog);  // router: fp32 logits
  const float routed_scale = static_cast<float>(cfg.routed_scaling_factor), limit = static_cast<float>(cfg.swiglu_limit);
  cuda::RoutedRows routed;  // the weighted sum over each row's experts: in hc_post (or into F2)
  if (route_in_group_) {  // the selection inside the experts' grouping launch
    mark("router");
    const cuda::MoeRoute route{a.glog, L.gate_bias, L.tid2eid, a.tok, routed_scale, a.experts, a.eweights};
    moe_->run_routed(L.experts, u, R, route, K, limit, a.F2, precision_, s, /*accumulate=*/false,
                     combine_in_post_ ? &routed : nullptr);
  } else {
    cuda::moe_route(a.glog, L.gate_bias, L.tid2eid, a.tok, R, E, K, routed_scale, a.experts, a.eweights, s);
    mark("router");
    moe_->run(L.experts, u, R, a.experts, a.eweights, K, limit, a.F2, precision_, s, /*accumulate=*/false,
              combine_in_post_ ? &routed : nullptr);
  }
  mark("routed experts");
  br.join(kSharedSide);
  br.join(kGatesSide);
  // F + the routed sum: the same floats as when the combine added into F.
  const float* F2 = routed.any() ? nullptr : a.F2;
  const cuda::RoutedRows* rt = routed.any() ? &routed : nullptr;
  const bool next_projected =
      next && cuda::hc_post_project(a.post, a.comb, F, X, R, n, d, *next, s, F2, rt, store_after, a.X16);
  if (!next_projected) cuda::hc_post(a.post, a.comb, F, X, R, n, d, s, F2, rt, store_after, a.X16);
  mark("hc_post");
  return next_projected;
}

// hc_head → RMSNorm → the shared head on the output rows of a.X (fp32 logits);
// out_streams (optional) receives those rows' streams.
const float* CudaModel::head(const cuda::HcParams& hc, const float* norm, const Rows& rows, const Acts& a,
                             std::vector<float>* out_streams) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size, O = rows.O();
  const float eps = static_cast<float>(cfg.rms_norm_eps), hc_eps = static_cast<float>(cfg.hc_eps);
  float* Xo = ws_->get<float>("Xo", O * n * d);
  float* hh = ws_->get<float>("hh", O * d);
  float* logits = ws_->get<float>("logits", O * V);
  if (a.X16)
    cuda::gather_rows_widen(a.X16, a.out, O, n * d, Xo, stream_);
  else
    cuda::gather_rows(a.X, a.out, O, n * d, Xo, stream_);
  mark("head gather");
  if (out_streams) {
    out_streams->resize(static_cast<size_t>(O * n * d));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(out_streams->data(), Xo, out_streams->size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  cuda::hc_head(hc, Xo, O, n, d, hc_eps, eps, hh, stream_);
  cuda::rms_norm(hh, norm, hh, O, d, eps, stream_);
  mark("hc_head+norm");
  linear(dw_.head, hh, O, logits);
  mark("head linear");
  return logits;
}

void CudaModel::poison_workspace() {
  if (poison_)
    for (auto& [name, b] : ws_->bufs) DSV4_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xFF, b.bytes(), stream_));
}

int64_t CudaModel::forward_device(std::span<const DeviceChunk> chunks, bool all_logits, const float** logits_out,
                                  std::vector<float>* hidden) {
  // With a profile attached, the host phases' times go into its report (host- vs GPU-bound).
  auto t_phase = std::chrono::steady_clock::now();
  const auto phase = [&](const char* name) {
    if (!prof_) return;
    const auto now = std::chrono::steady_clock::now();
    prof_->host_phase(name, std::chrono::duration<double, std::milli>(now - t_phase).count());
    t_phase = now;
  };
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult;
  const Rows rows = gather_rows_of(chunks, all_logits);
  phase("rows");
  const int64_t R = rows.R();
  Acts a = scratch(R);
  if (streams_bf16_ && precision_ == cuda::Precision::Fast && !dw_.layers.empty() &&
      cuda::hc_streams_bf16_ok(R, n, d))
    a.X16 = ws_->get<uint16_t>("X16", R * n * d);
  ws_->get<float>("Xo", rows.O() * n * d);  // size every buffer before poisoning
  ws_->get<float>("hh", rows.O() * d);
  ws_->get<float>("logits", rows.O() * cfg.vocab_size);
  poison_workspace();
  phase("workspace");

  CallBlob& blob = plans_->blob;  // (the last call synchronised: its upload is done)
  blob.bytes.clear();
  plans_->rows.clear();
  plans_->max_rows = 0;
  const size_t off_tok = blob.add(rows.tokens), off_pos = blob.add(rows.pos), off_out = blob.add(rows.out_rows);
  std::vector<LayerDesc> ld;
  for (size_t li = 0; li < dw_.layers.size(); ++li) ld.push_back(describe_layer(dw_.layers[li], li, rows, a, blob));
  const size_t off_plans = blob.add(plans_->rows);
  const int64_t n_plans = static_cast<int64_t>(plans_->rows.size()), plan_rows = plans_->max_rows;
  phase("layer plans");
  upload_blob(blob, a);
  phase("upload of the plans");
  a.tok = reinterpret_cast<const int32_t*>(a.blob + off_tok);
  a.pos = reinterpret_cast<const int64_t*>(a.blob + off_pos);
  a.out = reinterpret_cast<const int64_t*>(a.blob + off_out);

  // The head writes here (a replayed graph does not run the body's host code).
  const float* logits = ws_->get<float>("logits", rows.O() * cfg.vocab_size);
  auto body = [&] {
    cuda::expand_row_plans(reinterpret_cast<const cuda::RowPlanJob*>(a.blob + off_plans), n_plans, plan_rows,
                           stream_);
    cuda::embed(dw_.embed, a.tok, R, n, a.X, stream_);
    mark("embed");
    bool projected = false;  // by the previous layer's last hc_post, for this layer's first hc_pre
    for (size_t li = 0; li < dw_.layers.size(); ++li) {
      const DeviceLayer& L = dw_.layers[li];
      const cuda::HcParams* next = li + 1 < dw_.layers.size() ? &dw_.layers[li + 1].hc_attn : nullptr;
      projected = run_layer(L, li, L.kind == AttnKind::SWA ? dw_.rope_swa : dw_.rope_compressed, ld[li], rows, a,
                            projected, next);
    }
    DSV4_CHECK(head(dw_.hc_head, dw_.norm, rows, a, nullptr) == logits, "forward: head wrote elsewhere");
  };
  bool graphable = graphs_on_ && !prof_ && R <= kGraphMaxRows;
  for (const CallSegment& sg : rows.segs) graphable = graphable && sg.n <= kGraphMaxChunk;
  if (prof_) prof_->begin(stream_);
  if (graphable)
    graphs_.run(graph_key(rows, ld, blob.bytes.size()), stream_, body);
  else
    body();
  phase("enqueue the ops");
  if (prof_) prof_->end();
  phase("wait for the GPU after the last enqueue");
  if (hidden) {  // every row's streams after the last block (the head reads X, never writes it)
    hidden->resize(static_cast<size_t>(R * n * d));
    if (a.X16) cuda::gather_rows_widen(a.X16, nullptr, R, n * d, a.X, stream_);  // (X is free by now)
    DSV4_CUDA_CHECK(cudaMemcpyAsync(hidden->data(), a.X, hidden->size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));  // also keeps `blob` alive for its async upload
  for (const CallSegment& sg : rows.segs) sg.seq->pos += sg.n;
  *logits_out = logits;
  return rows.O();
}

// Everything a captured forward bakes into its launches besides scratch addresses: the row and
// output counts, each chunk's length (job and ring-store counts), the indexer's grid bound per
// layer, and the blob size (its offsets follow from the rest).
std::vector<int64_t> CudaModel::graph_key(const Rows& rows, const std::vector<LayerDesc>& ld, size_t blob_bytes) const {
  std::vector<int64_t> key = {rows.R(), rows.O(), static_cast<int64_t>(blob_bytes), static_cast<int64_t>(rows.segs.size())};
  for (const CallSegment& sg : rows.segs) key.push_back(sg.n);
  for (const LayerDesc& l : ld) key.push_back(l.max_visible);
  return key;
}

DeviceSequence CudaModel::new_mtp_sequence(int64_t capacity) const {
  DSV4_CHECK(has_mtp(), "MTP: the checkpoint has no mtp.* tensors");
  ModelConfig one = dw_.config;  // the module's state: a single SWA layer
  one.num_layers = 1;
  one.layer_kinds = {AttnKind::SWA};
  one.compress_ratio = {0};
  return DeviceSequence(one, capacity, index_keys_, kv_format_);
}

std::vector<float> CudaModel::mtp_forward(std::span<const DeviceMtpChunk> chunks, bool all_logits,
                                          std::vector<float>* out_streams) {
  DSV4_CHECK(has_mtp(), "MTP: the checkpoint has no mtp.* tensors");
  const DeviceMtp& M = dw_.mtp[0];
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  std::vector<DeviceChunk> dc;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.state && c.state->layers.size() == 1, "MTP forward: not an MTP state");
    dc.push_back({c.state, c.next, false});
  }
  const Rows rows = gather_rows_of(dc, all_logits);  // tokens = each row's next token t+1
  const int64_t R = rows.R();
  Acts a = scratch(R);
  float* e = ws_->get<float>("mtp_e", R * d);
  float* we = ws_->get<float>("mtp_we", R * d);
  float* xh = ws_->get<float>("mtp_xh", R * n * d);
  ws_->get<float>("Xo", rows.O() * n * d);
  ws_->get<float>("hh", rows.O() * d);
  ws_->get<float>("logits", rows.O() * V);
  poison_workspace();

  CallBlob& blob = plans_->blob;  // (the last call synchronised: its upload is done)
  blob.bytes.clear();
  plans_->rows.clear();
  plans_->max_rows = 0;
  const size_t off_tok = blob.add(rows.tokens), off_pos = blob.add(rows.pos), off_out = blob.add(rows.out_rows);
  const LayerDesc ld = describe_layer(M.block, 0, rows, a, blob);
  const size_t off_plans = blob.add(plans_->rows);
  upload_blob(blob, a);
  cuda::expand_row_plans(reinterpret_cast<const cuda::RowPlanJob*>(a.blob + off_plans),
                         static_cast<int64_t>(plans_->rows.size()), plans_->max_rows, stream_);
  a.tok = reinterpret_cast<const int32_t*>(a.blob + off_tok);
  a.pos = reinterpret_cast<const int64_t*>(a.blob + off_pos);
  a.out = reinterpret_cast<const int64_t*>(a.blob + off_out);
  for (size_t ci = 0; ci < chunks.size(); ++ci)
    DSV4_CUDA_CHECK(cudaMemcpyAsync(xh + rows.segs[ci].row0 * n * d, chunks[ci].streams,
                                    rows.segs[ci].n * n * d * sizeof(float), cudaMemcpyHostToDevice, stream_));

  // Z_i = W_h RMSNorm(X_i; hnorm) + W_e RMSNorm(Embed[t+1]; enorm), then the block.
  cuda::embed(dw_.embed, a.tok, R, 1, e, stream_);
  cuda::rms_norm(e, M.enorm, e, R, d, eps, stream_);
  linear(M.e_proj, e, R, we);
  cuda::rms_norm(xh, M.hnorm, xh, R * n, d, eps, stream_);
  linear(M.h_proj, xh, R * n, a.X);
  cuda::add_row_broadcast(a.X, we, R, n, d, stream_);
  run_layer(M.block, 0, dw_.rope_swa, ld, rows, a);
  const float* logits = head(M.hc_head, M.norm, rows, a, out_streams);
  std::vector<float> out(static_cast<size_t>(rows.O() * V));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(out.data(), logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));  // keeps `blob` and the host streams alive until read
  for (const CallSegment& sg : rows.segs) sg.seq->pos += sg.n;
  return out;
}

}  // namespace dsv4
