// Expected tensor list of an official-layout checkpoint (spec/model.md §3.2) and its validation.
#include "model/inventory.h"

#include <set>
#include <sstream>

#include "core/error.h"

namespace dsv4 {

namespace {

const std::vector<DType> kDense{DType::BF16, DType::F32, DType::F16};  // norms, compressor, gate, embed, head
const std::vector<DType> kF32{DType::F32};                             // hc_*, attn_sink, ape, gate.bias

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

std::string dtypes_str(const std::vector<DType>& ds) {
  std::string out;
  for (size_t i = 0; i < ds.size(); ++i) out += (i ? "|" : "") + std::string(dtype_name(ds[i]));
  return out;
}

class Builder {
 public:
  Builder(const ModelConfig& c, const CheckpointFormat& f) : c_(c), f_(f) {}
  std::vector<ExpectedTensor> out;

  void add(std::string name, std::vector<int64_t> shape, const std::vector<DType>& dt) {
    out.push_back({std::move(name), std::move(shape), dt});
  }
  // A linear `p.weight` [o, i] stored in format `fmt`, plus its `.scale` when quantised.
  void linear(const std::string& p, int64_t o, int64_t i, LinearFormat fmt) {
    switch (fmt) {
      case LinearFormat::Dense:
        add(p + ".weight", {o, i}, kDense);
        break;
      case LinearFormat::FP8Block:
        add(p + ".weight", {o, i}, {DType::F8_E4M3});
        add(p + ".scale", {ceil_div(o, 128), ceil_div(i, 128)}, {DType::F8_E8M0, DType::F32});
        break;
      case LinearFormat::FP4Group32:
        if (i % 32 != 0) fail("tensor '", p, ".weight': FP4 needs the input dim divisible by 32, got ", i);
        add(p + ".weight", {o, i / 2}, {DType::I8, DType::U8});
        add(p + ".scale", {o, i / 32}, {DType::F8_E8M0});
        break;
    }
  }
  void hc(const std::string& p, int64_t rows) {  // mHC mixing: fn [rows, n*d], base [rows], scale
    const int64_t n = c_.hc_mult;
    add(p + "fn", {rows, n * c_.hidden_size}, kF32);
    add(p + "base", {rows}, kF32);
    add(p + "scale", {rows == n ? 1 : 3}, kF32);
  }
  // Compressor with `coff` = 2 (overlapping, CSA) or 1 (HCA) over vectors of width `width`.
  void compressor(const std::string& p, int64_t ratio, int64_t coff, int64_t width) {
    add(p + "wkv.weight", {coff * width, c_.hidden_size}, kDense);
    add(p + "wgate.weight", {coff * width, c_.hidden_size}, kDense);
    add(p + "ape", {ratio, coff * width}, kF32);
    add(p + "norm.weight", {width}, kDense);
  }
  // A decoder block: main layer `p` = "layers.i." or the MTP block "mtp.j." (window-only, learned router).
  void block(const std::string& p, AttnKind kind, int64_t ratio, bool hash) {
    const int64_t d = c_.hidden_size, H = c_.num_heads, D = c_.head_dim, q = c_.q_lora_rank;
    const int64_t g = c_.o_groups, rows = (2 + c_.hc_mult) * c_.hc_mult;
    const LinearFormat lf = f_.linears;
    add(p + "attn_norm.weight", {d}, kDense);
    add(p + "ffn_norm.weight", {d}, kDense);
    hc(p + "hc_attn_", rows);
    hc(p + "hc_ffn_", rows);
    const std::string a = p + "attn.";
    linear(a + "wq_a", q, d, lf);
    add(a + "q_norm.weight", {q}, kDense);
    linear(a + "wq_b", H * D, q, lf);
    linear(a + "wkv", D, d, lf);
    add(a + "kv_norm.weight", {D}, kDense);
    linear(a + "wo_a", g * c_.o_lora_rank, H * D / g, lf);
    linear(a + "wo_b", d, g * c_.o_lora_rank, lf);
    add(a + "attn_sink", {H}, kF32);
    if (kind != AttnKind::SWA) compressor(a + "compressor.", ratio, kind == AttnKind::CSA ? 2 : 1, D);
    if (kind == AttnKind::CSA) {
      const int64_t nI = c_.index_n_heads, dI = c_.index_head_dim;
      linear(a + "indexer.wq_b", nI * dI, q, lf);
      add(a + "indexer.weights_proj.weight", {nI, d}, kDense);
      compressor(a + "indexer.compressor.", ratio, 2, dI);
    }
    const std::string m = p + "ffn.";
    const int64_t E = c_.n_routed_experts, I = c_.moe_intermediate_size;
    add(m + "gate.weight", {E, d}, kDense);
    if (hash)
      add(m + "gate.tid2eid", {c_.vocab_size, c_.num_experts_per_tok}, {DType::I64, DType::I32});
    else
      add(m + "gate.bias", {E}, kF32);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      linear(x + "w1", I, d, f_.experts);
      linear(x + "w2", d, I, f_.experts);
      linear(x + "w3", I, d, f_.experts);
    }
    linear(m + "shared_experts.w1", I, d, lf);
    linear(m + "shared_experts.w2", d, I, lf);
    linear(m + "shared_experts.w3", I, d, lf);
  }

 private:
  const ModelConfig& c_;
  const CheckpointFormat& f_;
};

// The storage format of a linear from its weight's dtype.
LinearFormat format_of(const std::map<std::string, TensorInfo>& t, const std::string& name, bool expert) {
  auto it = t.find(name);
  if (it == t.end()) fail("missing tensor '", name, "' (needed to detect the checkpoint format)");
  switch (it->second.dtype) {
    case DType::F8_E4M3: return LinearFormat::FP8Block;
    case DType::BF16: case DType::F32: case DType::F16: return LinearFormat::Dense;
    case DType::I8: case DType::U8:
      if (expert) return LinearFormat::FP4Group32;
      [[fallthrough]];
    default:
      fail("tensor '", name, "': unsupported dtype ", dtype_name(it->second.dtype), " (expected F8_E4M3, BF16, F32",
           expert ? ", I8 (packed FP4)" : "", ")");
  }
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg, const CheckpointFormat& fmt) {
  Builder b(cfg, fmt);
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult;
  b.add("embed.weight", {cfg.vocab_size, d}, kDense);
  b.add("head.weight", {cfg.vocab_size, d}, kDense);
  b.add("norm.weight", {d}, kDense);
  b.hc("hc_head_", n);
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    b.block("layers." + std::to_string(i) + ".", cfg.layer_kinds.at(i), cfg.compress_ratio.at(i), cfg.is_hash_layer(i));
  if (fmt.has_mtp) {
    for (int64_t j = 0; j < cfg.num_nextn_predict_layers; ++j) {
      const std::string p = "mtp." + std::to_string(j) + ".";
      b.block(p, AttnKind::SWA, 0, false);
      b.linear(p + "e_proj", d, d, fmt.linears);
      b.linear(p + "h_proj", d, d, fmt.linears);
      b.add(p + "enorm.weight", {d}, kDense);
      b.add(p + "hnorm.weight", {d}, kDense);
      b.add(p + "norm.weight", {d}, kDense);
      b.hc(p + "hc_head_", n);
    }
  }
  return std::move(b.out);
}

CheckpointFormat validate_checkpoint(const ModelConfig& cfg, const std::map<std::string, TensorInfo>& tensors) {
  CheckpointFormat fmt;
  fmt.linears = format_of(tensors, "layers.0.attn.wq_a.weight", false);
  fmt.experts = format_of(tensors, "layers.0.ffn.experts.0.w1.weight", true);
  // MTP weights are optional as a whole: any mtp.* tensor means all of them must be there.
  auto first_mtp = tensors.lower_bound("mtp.");
  fmt.has_mtp = first_mtp != tensors.end() && first_mtp->first.rfind("mtp.", 0) == 0;

  std::set<std::string> seen;
  std::vector<std::string> missing;
  for (const auto& e : expected_tensors(cfg, fmt)) {
    auto it = tensors.find(e.name);
    if (it == tensors.end()) {
      missing.push_back(e.name);
      continue;
    }
    seen.insert(e.name);
    const TensorInfo& t = it->second;
    if (t.shape != e.shape)
      fail("tensor '", e.name, "': shape ", shape_str(t.shape), ", expected ", shape_str(e.shape));
    bool ok = false;
    for (DType dt : e.dtypes) ok = ok || dt == t.dtype;
    if (!ok) fail("tensor '", e.name, "': dtype ", dtype_name(t.dtype), ", expected ", dtypes_str(e.dtypes));
  }
  if (!missing.empty()) {
    std::string msg = "checkpoint lacks " + std::to_string(missing.size()) + " tensor(s): ";
    for (size_t i = 0; i < missing.size() && i < 10; ++i) msg += (i ? ", '" : "'") + missing[i] + "'";
    if (missing.size() > 10) msg += ", ...";
    for (const auto& m : missing)
      if (m.rfind("mtp.", 0) == 0) {
        msg += " (MTP weights must be complete or absent)";
        break;
      }
    fail(msg);
  }
  if (seen.size() != tensors.size()) {
    std::vector<std::string> extra;
    for (const auto& [name, info] : tensors)
      if (!seen.count(name)) extra.push_back(name);
    std::string msg = "checkpoint has " + std::to_string(extra.size()) + " unexpected tensor(s): ";
    for (size_t i = 0; i < extra.size() && i < 10; ++i) msg += (i ? ", '" : "'") + extra[i] + "'";
    if (extra.size() > 10) msg += ", ...";
    fail(msg);
  }
  return fmt;
}

}  // namespace dsv4
