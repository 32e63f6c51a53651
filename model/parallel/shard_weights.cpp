#include "model/parallel/shard_weights.h"

#include <cstring>

#include "core/error.h"

namespace dsv4 {

namespace {

size_t scale_elem(const WeightView& w) { return dtype_size(w.scale_dtype); }

// Bytes of one stored row of w (FP4 packs two elements per byte).
size_t row_bytes(const WeightView& w) {
  return w.format == WeightFormat::FP4Group32 ? static_cast<size_t>(w.in / 2) : static_cast<size_t>(w.in) * dtype_size(w.dtype);
}

void check_cut(int64_t at, int64_t n, int64_t total, int64_t block, const std::string& name, const char* what) {
  DSV4_CHECK(at >= 0 && n >= 0 && at + n <= total, name, ": ", what, " [", at, ", ", at + n, ") outside [0, ", total, ")");
  const bool end_ok = (at + n) % block == 0 || at + n == total;
  DSV4_CHECK(at % block == 0 && end_ok, "cannot shard ", name, ": ", what, " [", at, ", ", at + n,
             ") cuts its ", block, "-wide quantisation blocks (use a degree that keeps slices multiples of ", block,
             ", or the dequantised checkpoint)");
}

Vec slice_vec(const Vec& v, int64_t b, int64_t n) { return Vec(v.begin() + b, v.begin() + b + n); }

}  // namespace

WeightView slice_rows(const WeightView& w, int64_t r0, int64_t n, const std::string& name) {
  WeightView s = w;
  s.out = n;
  switch (w.format) {
    case WeightFormat::Dense:
      check_cut(r0, n, w.out, 1, name, "rows");
      break;
    case WeightFormat::FP8Block:
      check_cut(r0, n, w.out, 128, name, "rows");
      s.scale = w.scale + static_cast<size_t>(r0 / 128) * w.scale_cols * scale_elem(w);
      break;
    case WeightFormat::FP4Group32:  // one scale row per weight row
      check_cut(r0, n, w.out, 1, name, "rows");
      s.scale = w.scale + static_cast<size_t>(r0) * w.scale_cols * scale_elem(w);
      break;
  }
  s.data = w.data + static_cast<size_t>(r0) * row_bytes(w);
  return s;
}

WeightView slice_cols(const WeightView& w, int64_t c0, int64_t n, const std::string& name,
                      std::vector<std::shared_ptr<const std::vector<uint8_t>>>& store) {
  WeightView s = w;
  s.in = n;
  // Element bytes per column; FP4: two columns per byte, so cuts land on group (32) bounds.
  size_t elem_num = dtype_size(w.dtype), elem_den = 1;
  int64_t block = 1, scale_rows = 0, scale_c0 = 0;
  switch (w.format) {
    case WeightFormat::Dense:
      check_cut(c0, n, w.in, 1, name, "columns");
      break;
    case WeightFormat::FP8Block:
      check_cut(c0, n, w.in, 128, name, "columns");
      block = 128;
      scale_rows = (w.out + 127) / 128;
      break;
    case WeightFormat::FP4Group32:
      check_cut(c0, n, w.in, 32, name, "columns");
      DSV4_CHECK(n % 32 == 0, "cannot shard ", name, ": FP4 column slice of ", n, " is not whole 32-groups");
      elem_num = 1, elem_den = 2, block = 32;
      scale_rows = w.out;
      break;
  }
  const size_t src_row = row_bytes(w), dst_row = static_cast<size_t>(n) * elem_num / elem_den;
  const size_t off = static_cast<size_t>(c0) * elem_num / elem_den;
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(w.out) * dst_row);
  for (int64_t r = 0; r < w.out; ++r) std::memcpy(data->data() + r * dst_row, w.data + r * src_row + off, dst_row);
  s.data = data->data();
  store.push_back(data);
  if (w.format != WeightFormat::Dense) {
    scale_c0 = c0 / block;
    const int64_t cols = (n + block - 1) / block;
    const size_t e = scale_elem(w);
    auto sc = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(scale_rows * cols) * e);
    for (int64_t r = 0; r < scale_rows; ++r)
      std::memcpy(sc->data() + r * cols * e, w.scale + (r * w.scale_cols + scale_c0) * e, cols * e);
    s.scale = sc->data();
    s.scale_cols = cols;
    store.push_back(sc);
  }
  return s;
}

ModelWeights shard_weights(const ModelWeights& full, const ShardSpec& sp) {
  const ModelConfig& cfg = full.config;
  check_shardable(cfg, ParallelLayout{sp.tp_size, sp.ep_size});
  DSV4_CHECK(sp.tp_rank >= 0 && sp.tp_rank < sp.tp_size && sp.ep_rank >= 0 && sp.ep_rank < sp.ep_size,
             "shard_weights: rank outside its group");
  ModelWeights w = full;  // replicated parts: views and small vectors as bound
  const int64_t tp = sp.tp_size, D = cfg.head_dim, Ro = cfg.o_lora_rank;
  const int64_t Gr = cfg.o_groups / tp, Hr = cfg.num_heads / tp, g0 = sp.tp_rank * Gr, h0 = sp.tp_rank * Hr;
  w.config.num_heads = Hr;
  w.config.o_groups = Gr;
  const int64_t E = cfg.n_routed_experts, Er = E / sp.ep_size, e0 = sp.ep_rank * Er;

  for (size_t li = 0; li < w.layers.size(); ++li) {
    LayerWeights& L = w.layers[li];
    const std::string p = "layers." + std::to_string(li);
    if (tp > 1) {
      AttentionWeights& A = L.attn;
      A.wq_b = slice_rows(A.wq_b, h0 * D, Hr * D, p + ".attn.wq_b");
      A.sink = slice_vec(A.sink, h0, Hr);
      A.wo_a = slice_rows(A.wo_a, g0 * Ro, Gr * Ro, p + ".attn.wo_a");
      A.wo_b = slice_cols(A.wo_b, g0 * Ro, Gr * Ro, p + ".attn.wo_b", w.slices);
      ExpertWeights& S = L.ffn.shared;
      const int64_t I = S.w1.out;
      DSV4_CHECK(I % tp == 0, "--tp ", tp, ": ", p, ".ffn.shared_experts width ", I, " is not divisible by it");
      const int64_t Ir = I / tp, i0 = sp.tp_rank * Ir;
      S.w1 = slice_rows(S.w1, i0, Ir, p + ".ffn.shared_experts.w1");
      S.w3 = slice_rows(S.w3, i0, Ir, p + ".ffn.shared_experts.w3");
      S.w2 = slice_cols(S.w2, i0, Ir, p + ".ffn.shared_experts.w2", w.slices);
    }
    for (int64_t e = 0; e < E; ++e)
      if (e < e0 || e >= e0 + Er) L.ffn.experts[e] = ExpertWeights{};  // another rank's
  }
  // The MTP block is not sharded, and the rank's config no longer describes its heads.
  w.mtp.clear();
  w.format.has_mtp = false;
  return w;
}

}  // namespace dsv4
