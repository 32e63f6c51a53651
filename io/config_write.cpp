// config_to_json: a config.json that both parse_config_json and transformers 5.17 accept.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/config.h"

namespace dsv4 {

using ojson = nlohmann::ordered_json;

std::string config_to_json(const ModelConfig& c, bool with_quantization_config) {
  c.validate();
  int64_t csa = 4, hca = 128;  // HF's defaults, kept when a kind is absent
  bool official_ratios = true;  // expressible as the legacy 0/4/128 list
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.layer_kinds[i] == AttnKind::CSA) csa = c.compress_ratio[i];
    if (c.layer_kinds[i] == AttnKind::HCA) hca = c.compress_ratio[i];
  }
  if (csa != 4 || hca != 128) official_ratios = false;

  ojson j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.rope_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  if (official_ratios) {
    ojson r = c.compress_ratio;
    if (c.mtp_present_in_ratios)
      for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) r.push_back(0);
    j["compress_ratios"] = r;
  } else {
    // Rates other than 4/128 only exist in HF's per-type form (HF maps the legacy list with a fixed table).
    ojson lt = ojson::array(), mlt = ojson::array();
    for (int64_t i = 0; i < c.num_layers; ++i) {
      AttnKind k = c.layer_kinds[i];
      lt.push_back(k == AttnKind::SWA ? "sliding_attention"
                   : k == AttnKind::CSA ? "compressed_sparse_attention" : "heavily_compressed_attention");
      mlt.push_back(c.is_hash_layer(i) ? "hash_moe" : "moe");
    }
    j["layer_types"] = lt;
    j["compress_rates"] = {{"compressed_sparse_attention", csa}, {"heavily_compressed_attention", hca}};
    j["mlp_layer_types"] = mlt;
  }
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = c.compress_rope_theta;
  if (c.yarn.enabled)  // HF moves rope_scaling into rope_parameters.compress (spec §2.3)
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", c.yarn.factor},
                         {"original_max_position_embeddings", c.yarn.original_max_position},
                         {"beta_fast", c.yarn.beta_fast},
                         {"beta_slow", c.yarn.beta_slow}};
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hash_layers"] = c.num_hash_layers;
  j["scoring_func"] = "sqrtsoftplus";
  j["topk_method"] = "noaux_tc";
  j["norm_topk_prob"] = true;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["hidden_act"] = "silu";
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = "bfloat16";
  if (with_quantization_config) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
    if (!c.expert_dtype.empty()) j["expert_dtype"] = c.expert_dtype;
  }
  return j.dump(2) + "\n";
}

}  // namespace dsv4
