#include "model/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

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
    const size_t need = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    if (b.bytes() < need) b = cuda::DeviceBuffer(need + need / 2);
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

struct CallSegment {
  DeviceSequence* seq;
  int64_t row0, n, p0;
};

namespace {

// Windows closing inside [p0, p0 + n): w in [p0/m, (p0+n)/m - 1].
void add_pool_jobs(std::vector<cuda::PoolJob>& jobs, const CallSegment& s, int64_t m, int64_t width, const float* a,
                   const float* z, const float* ring_a, const float* ring_z, int64_t ring_rows, float* entries,
                   int64_t c) {
  for (int64_t w = s.p0 / m; w < (s.p0 + s.n) / m; ++w)
    jobs.push_back(cuda::PoolJob{a + s.row0 * width, z + s.row0 * width, s.p0, ring_a, ring_z, ring_rows, w,
                                 entries + w * c});
}

}  // namespace

CudaModel::CudaModel(const ModelWeights& w, cuda::Precision precision)
    : dw_(upload_weights(w)), precision_(precision), ws_(std::make_unique<Workspace>()) {
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  fast_ = std::make_unique<cuda::FastLinear>();
  moe_ = std::make_unique<cuda::MoeRunner>();
}

CudaModel::~CudaModel() {
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaModel::linear(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin,
                       int64_t row_end, int64_t ldx, int64_t ldy, bool exact) {
  if (row_end < 0) row_end = w.out;
  if (ldx < 0) ldx = w.in;
  if (ldy < 0) ldy = row_end - row_begin;
  if (exact || precision_ == cuda::Precision::Exact) {
    cuda::linear_exact(w, x, rows, y, row_begin, row_end, ldx, ldy, stream_);
  } else {
    fast_->run(w, x, rows, y, row_begin, row_end, ldx, ldy, stream_);
  }
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
  size_t attn = 0, idx_rows = 0, cmp_jobs = 0, idx_jobs = 0;
  int64_t n_cmp = 0, n_idx = 0, max_visible = 0;
};

// Scratch activations of one call (workspace buffers sized for its rows).
struct CudaModel::Acts {
  float *X, *u, *F, *pre, *post, *comb, *qr, *q, *kv, *ca, *cz, *ia, *iz, *qI, *omega, *o, *y, *glog, *eweights, *gu,
      *hbuf;
  int32_t *sel, *experts;
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
  a.pre = ws.get<float>("pre", R * n);
  a.post = ws.get<float>("post", R * n);
  a.comb = ws.get<float>("comb", R * n * n);
  a.qr = ws.get<float>("qr", R * ql);
  a.q = ws.get<float>("q", R * H * D);
  a.kv = ws.get<float>("kv", R * D);
  a.ca = ws.get<float>("ca", R * 2 * D);
  a.cz = ws.get<float>("cz", R * 2 * D);
  a.ia = ws.get<float>("ia", R * 2 * dI);
  a.iz = ws.get<float>("iz", R * 2 * dI);
  a.qI = ws.get<float>("qI", R * nI * dI);
  a.omega = ws.get<float>("omega", R * nI);
  a.sel = ws.get<int32_t>("sel", R * topk);
  a.o = ws.get<float>("o", R * H * D);
  a.y = ws.get<float>("y", R * G * Ro);
  a.glog = ws.get<float>("glog", R * E);
  a.experts = ws.get<int32_t>("experts", R * K);
  a.eweights = ws.get<float>("eweights", R * K);
  a.gu = ws.get<float>("gu", R * 2 * I);
  a.hbuf = ws.get<float>("h", R * I);
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
  LayerDesc ld;
  std::vector<cuda::AttnRow> arows;
  std::vector<cuda::IndexerRow> irows;
  std::vector<cuda::PoolJob> cj, ij;
  for (const CallSegment& sg : rows.segs) {
    const DeviceLayerState& st = sg.seq->layers[li];
    for (int64_t i = 0; i < sg.n; ++i) {
      const int64_t r = sg.row0 + i, p = rows.pos[r];
      cuda::AttnRow ar{p, a.kv + sg.row0 * D, sg.p0, st.ring, st.entries, 0, nullptr, 0};
      if (L.kind == AttnKind::HCA) ar.n_entries = (p + 1) / m;
      if (L.kind == AttnKind::CSA) {
        ar.sel = a.sel + r * topk;
        ar.n_sel = topk;
        irows.push_back(cuda::IndexerRow{st.idx_keys, (p + 1) / m});
        ld.max_visible = std::max(ld.max_visible, (p + 1) / m);
      }
      arows.push_back(ar);
    }
    if (L.kind != AttnKind::SWA)
      add_pool_jobs(cj, sg, m, st.cmp_width, a.ca, a.cz, st.cmp_a, st.cmp_z, st.cmp_rows, st.entries, D);
    if (L.kind == AttnKind::CSA)
      add_pool_jobs(ij, sg, m, st.idx_width, a.ia, a.iz, st.idx_a, st.idx_z, st.idx_rows, st.idx_keys,
                    cfg.index_head_dim);
  }
  ld.attn = blob.add(arows);
  ld.idx_rows = blob.add(irows);
  ld.cmp_jobs = blob.add(cj);
  ld.idx_jobs = blob.add(ij);
  ld.n_cmp = static_cast<int64_t>(cj.size());
  ld.n_idx = static_cast<int64_t>(ij.size());
  return ld;
}

// Uploads the call's descriptor blob; the host blob must stay alive until the stream syncs.
void CudaModel::upload_blob(const CallBlob& blob, Acts& a) {
  uint8_t* d = ws_->get<uint8_t>("blob", static_cast<int64_t>(blob.bytes.size()));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(d, blob.bytes.data(), blob.bytes.size(), cudaMemcpyHostToDevice, stream_));
  a.blob = d;
}

// One decoder block (attention then MoE sub-layer) on the streams a.X, state layer li.
void CudaModel::run_layer(const DeviceLayer& L, size_t li, const float* rope, const LayerDesc& ld, const Rows& rows,
                          const Acts& a) {
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

  // ---- attention sub-layer
  cuda::hc_pre(L.hc_attn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, a.pre, a.post, a.comb, u, s);
  cuda::rms_norm(u, L.attn_norm, u, R, d, eps, s);
  linear(L.wq_a, u, R, qr);
  cuda::rms_norm(qr, L.q_norm, qr, R, ql, eps, s);
  linear(L.wq_b, qr, R, q);
  cuda::rms_norm(q, nullptr, q, R * H, D, eps, s);
  cuda::rope(q, R, H, D, rope, P, a.pos, false, s);
  linear(L.wkv, u, R, kv);
  cuda::rms_norm(kv, L.kv_norm, kv, R, D, eps, s);
  cuda::rope(kv, R, 1, D, rope, P, a.pos, false, s);

  if (L.kind != AttnKind::SWA) {  // compressor (fp32 weights & math, as the official demo)
    const int64_t width = (L.kind == AttnKind::CSA ? 2 : 1) * D;
    linear(L.compressor.wkv, u, R, a.ca, 0, -1, -1, -1, true);
    linear(L.compressor.wgate, u, R, a.cz, 0, -1, -1, -1, true);
    cuda::add_ape(a.cz, a.pos, L.compressor.ape, R, m, width, s);
    cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld.cmp_jobs)), ld.n_cmp, m, D,
                          L.kind == AttnKind::CSA, L.compressor.norm, eps, rope, P, s);
    for (const CallSegment& sg : rows.segs) {
      const DeviceLayerState& st = sg.seq->layers[li];
      cuda::ring_store(a.ca + sg.row0 * width, sg.n, width, sg.p0, st.cmp_a, st.cmp_rows, s);
      cuda::ring_store(a.cz + sg.row0 * width, sg.n, width, sg.p0, st.cmp_z, st.cmp_rows, s);
    }
  }
  if (L.kind == AttnKind::CSA) {  // lightning indexer
    const int64_t width = 2 * dI;
    linear(L.idx_compressor.wkv, u, R, a.ia, 0, -1, -1, -1, true);
    linear(L.idx_compressor.wgate, u, R, a.iz, 0, -1, -1, -1, true);
    cuda::add_ape(a.iz, a.pos, L.idx_compressor.ape, R, m, width, s);
    cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld.idx_jobs)), ld.n_idx, m, dI, true,
                          L.idx_compressor.norm, eps, rope, P, s);
    for (const CallSegment& sg : rows.segs) {
      const DeviceLayerState& st = sg.seq->layers[li];
      cuda::ring_store(a.ia + sg.row0 * width, sg.n, width, sg.p0, st.idx_a, st.idx_rows, s);
      cuda::ring_store(a.iz + sg.row0 * width, sg.n, width, sg.p0, st.idx_z, st.idx_rows, s);
    }
    linear(L.idx_wq_b, qr, R, a.qI);
    cuda::rope(a.qI, R, nI, dI, rope, P, a.pos, false, s);
    linear(L.idx_weights_proj, u, R, a.omega, 0, -1, -1, -1, true);
    cuda::scale_inplace(a.omega, R * nI, 1.0f / std::sqrt(static_cast<float>(dI)) / std::sqrt(static_cast<float>(nI)), s);
    cuda::indexer_topk(a.qI, a.omega, reinterpret_cast<const cuda::IndexerRow*>(at(ld.idx_rows)), R, nI, dI, topk,
                       std::max<int64_t>(ld.max_visible, 1), a.sel, s);
  }
  cuda::sparse_attention(q, reinterpret_cast<const cuda::AttnRow*>(at(ld.attn)), R, H, D, W, L.sink, o, s);
  cuda::rope(o, R, H, D, rope, P, a.pos, true, s);
  for (const CallSegment& sg : rows.segs)
    cuda::ring_store(kv + sg.row0 * D, sg.n, D, sg.p0, sg.seq->layers[li].ring, W, s);
  const int64_t gin = H * D / G;  // grouped low-rank output
  for (int64_t g = 0; g < G; ++g) linear(L.wo_a, o + g * gin, R, a.y + g * Ro, g * Ro, (g + 1) * Ro, H * D, G * Ro);
  linear(L.wo_b, a.y, R, F);
  cuda::hc_post(a.post, a.comb, F, X, R, n, d, s);

  // ---- MoE sub-layer
  cuda::hc_pre(L.hc_ffn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, a.pre, a.post, a.comb, u, s);
  cuda::rms_norm(u, L.ffn_norm, u, R, d, eps, s);
  linear(L.gate, u, R, a.glog, 0, -1, -1, -1, true);  // router in fp32
  cuda::moe_route(a.glog, L.gate_bias, L.tid2eid, a.tok, R, E, K, static_cast<float>(cfg.routed_scaling_factor),
                  a.experts, a.eweights, s);
  linear(L.shared_w1, u, R, a.gu, 0, -1, d, 2 * I);
  linear(L.shared_w3, u, R, a.gu + I, 0, -1, d, 2 * I);
  cuda::swiglu(a.gu, R, I, static_cast<float>(cfg.swiglu_limit), a.hbuf, s);
  linear(L.shared_w2, a.hbuf, R, F);
  moe_->run(L.experts, u, R, a.experts, a.eweights, K, static_cast<float>(cfg.swiglu_limit), F, precision_, s);
  cuda::hc_post(a.post, a.comb, F, X, R, n, d, s);
}

// hc_head → RMSNorm → the shared head on the output rows of a.X (fp32, as the official demo);
// out_streams (optional) receives those rows' streams.
const float* CudaModel::head(const cuda::HcParams& hc, const float* norm, const Rows& rows, const Acts& a,
                             std::vector<float>* out_streams) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size, O = rows.O();
  const float eps = static_cast<float>(cfg.rms_norm_eps), hc_eps = static_cast<float>(cfg.hc_eps);
  float* Xo = ws_->get<float>("Xo", O * n * d);
  float* hh = ws_->get<float>("hh", O * d);
  float* logits = ws_->get<float>("logits", O * V);
  cuda::gather_rows(a.X, a.out, O, n * d, Xo, stream_);
  if (out_streams) {
    out_streams->resize(static_cast<size_t>(O * n * d));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(out_streams->data(), Xo, out_streams->size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  cuda::hc_head(hc, Xo, O, n, d, hc_eps, eps, hh, stream_);
  cuda::rms_norm(hh, norm, hh, O, d, eps, stream_);
  linear(dw_.head, hh, O, logits, 0, -1, -1, -1, true);
  return logits;
}

void CudaModel::poison_workspace() {
  if (poison_)
    for (auto& [name, b] : ws_->bufs) DSV4_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xFF, b.bytes(), stream_));
}

int64_t CudaModel::forward_device(std::span<const DeviceChunk> chunks, bool all_logits, const float** logits_out,
                                  std::vector<float>* hidden) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult;
  const Rows rows = gather_rows_of(chunks, all_logits);
  const int64_t R = rows.R();
  Acts a = scratch(R);
  ws_->get<float>("Xo", rows.O() * n * d);  // size every buffer before poisoning
  ws_->get<float>("hh", rows.O() * d);
  ws_->get<float>("logits", rows.O() * cfg.vocab_size);
  poison_workspace();

  CallBlob blob;
  const size_t off_tok = blob.add(rows.tokens), off_pos = blob.add(rows.pos), off_out = blob.add(rows.out_rows);
  std::vector<LayerDesc> ld;
  for (size_t li = 0; li < dw_.layers.size(); ++li) ld.push_back(describe_layer(dw_.layers[li], li, rows, a, blob));
  upload_blob(blob, a);
  a.tok = reinterpret_cast<const int32_t*>(a.blob + off_tok);
  a.pos = reinterpret_cast<const int64_t*>(a.blob + off_pos);
  a.out = reinterpret_cast<const int64_t*>(a.blob + off_out);

  cuda::embed(dw_.embed, a.tok, R, n, a.X, stream_);
  for (size_t li = 0; li < dw_.layers.size(); ++li) {
    const DeviceLayer& L = dw_.layers[li];
    run_layer(L, li, L.kind == AttnKind::SWA ? dw_.rope_swa : dw_.rope_compressed, ld[li], rows, a);
  }
  if (hidden) {  // every row's streams, before the head reduces them (synchronised below)
    hidden->resize(static_cast<size_t>(R * n * d));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(hidden->data(), a.X, hidden->size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  }
  const float* logits = head(dw_.hc_head, dw_.norm, rows, a, nullptr);
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));  // also keeps `blob` alive for its async upload
  for (const CallSegment& sg : rows.segs) sg.seq->pos += sg.n;
  *logits_out = logits;
  return rows.O();
}

DeviceSequence CudaModel::new_mtp_sequence(int64_t capacity) const {
  DSV4_CHECK(has_mtp(), "MTP: the checkpoint has no mtp.* tensors");
  ModelConfig one = dw_.config;  // the module's state: a single SWA layer
  one.num_layers = 1;
  one.layer_kinds = {AttnKind::SWA};
  one.compress_ratio = {0};
  return DeviceSequence(one, capacity);
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

  CallBlob blob;
  const size_t off_tok = blob.add(rows.tokens), off_pos = blob.add(rows.pos), off_out = blob.add(rows.out_rows);
  const LayerDesc ld = describe_layer(M.block, 0, rows, a, blob);
  upload_blob(blob, a);
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
