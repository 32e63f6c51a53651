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

namespace {

// Host-side descriptor blob for one call: every layer's rows and pool jobs, uploaded at once.
struct Blob {
  std::vector<uint8_t> bytes;
  template <typename T>
  size_t add(const std::vector<T>& v) {
    const size_t off = (bytes.size() + 15) / 16 * 16;
    bytes.resize(off + v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(bytes.data() + off, v.data(), v.size() * sizeof(T));
    return off;
  }
};

struct Segment {
  DeviceSequence* seq;
  int64_t row0, n, p0;
};

// Windows closing inside [p0, p0 + n): w in [p0/m, (p0+n)/m - 1].
void add_pool_jobs(std::vector<cuda::PoolJob>& jobs, const Segment& s, int64_t m, int64_t width, const float* a,
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

int64_t CudaModel::forward_device(std::span<const DeviceChunk> chunks, bool all_logits, const float** logits_out,
                                  std::vector<float>* hidden) {
  const ModelConfig& cfg = dw_.config;
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size, H = cfg.num_heads, D = cfg.head_dim;
  const int64_t W = cfg.sliding_window, ql = cfg.q_lora_rank, nI = cfg.index_n_heads, dI = cfg.index_head_dim;
  const int64_t E = cfg.n_routed_experts, K = cfg.num_experts_per_tok, I = cfg.moe_intermediate_size;
  const int64_t P = cfg.rope_dim / 2, G = cfg.o_groups, Ro = cfg.o_lora_rank, topk = std::max<int64_t>(cfg.index_topk, 1);
  const float eps = static_cast<float>(cfg.rms_norm_eps), hc_eps = static_cast<float>(cfg.hc_eps);
  cudaStream_t s = stream_;

  // Rows of this call.
  std::vector<Segment> segs;
  std::vector<int32_t> tokens;
  std::vector<int64_t> pos, out_rows;
  std::set<const DeviceSequence*> seen;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.seq && seen.insert(c.seq).second, "forward: each sequence may appear once per call");
    DSV4_CHECK(!c.tokens.empty(), "forward: empty chunk");
    DSV4_CHECK(c.seq->pos + static_cast<int64_t>(c.tokens.size()) <= c.seq->capacity(), "forward: sequence of ",
               c.seq->pos + c.tokens.size(), " tokens exceeds its capacity ", c.seq->capacity());
    const int64_t row0 = static_cast<int64_t>(tokens.size());
    segs.push_back({c.seq, row0, static_cast<int64_t>(c.tokens.size()), c.seq->pos});
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      DSV4_CHECK(c.tokens[i] >= 0 && c.tokens[i] < V, "token id ", c.tokens[i], " out of range [0, ", V, ")");
      tokens.push_back(c.tokens[i]);
      pos.push_back(c.seq->pos + static_cast<int64_t>(i));
      if (all_logits || c.every_row || i + 1 == c.tokens.size()) out_rows.push_back(row0 + static_cast<int64_t>(i));
    }
  }
  const int64_t R = static_cast<int64_t>(tokens.size()), O = static_cast<int64_t>(out_rows.size());

  Workspace& ws = *ws_;
  float* X = ws.get<float>("X", R * n * d);
  float* u = ws.get<float>("u", R * d);
  float* F = ws.get<float>("F", R * d);
  float* pre = ws.get<float>("pre", R * n);
  float* post = ws.get<float>("post", R * n);
  float* comb = ws.get<float>("comb", R * n * n);
  float* qr = ws.get<float>("qr", R * ql);
  float* q = ws.get<float>("q", R * H * D);
  float* kv = ws.get<float>("kv", R * D);
  float* ca = ws.get<float>("ca", R * 2 * D);
  float* cz = ws.get<float>("cz", R * 2 * D);
  float* ia = ws.get<float>("ia", R * 2 * dI);
  float* iz = ws.get<float>("iz", R * 2 * dI);
  float* qI = ws.get<float>("qI", R * nI * dI);
  float* omega = ws.get<float>("omega", R * nI);
  int32_t* sel = ws.get<int32_t>("sel", R * topk);
  float* o = ws.get<float>("o", R * H * D);
  float* y = ws.get<float>("y", R * G * Ro);
  float* glog = ws.get<float>("glog", R * E);
  int32_t* experts = ws.get<int32_t>("experts", R * K);
  float* eweights = ws.get<float>("eweights", R * K);
  float* gu = ws.get<float>("gu", R * 2 * I);
  float* hbuf = ws.get<float>("h", R * I);
  float* Xo = ws.get<float>("Xo", O * n * d);
  float* hh = ws.get<float>("hh", O * d);
  float* logits = ws.get<float>("logits", O * V);
  if (poison_)
    for (auto& [name, b] : ws.bufs) DSV4_CUDA_CHECK(cudaMemsetAsync(b.get(), 0xFF, b.bytes(), s));

  // Descriptors for every layer, built on the host from positions alone (no device sync).
  Blob blob;
  const size_t off_tok = blob.add(tokens), off_pos = blob.add(pos), off_out = blob.add(out_rows);
  struct LayerDesc {
    size_t attn = 0, idx_rows = 0, cmp_jobs = 0, idx_jobs = 0;
    int64_t n_cmp = 0, n_idx = 0, max_visible = 0;
  };
  std::vector<LayerDesc> ld(dw_.layers.size());
  for (size_t li = 0; li < dw_.layers.size(); ++li) {
    const DeviceLayer& L = dw_.layers[li];
    const int64_t m = L.ratio;
    std::vector<cuda::AttnRow> arows;
    std::vector<cuda::IndexerRow> irows;
    std::vector<cuda::PoolJob> cj, ij;
    for (const Segment& sg : segs) {
      const DeviceLayerState& st = sg.seq->layers[li];
      for (int64_t i = 0; i < sg.n; ++i) {
        const int64_t r = sg.row0 + i, p = pos[r];
        cuda::AttnRow a{p, kv + sg.row0 * D, sg.p0, st.ring, st.entries, 0, nullptr, 0};
        if (L.kind == AttnKind::HCA) a.n_entries = (p + 1) / m;
        if (L.kind == AttnKind::CSA) {
          a.sel = sel + r * topk;
          a.n_sel = topk;
          irows.push_back(cuda::IndexerRow{st.idx_keys, (p + 1) / m});
          ld[li].max_visible = std::max(ld[li].max_visible, (p + 1) / m);
        }
        arows.push_back(a);
      }
      if (L.kind != AttnKind::SWA)
        add_pool_jobs(cj, sg, m, st.cmp_width, ca, cz, st.cmp_a, st.cmp_z, st.cmp_rows, st.entries, D);
      if (L.kind == AttnKind::CSA)
        add_pool_jobs(ij, sg, m, st.idx_width, ia, iz, st.idx_a, st.idx_z, st.idx_rows, st.idx_keys, dI);
    }
    ld[li].attn = blob.add(arows);
    ld[li].idx_rows = blob.add(irows);
    ld[li].cmp_jobs = blob.add(cj);
    ld[li].idx_jobs = blob.add(ij);
    ld[li].n_cmp = static_cast<int64_t>(cj.size());
    ld[li].n_idx = static_cast<int64_t>(ij.size());
  }
  uint8_t* dblob = ws.get<uint8_t>("blob", static_cast<int64_t>(blob.bytes.size()));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dblob, blob.bytes.data(), blob.bytes.size(), cudaMemcpyHostToDevice, s));
  // The host blob must outlive the async copy: wait for it before `blob` goes out of scope below.
  const int32_t* d_tok = reinterpret_cast<const int32_t*>(dblob + off_tok);
  const int64_t* d_pos = reinterpret_cast<const int64_t*>(dblob + off_pos);
  const int64_t* d_out = reinterpret_cast<const int64_t*>(dblob + off_out);
  auto at = [&](size_t off) { return dblob + off; };

  cuda::embed(dw_.embed, d_tok, R, n, X, s);
  for (size_t li = 0; li < dw_.layers.size(); ++li) {
    const DeviceLayer& L = dw_.layers[li];
    const float* rope = L.kind == AttnKind::SWA ? dw_.rope_swa : dw_.rope_compressed;
    const int64_t m = L.ratio;

    // ---- attention sub-layer
    cuda::hc_pre(L.hc_attn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, pre, post, comb, u, s);
    cuda::rms_norm(u, L.attn_norm, u, R, d, eps, s);
    linear(L.wq_a, u, R, qr);
    cuda::rms_norm(qr, L.q_norm, qr, R, ql, eps, s);
    linear(L.wq_b, qr, R, q);
    cuda::rms_norm(q, nullptr, q, R * H, D, eps, s);
    cuda::rope(q, R, H, D, rope, P, d_pos, false, s);
    linear(L.wkv, u, R, kv);
    cuda::rms_norm(kv, L.kv_norm, kv, R, D, eps, s);
    cuda::rope(kv, R, 1, D, rope, P, d_pos, false, s);

    if (L.kind != AttnKind::SWA) {  // compressor (fp32 weights & math, as the official demo)
      const int64_t width = (L.kind == AttnKind::CSA ? 2 : 1) * D;
      linear(L.compressor.wkv, u, R, ca, 0, -1, -1, -1, true);
      linear(L.compressor.wgate, u, R, cz, 0, -1, -1, -1, true);
      cuda::add_ape(cz, d_pos, L.compressor.ape, R, m, width, s);
      cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld[li].cmp_jobs)), ld[li].n_cmp, m, D,
                            L.kind == AttnKind::CSA, L.compressor.norm, eps, rope, P, s);
      for (const Segment& sg : segs) {
        const DeviceLayerState& st = sg.seq->layers[li];
        cuda::ring_store(ca + sg.row0 * width, sg.n, width, sg.p0, st.cmp_a, st.cmp_rows, s);
        cuda::ring_store(cz + sg.row0 * width, sg.n, width, sg.p0, st.cmp_z, st.cmp_rows, s);
      }
    }
    if (L.kind == AttnKind::CSA) {  // lightning indexer
      const int64_t width = 2 * dI;
      linear(L.idx_compressor.wkv, u, R, ia, 0, -1, -1, -1, true);
      linear(L.idx_compressor.wgate, u, R, iz, 0, -1, -1, -1, true);
      cuda::add_ape(iz, d_pos, L.idx_compressor.ape, R, m, width, s);
      cuda::compressor_pool(reinterpret_cast<const cuda::PoolJob*>(at(ld[li].idx_jobs)), ld[li].n_idx, m, dI, true,
                            L.idx_compressor.norm, eps, rope, P, s);
      for (const Segment& sg : segs) {
        const DeviceLayerState& st = sg.seq->layers[li];
        cuda::ring_store(ia + sg.row0 * width, sg.n, width, sg.p0, st.idx_a, st.idx_rows, s);
        cuda::ring_store(iz + sg.row0 * width, sg.n, width, sg.p0, st.idx_z, st.idx_rows, s);
      }
      linear(L.idx_wq_b, qr, R, qI);
      cuda::rope(qI, R, nI, dI, rope, P, d_pos, false, s);
      linear(L.idx_weights_proj, u, R, omega, 0, -1, -1, -1, true);
      cuda::scale_inplace(omega, R * nI, 1.0f / std::sqrt(static_cast<float>(dI)) / std::sqrt(static_cast<float>(nI)), s);
      cuda::indexer_topk(qI, omega, reinterpret_cast<const cuda::IndexerRow*>(at(ld[li].idx_rows)), R, nI, dI, topk,
                         std::max<int64_t>(ld[li].max_visible, 1), sel, s);
    }
    cuda::sparse_attention(q, reinterpret_cast<const cuda::AttnRow*>(at(ld[li].attn)), R, H, D, W, L.sink, o, s);
    cuda::rope(o, R, H, D, rope, P, d_pos, true, s);
    for (const Segment& sg : segs)
      cuda::ring_store(kv + sg.row0 * D, sg.n, D, sg.p0, sg.seq->layers[li].ring, W, s);
    const int64_t gin = H * D / G;  // grouped low-rank output
    for (int64_t g = 0; g < G; ++g) linear(L.wo_a, o + g * gin, R, y + g * Ro, g * Ro, (g + 1) * Ro, H * D, G * Ro);
    linear(L.wo_b, y, R, F);
    cuda::hc_post(post, comb, F, X, R, n, d, s);

    // ---- MoE sub-layer
    cuda::hc_pre(L.hc_ffn, X, R, n, d, cfg.hc_sinkhorn_iters, hc_eps, eps, pre, post, comb, u, s);
    cuda::rms_norm(u, L.ffn_norm, u, R, d, eps, s);
    linear(L.gate, u, R, glog, 0, -1, -1, -1, true);  // router in fp32
    cuda::moe_route(glog, L.gate_bias, L.tid2eid, d_tok, R, E, K, static_cast<float>(cfg.routed_scaling_factor),
                    experts, eweights, s);
    linear(L.shared_w1, u, R, gu, 0, -1, d, 2 * I);
    linear(L.shared_w3, u, R, gu + I, 0, -1, d, 2 * I);
    cuda::swiglu(gu, R, I, static_cast<float>(cfg.swiglu_limit), hbuf, s);
    linear(L.shared_w2, hbuf, R, F);
    moe_->run(L.experts, u, R, experts, eweights, K, static_cast<float>(cfg.swiglu_limit), F, precision_, s);
    cuda::hc_post(post, comb, F, X, R, n, d, s);
  }

  if (hidden) {  // every row's streams, before the head reduces them (synchronised below)
    hidden->resize(static_cast<size_t>(R * n * d));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(hidden->data(), X, hidden->size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  }
  // Head on the requested rows (fp32, as the official demo).
  cuda::gather_rows(X, d_out, O, n * d, Xo, s);
  cuda::hc_head(dw_.hc_head, Xo, O, n, d, hc_eps, eps, hh, s);
  cuda::rms_norm(hh, dw_.norm, hh, O, d, eps, s);
  linear(dw_.head, hh, O, logits, 0, -1, -1, -1, true);
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));  // also keeps `blob` alive for its async upload
  for (const Segment& sg : segs) sg.seq->pos += sg.n;
  *logits_out = logits;
  return O;
}

}  // namespace dsv4
