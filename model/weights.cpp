#include "model/weights.h"

#include <cstring>

#include "core/error.h"

namespace dsv4 {

namespace {

class Binder {
 public:
  explicit Binder(const Checkpoint& ck) : ck_(ck) {}

  Vec vec(const std::string& name) const {
    const TensorRef& t = ck_.get(name);
    const int64_t n = t.info.numel();
    Vec v(static_cast<size_t>(n));
    switch (t.info.dtype) {
      case DType::F32:
        std::memcpy(v.data(), t.data, n * 4);
        break;
      case DType::BF16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t b;
          std::memcpy(&b, t.data + 2 * i, 2);
          v[i] = bf16_to_f32(b);
        }
        break;
      default:
        fail("tensor '", name, "': expected F32 or BF16, found ", dtype_name(t.info.dtype));
    }
    return v;
  }

  WeightView matrix(const std::string& prefix) const {
    const TensorRef& t = ck_.get(prefix + ".weight");
    DSV4_CHECK(t.info.shape.size() == 2, "tensor '", prefix, ".weight' must be 2-D");
    WeightView w;
    w.out = t.info.shape[0];
    w.data = t.data;
    w.dtype = t.info.dtype;
    switch (t.info.dtype) {
      case DType::F32:
      case DType::BF16:
        w.format = WeightFormat::Dense;
        w.in = t.info.shape[1];
        return w;
      case DType::F8_E4M3:
        w.format = WeightFormat::FP8Block;
        w.in = t.info.shape[1];
        break;
      case DType::I8:
      case DType::U8:
        w.format = WeightFormat::FP4Group32;
        w.in = t.info.shape[1] * 2;
        break;
      default:
        fail("tensor '", prefix, ".weight': unsupported weight dtype ", dtype_name(t.info.dtype));
    }
    const TensorRef& s = ck_.get(prefix + ".scale");
    w.scale = s.data;
    w.scale_dtype = s.info.dtype;
    w.scale_cols = s.info.shape.size() == 2 ? s.info.shape[1] : 1;
    return w;
  }

  HcWeights hc(const std::string& fn, const std::string& base, const std::string& scale) const {
    return HcWeights{vec(fn), vec(base), vec(scale)};
  }

  CompressorWeights compressor(const std::string& p) const {
    CompressorWeights c;
    c.wkv = matrix(p + ".wkv");
    c.wgate = matrix(p + ".wgate");
    c.ape = vec(p + ".ape");
    c.norm = vec(p + ".norm.weight");
    return c;
  }

  ExpertWeights expert(const std::string& p) const {
    return ExpertWeights{matrix(p + ".w1"), matrix(p + ".w2"), matrix(p + ".w3")};
  }

  LayerWeights layer(const ModelConfig& cfg, const std::string& p, AttnKind kind, int64_t ratio, bool hash) const {
    LayerWeights L;
    L.kind = kind;
    L.ratio = ratio;
    L.hash = hash;
    L.attn_norm = vec(p + ".attn_norm.weight");
    L.ffn_norm = vec(p + ".ffn_norm.weight");
    L.hc_attn = hc(p + ".hc_attn_fn", p + ".hc_attn_base", p + ".hc_attn_scale");
    L.hc_ffn = hc(p + ".hc_ffn_fn", p + ".hc_ffn_base", p + ".hc_ffn_scale");
    AttentionWeights& A = L.attn;
    const std::string a = p + ".attn";
    A.wq_a = matrix(a + ".wq_a");
    A.wq_b = matrix(a + ".wq_b");
    A.wkv = matrix(a + ".wkv");
    A.wo_a = matrix(a + ".wo_a");
    A.wo_b = matrix(a + ".wo_b");
    A.q_norm = vec(a + ".q_norm.weight");
    A.kv_norm = vec(a + ".kv_norm.weight");
    A.sink = vec(a + ".attn_sink");
    if (kind != AttnKind::SWA) {
      A.has_compressor = true;
      A.compressor = compressor(a + ".compressor");
    }
    if (kind == AttnKind::CSA) {
      A.has_indexer = true;
      A.indexer.wq_b = matrix(a + ".indexer.wq_b");
      A.indexer.weights_proj = matrix(a + ".indexer.weights_proj");
      A.indexer.compressor = compressor(a + ".indexer.compressor");
    }
    MoeWeights& F = L.ffn;
    const std::string f = p + ".ffn";
    F.gate = matrix(f + ".gate");
    if (hash) {
      const TensorRef& t = ck_.get(f + ".gate.tid2eid");
      const int64_t n = t.info.numel();
      F.tid2eid.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        int64_t v;
        if (t.info.dtype == DType::I64) {
          std::memcpy(&v, t.data + 8 * i, 8);
        } else {
          int32_t v32;
          std::memcpy(&v32, t.data + 4 * i, 4);
          v = v32;
        }
        DSV4_CHECK(v >= 0 && v < cfg.n_routed_experts, "tensor '", f, ".gate.tid2eid': expert id ", v,
                   " out of range [0, ", cfg.n_routed_experts, ")");
        F.tid2eid[i] = static_cast<int32_t>(v);
      }
    } else {
      F.bias = vec(f + ".gate.bias");
    }
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e) F.experts.push_back(expert(f + ".experts." + std::to_string(e)));
    F.shared = expert(f + ".shared_experts");
    return L;
  }

 private:
  const Checkpoint& ck_;
};

}  // namespace

ModelWeights bind_weights(const ModelConfig& cfg, std::shared_ptr<Checkpoint> ckpt) {
  std::map<std::string, TensorInfo> infos;
  for (const auto& [name, ref] : ckpt->tensors()) infos[name] = ref.info;
  ModelWeights W;
  W.config = cfg;
  W.format = validate_checkpoint(cfg, infos);
  W.checkpoint = ckpt;
  Binder b(*ckpt);
  W.embed = b.matrix("embed");
  W.head = b.matrix("head");
  W.norm = b.vec("norm.weight");
  W.hc_head = b.hc("hc_head_fn", "hc_head_base", "hc_head_scale");
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    W.layers.push_back(b.layer(cfg, "layers." + std::to_string(i), cfg.layer_kinds[i], cfg.compress_ratio[i],
                               cfg.is_hash_layer(i)));
  if (W.format.has_mtp) {
    for (int64_t j = 0; j < cfg.num_nextn_predict_layers; ++j) {
      const std::string p = "mtp." + std::to_string(j);
      MtpWeights M;
      M.block = b.layer(cfg, p, AttnKind::SWA, 0, false);
      M.e_proj = b.matrix(p + ".e_proj");
      M.h_proj = b.matrix(p + ".h_proj");
      M.enorm = b.vec(p + ".enorm.weight");
      M.hnorm = b.vec(p + ".hnorm.weight");
      M.norm = b.vec(p + ".norm.weight");
      M.hc_head = b.hc(p + ".hc_head_fn", p + ".hc_head_base", p + ".hc_head_scale");
      W.mtp.push_back(std::move(M));
    }
  }
  return W;
}

ModelWeights load_weights(const std::string& dir) {
  ModelConfig cfg = load_config(dir + "/config.json");
  return bind_weights(cfg, std::make_shared<Checkpoint>(dir));
}

}  // namespace dsv4
