// config.json parser: the official key set and the transformers (5.17) key set, spec §2.1/§2.3.
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/config.h"

namespace dsv4 {

using nlohmann::json;

namespace {

constexpr const char* kCSA = "compressed_sparse_attention";
constexpr const char* kHCA = "heavily_compressed_attention";
constexpr const char* kSWA = "sliding_attention";

// Typed access to one JSON object; every error names the field (with its path, e.g. rope_scaling.factor).
class Fields {
 public:
  Fields(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {}
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const { return j_.at(k); }
  std::string name(const char* k) const { return prefix_ + k; }

  int64_t integer(const char* k) const {
    require(k);
    const json& v = j_[k];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) return static_cast<int64_t>(v.get<double>());
    fail("config: '", name(k), "' must be an integer, got ", v.dump());
  }
  int64_t integer(const char* k, int64_t def) const { return has(k) ? integer(k) : def; }
  double number(const char* k) const {
    require(k);
    if (!j_[k].is_number()) fail("config: '", name(k), "' must be a number, got ", j_[k].dump());
    return j_[k].get<double>();
  }
  double number(const char* k, double def) const { return has(k) ? number(k) : def; }
  std::string string(const char* k) const {
    require(k);
    if (!j_[k].is_string()) fail("config: '", name(k), "' must be a string, got ", j_[k].dump());
    return j_[k].get<std::string>();
  }
  std::string string(const char* k, const std::string& def) const { return has(k) ? string(k) : def; }
  bool boolean(const char* k, bool def) const {
    if (!has(k)) return def;
    if (!j_[k].is_boolean()) fail("config: '", name(k), "' must be true or false, got ", j_[k].dump());
    return j_[k].get<bool>();
  }
  // An optional string field that, when present, must equal `want` (a value dsv4 implements).
  void expect_string(const char* k, const std::string& want) const {
    if (has(k) && string(k) != want)
      fail("config: unsupported ", name(k), " '", string(k), "' (dsv4 implements '", want, "')");
  }
  void expect_int(const char* k, int64_t want) const {
    if (has(k) && integer(k) != want)
      fail("config: unsupported ", name(k), " ", integer(k), " (dsv4 implements ", want, ")");
  }
  void require(const char* k) const {
    if (!has(k)) fail("config: missing required field '", name(k), "'");
  }

 private:
  const json& j_;
  std::string prefix_;
};

// Per-layer kinds and ratios from the official list (0/4/128 only, like HF). Length n or n + MTP
// layers; MTP entries must be 0 (the MTP block is window-only, spec §1).
void parse_compress_ratios(const json& v, int64_t n, int64_t n_mtp, ModelConfig& c) {
  if (!v.is_array()) fail("config: 'compress_ratios' must be a list");
  const int64_t len = static_cast<int64_t>(v.size());
  if (len != n && len != n + n_mtp)
    fail("config: 'compress_ratios' has ", len, " entries; expected num_hidden_layers (", n,
         ") or num_hidden_layers + num_nextn_predict_layers (", n + n_mtp, ")");
  c.layer_kinds.clear();
  c.compress_ratio.clear();
  for (int64_t i = 0; i < len; ++i) {
    if (!v[i].is_number_integer()) fail("config: 'compress_ratios'[", i, "] must be an integer, got ", v[i].dump());
    int64_t r = v[i].get<int64_t>();
    if (r != 0 && r != 4 && r != 128)
      fail("config: unsupported compress_ratios value ", r, " at index ", i,
           " (the official list allows 0, 4, 128; use layer_types + compress_rates for other rates)");
    if (i >= n) {
      if (r != 0) fail("config: 'compress_ratios'[", i, "] (MTP layer) must be 0, got ", r);
      continue;
    }
    c.layer_kinds.push_back(r == 0 ? AttnKind::SWA : r == 4 ? AttnKind::CSA : AttnKind::HCA);
    c.compress_ratio.push_back(r);
  }
  c.mtp_present_in_ratios = len > n;
}

// transformers' form: layer_types + compress_rates {compressed_sparse_attention: m, heavily_compressed_attention: m}.
void parse_layer_types(const Fields& f, int64_t n, int64_t n_mtp, ModelConfig& c) {
  int64_t csa = 4, hca = 128;  // HF defaults
  if (f.has("compress_rates")) {
    const json& r = f.at("compress_rates");
    if (!r.is_object()) fail("config: 'compress_rates' must be an object");
    Fields rf(r, "compress_rates.");
    for (auto it = r.begin(); it != r.end(); ++it)
      if (it.key() != kCSA && it.key() != kHCA)
        fail("config: unknown key 'compress_rates.", it.key(), "' (expected ", kCSA, " or ", kHCA, ")");
    csa = rf.integer(kCSA, csa);
    hca = rf.integer(kHCA, hca);
  }
  csa = f.integer("compress_rate_csa", csa);  // HF folds these legacy scalars into compress_rates
  hca = f.integer("compress_rate_hca", hca);
  const json& v = f.at("layer_types");
  if (!v.is_array()) fail("config: 'layer_types' must be a list");
  const int64_t len = static_cast<int64_t>(v.size());
  if (len != n && len != n + n_mtp)
    fail("config: 'layer_types' has ", len, " entries; expected num_hidden_layers (", n, ")");
  c.layer_kinds.clear();
  c.compress_ratio.clear();
  for (int64_t i = 0; i < len; ++i) {
    std::string t = v[i].is_string() ? v[i].get<std::string>() : v[i].dump();
    AttnKind k;
    if (t == kSWA) k = AttnKind::SWA;
    else if (t == kCSA) k = AttnKind::CSA;
    else if (t == kHCA) k = AttnKind::HCA;
    else fail("config: unsupported layer_types[", i, "] '", t, "' (expected ", kSWA, ", ", kCSA, " or ", kHCA, ")");
    if (i >= n) {
      if (k != AttnKind::SWA) fail("config: 'layer_types'[", i, "] (MTP layer) must be ", kSWA);
      continue;
    }
    c.layer_kinds.push_back(k);
    c.compress_ratio.push_back(k == AttnKind::SWA ? 0 : k == AttnKind::CSA ? csa : hca);
  }
  c.mtp_present_in_ratios = false;
}

// mlp_layer_types must be hash_moe x k followed by moe (that is all the model defines).
int64_t parse_mlp_layer_types(const json& v, int64_t n) {
  if (!v.is_array()) fail("config: 'mlp_layer_types' must be a list");
  if (static_cast<int64_t>(v.size()) != n)
    fail("config: 'mlp_layer_types' has ", v.size(), " entries; expected num_hidden_layers (", n, ")");
  int64_t hash = 0;
  bool seen_moe = false;
  for (size_t i = 0; i < v.size(); ++i) {
    std::string t = v[i].is_string() ? v[i].get<std::string>() : v[i].dump();
    if (t == "hash_moe") {
      if (seen_moe) fail("config: 'mlp_layer_types'[", i, "] hash_moe after moe is not supported (hash layers come first)");
      ++hash;
    } else if (t == "moe") {
      seen_moe = true;
    } else {
      fail("config: unsupported mlp_layer_types[", i, "] '", t, "' (expected hash_moe or moe)");
    }
  }
  return hash;
}

// One YaRN dict: {type|rope_type: yarn|default, factor, original_max_position_embeddings, beta_fast, beta_slow}.
Yarn parse_yarn(const json& v, const std::string& field) {
  if (!v.is_object()) fail("config: '", field, "' must be an object");
  Fields f(v, field + ".");
  std::string type = f.has("rope_type") ? f.string("rope_type") : f.string("type", "default");
  if (f.has("rope_type") && f.has("type") && f.string("type") != type)
    fail("config: '", field, ".type' and '", field, ".rope_type' disagree");
  Yarn y;
  if (type == "default") return y;
  if (type != "yarn") fail("config: unsupported ", field, " type '", type, "' (dsv4 implements yarn or default)");
  y.enabled = true;
  y.factor = f.number("factor");
  y.original_max_position = f.integer("original_max_position_embeddings");
  y.beta_fast = f.number("beta_fast", 32.0);
  y.beta_slow = f.number("beta_slow", 1.0);
  // The model uses no YaRN magnitude scaling (spec §8.4); HF pins attention_factor to 1.0.
  if (f.has("attention_factor") && f.number("attention_factor") != 1.0)
    fail("config: unsupported ", field, ".attention_factor ", f.number("attention_factor"), " (must be 1.0)");
  return y;
}

// rope_scaling (official) or rope_parameters (HF): flat yarn dict, or nested {main, compress}.
void parse_rope(const Fields& f, ModelConfig& c) {
  if (f.has("rope_scaling")) {  // HF's base config also lets rope_scaling win over rope_parameters
    c.yarn = parse_yarn(f.at("rope_scaling"), "rope_scaling");
    return;
  }
  if (!f.has("rope_parameters")) return;
  const json& rp = f.at("rope_parameters");
  if (!rp.is_object()) fail("config: 'rope_parameters' must be an object");
  if (rp.contains("main") || rp.contains("compress")) {
    if (!rp.contains("main") || !rp.contains("compress") || !rp["main"].is_object() || !rp["compress"].is_object())
      fail("config: 'rope_parameters' nested form needs both objects 'main' and 'compress'");
    Yarn main = parse_yarn(rp["main"], "rope_parameters.main");
    if (main.enabled) fail("config: unsupported rope_parameters.main type 'yarn' (window-only layers use plain RoPE)");
    c.yarn = parse_yarn(rp["compress"], "rope_parameters.compress");
    Fields mf(rp["main"], "rope_parameters.main."), cf(rp["compress"], "rope_parameters.compress.");
    c.rope_theta = mf.number("rope_theta", c.rope_theta);  // nested thetas are what HF's rotary uses
    c.compress_rope_theta = cf.number("rope_theta", c.compress_rope_theta);
    return;
  }
  for (auto it = rp.begin(); it != rp.end(); ++it)
    if (it.value().is_object())
      fail("config: unsupported rope_parameters layout (key '", it.key(),
           "'); expected a flat {rope_type: yarn, ...} dict or {main: {...}, compress: {...}}");
  // Flat: HF applies it to the compressor layers with theta = compress_rope_theta (a flat rope_theta is ignored).
  c.yarn = parse_yarn(rp, "rope_parameters");
}

int64_t parse_rope_dim(const Fields& f, int64_t head_dim) {
  int64_t from_prf = -1;
  if (f.has("partial_rotary_factor")) {
    double prf = f.number("partial_rotary_factor");
    double d = prf * static_cast<double>(head_dim);
    if (!(prf > 0) || std::fabs(d - std::round(d)) > 1e-6)
      fail("config: 'partial_rotary_factor' ", prf, " * head_dim ", head_dim, " is not a whole number of dims");
    from_prf = static_cast<int64_t>(std::llround(d));
  }
  if (f.has("qk_rope_head_dim")) {
    int64_t r = f.integer("qk_rope_head_dim");
    if (from_prf >= 0 && from_prf != r)
      fail("config: 'qk_rope_head_dim' ", r, " disagrees with partial_rotary_factor * head_dim = ", from_prf);
    return r;
  }
  if (from_prf < 0) fail("config: missing required field 'qk_rope_head_dim' (or 'partial_rotary_factor')");
  return from_prf;
}

// quantization_config: only the official FP8 block layout is implemented.
void parse_quantization(const json& q, ModelConfig& c) {
  if (!q.is_object()) fail("config: 'quantization_config' must be an object");
  Fields f(q, "quantization_config.");
  if (f.string("quant_method") != "fp8")
    fail("config: unsupported quantization_config.quant_method '", f.string("quant_method"), "' (dsv4 implements fp8)");
  f.expect_string("fmt", "e4m3");
  f.expect_string("scale_fmt", "ue8m0");
  f.expect_string("activation_scheme", "dynamic");
  if (f.has("weight_block_size")) {
    const json& b = f.at("weight_block_size");
    if (b != json::array({128, 128}))
      fail("config: unsupported quantization_config.weight_block_size ", b.dump(), " (dsv4 implements [128, 128])");
  }
  c.quantized_fp8 = true;
}

}  // namespace

ModelConfig parse_config_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("config: not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail("config: top level must be a JSON object");
  Fields f(j, "");
  f.expect_string("model_type", "deepseek_v4");

  ModelConfig c;
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.num_layers = f.integer("num_hidden_layers");
  c.num_heads = f.integer("num_attention_heads");
  c.head_dim = f.integer("head_dim");
  c.rope_dim = parse_rope_dim(f, c.head_dim);
  c.q_lora_rank = f.integer("q_lora_rank");
  c.o_groups = f.integer("o_groups");
  c.o_lora_rank = f.integer("o_lora_rank");
  c.sliding_window = f.integer("sliding_window");
  c.max_position_embeddings = f.integer("max_position_embeddings");
  c.index_n_heads = f.integer("index_n_heads");
  c.index_head_dim = f.integer("index_head_dim");
  c.index_topk = f.integer("index_topk");
  c.n_routed_experts = f.integer("n_routed_experts");
  c.num_experts_per_tok = f.integer("num_experts_per_tok");
  c.moe_intermediate_size = f.integer("moe_intermediate_size");
  c.routed_scaling_factor = f.number("routed_scaling_factor");
  c.swiglu_limit = f.number("swiglu_limit", 10.0);
  c.hc_mult = f.integer("hc_mult", c.hc_mult);
  c.hc_sinkhorn_iters = f.integer("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  c.hc_eps = f.number("hc_eps", c.hc_eps);
  c.rms_norm_eps = f.number("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = f.number("rope_theta", c.rope_theta);
  c.compress_rope_theta = f.number("compress_rope_theta", c.compress_rope_theta);
  c.num_nextn_predict_layers = f.integer("num_nextn_predict_layers", 1);  // HF's default
  c.n_shared_experts = f.integer("n_shared_experts", 1);
  c.bos_token_id = f.integer("bos_token_id", c.bos_token_id);
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    const json& e = f.at("eos_token_id");
    if (e.size() != 1 || !e[0].is_number_integer()) fail("config: 'eos_token_id' list must hold exactly one id");
    c.eos_token_id = e[0].get<int64_t>();
  } else {
    c.eos_token_id = f.integer("eos_token_id", c.eos_token_id);
  }
  c.expert_dtype = f.string("expert_dtype", "");

  // Values this engine does not implement: reject by name rather than compute something else.
  f.expect_int("num_key_value_heads", 1);
  f.expect_int("n_shared_experts", 1);
  f.expect_string("scoring_func", "sqrtsoftplus");
  f.expect_string("hidden_act", "silu");
  f.expect_string("topk_method", "noaux_tc");
  if (!f.boolean("norm_topk_prob", true)) fail("config: unsupported norm_topk_prob false (dsv4 renormalises)");
  if (f.boolean("tie_word_embeddings", false)) fail("config: unsupported tie_word_embeddings true (head is untied)");
  if (f.boolean("attention_bias", false)) fail("config: unsupported attention_bias true");

  // Attention schedule: HF prefers layer_types over the legacy compress_ratios; both must agree.
  const bool has_lt = f.has("layer_types"), has_cr = f.has("compress_ratios");
  if (!has_lt && !has_cr) fail("config: missing required field 'compress_ratios' (or 'layer_types')");
  if (has_cr) parse_compress_ratios(f.at("compress_ratios"), c.num_layers, c.num_nextn_predict_layers, c);
  if (has_lt) {
    ModelConfig from_lt = c;
    parse_layer_types(f, c.num_layers, c.num_nextn_predict_layers, from_lt);
    if (has_cr && (from_lt.layer_kinds != c.layer_kinds || from_lt.compress_ratio != c.compress_ratio))
      fail("config: 'layer_types'/'compress_rates' disagree with 'compress_ratios'");
    c.layer_kinds = from_lt.layer_kinds;
    c.compress_ratio = from_lt.compress_ratio;
  }

  const bool has_mlt = f.has("mlp_layer_types"), has_nh = f.has("num_hash_layers");
  if (!has_mlt && !has_nh) fail("config: missing required field 'num_hash_layers' (or 'mlp_layer_types')");
  if (has_nh) c.num_hash_layers = f.integer("num_hash_layers");
  if (has_mlt) {
    int64_t h = parse_mlp_layer_types(f.at("mlp_layer_types"), c.num_layers);
    if (has_nh && h != c.num_hash_layers)
      fail("config: 'mlp_layer_types' has ", h, " hash_moe layers but num_hash_layers is ", c.num_hash_layers);
    c.num_hash_layers = h;
  }

  parse_rope(f, c);
  if (f.has("quantization_config")) parse_quantization(f.at("quantization_config"), c);
  c.validate();
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_config_json(ss.str());
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

}  // namespace dsv4
