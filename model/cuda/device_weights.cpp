#include "model/cuda/device_weights.h"

#include <map>

#include "core/error.h"
#include "model/rope.h"

namespace dsv4 {

namespace {

// Maps host tensor pointers (into the mmap) to their device copies, and uploads fp32 vectors.
class Uploader {
 public:
  Uploader(const Checkpoint& ck, DeviceWeights& out) : out_(out) {
    // Tensors already in device memory (random benchmark weights) are used in place.
    std::vector<const TensorRef*> host;
    for (const auto& [name, ref] : ck.tensors()) {
      if (cuda::is_device_pointer(ref.data)) {
        dev_[ref.data] = const_cast<uint8_t*>(ref.data);
        out_.bytes += ref.info.nbytes();
      } else {
        host.push_back(&ref);
      }
    }
    size_t total = 0;
    for (const TensorRef* ref : host) total += align(ref->info.nbytes());
    out_.storage.emplace_back(total);
    char* base = out_.storage.back().as<char>();
    size_t off = 0;
    for (const TensorRef* r : host) {
      const TensorRef& ref = *r;
      out_.storage.back().upload(ref.data, ref.info.nbytes(), off);
      dev_[ref.data] = base + off;
      off += align(ref.info.nbytes());
    }
    out_.bytes += total;
  }

  const uint8_t* dev(const uint8_t* host) const {
    auto it = dev_.find(host);
    DSV4_CHECK(it != dev_.end(), "upload_weights: tensor not in the checkpoint");
    return static_cast<const uint8_t*>(it->second);
  }

  WeightView view(const WeightView& w) const {
    if (w.empty()) return w;
    WeightView d = w;
    d.data = dev(w.data);
    if (w.scale) d.scale = dev(w.scale);
    return d;
  }

  template <typename T>
  const T* vec(const std::vector<T>& v) {
    out_.storage.push_back(cuda::to_device(v));
    out_.bytes += out_.storage.back().bytes();
    return out_.storage.back().template as<const T>();
  }

  cuda::HcParams hc(const HcWeights& h) { return cuda::HcParams{vec(h.fn), vec(h.base), vec(h.scale)}; }

  DeviceCompressor compressor(const CompressorWeights& c) {
    return DeviceCompressor{view(c.wkv), view(c.wgate), vec(c.ape), vec(c.norm)};
  }

 private:
  static size_t align(size_t n) { return (n + 255) / 256 * 256; }
  DeviceWeights& out_;
  std::map<const void*, void*> dev_;
};

DeviceLayer upload_layer(Uploader& up, const LayerWeights& L, const ModelConfig& cfg) {
  DeviceLayer D;
  D.kind = L.kind;
  D.ratio = L.ratio;
  D.hash = L.hash;
  D.attn_norm = up.vec(L.attn_norm);
  D.ffn_norm = up.vec(L.ffn_norm);
  D.hc_attn = up.hc(L.hc_attn);
  D.hc_ffn = up.hc(L.hc_ffn);
  const AttentionWeights& A = L.attn;
  D.wq_a = up.view(A.wq_a);
  D.wq_b = up.view(A.wq_b);
  D.wkv = up.view(A.wkv);
  D.wo_a = up.view(A.wo_a);
  D.wo_b = up.view(A.wo_b);
  D.q_norm = up.vec(A.q_norm);
  D.kv_norm = up.vec(A.kv_norm);
  D.sink = up.vec(A.sink);
  if (A.has_compressor) D.compressor = up.compressor(A.compressor);
  if (A.has_indexer) {
    D.idx_wq_b = up.view(A.indexer.wq_b);
    D.idx_weights_proj = up.view(A.indexer.weights_proj);
    D.idx_compressor = up.compressor(A.indexer.compressor);
  }
  D.gate = up.view(L.ffn.gate);
  if (L.hash) D.tid2eid = up.vec(L.ffn.tid2eid);
  else D.gate_bias = up.vec(L.ffn.bias);
  D.experts.d = cfg.hidden_size;
  D.experts.I = cfg.moe_intermediate_size;
  for (const ExpertWeights& e : L.ffn.experts) {
    D.experts.w1.push_back(up.view(e.w1));
    D.experts.w2.push_back(up.view(e.w2));
    D.experts.w3.push_back(up.view(e.w3));
  }
  D.shared_w1 = up.view(L.ffn.shared.w1);
  D.shared_w2 = up.view(L.ffn.shared.w2);
  D.shared_w3 = up.view(L.ffn.shared.w3);
  return D;
}

}  // namespace

DeviceWeights upload_weights(const ModelWeights& w) {
  DeviceWeights d;
  d.config = w.config;
  d.source = w.checkpoint;
  Uploader up(*w.checkpoint, d);
  d.embed = up.view(w.embed);
  d.head = up.view(w.head);
  d.norm = up.vec(w.norm);
  d.hc_head = up.hc(w.hc_head);
  d.rope_swa = up.vec(make_rope_freqs(w.config, false).inv_freq);
  d.rope_compressed = up.vec(make_rope_freqs(w.config, true).inv_freq);
  for (const LayerWeights& L : w.layers) d.layers.push_back(upload_layer(up, L, w.config));
  for (const MtpWeights& M : w.mtp) {
    DeviceMtp D;
    D.block = upload_layer(up, M.block, w.config);
    D.e_proj = up.view(M.e_proj);
    D.h_proj = up.view(M.h_proj);
    D.enorm = up.vec(M.enorm);
    D.hnorm = up.vec(M.hnorm);
    D.norm = up.vec(M.norm);
    D.hc_head = up.hc(M.hc_head);
    d.mtp.push_back(std::move(D));
  }
  return d;
}

}  // namespace dsv4
