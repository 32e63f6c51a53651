// config.json of a DeepSeek-V4 checkpoint, in either form the spec documents (spec/model.md §2):
// the official `compress_ratios` list, or transformers' `layer_types` + `compress_rates`;
// YaRN from `rope_scaling` or `rope_parameters`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

enum class AttnKind { SWA, CSA, HCA };  // window only / compressed sparse (indexer) / heavily compressed
enum class ExpertFormat { FP4, FP8, BF16 };  // decided from tensor dtypes at load (spec §8.9)

struct Yarn {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  bool operator==(const Yarn&) const = default;
};

struct ModelConfig {
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0;
  int64_t num_heads = 0, head_dim = 0, rope_dim = 0;
  int64_t q_lora_rank = 0, o_groups = 0, o_lora_rank = 0;
  int64_t sliding_window = 0;
  std::vector<AttnKind> layer_kinds;     // one per main layer
  std::vector<int64_t> compress_ratio;   // per main layer: 0 (SWA) or m
  bool mtp_present_in_ratios = false;    // official list carried an MTP entry
  double rope_theta = 10000.0, compress_rope_theta = 160000.0;
  Yarn yarn;                             // applied to layers with a compressor only
  int64_t max_position_embeddings = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6, rms_norm_eps = 1e-6;
  int64_t n_routed_experts = 0, n_shared_experts = 1, num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0, num_hash_layers = 0;
  double routed_scaling_factor = 1.0, swiglu_limit = 0.0;
  int64_t num_nextn_predict_layers = 0;
  std::string expert_dtype;              // as written ("fp4", "fp8" or empty); tensors decide
  bool quantized_fp8 = false;            // quantization_config {quant_method: fp8, ...} present
  int64_t bos_token_id = 0, eos_token_id = 1;

  bool is_hash_layer(int64_t layer) const { return layer < num_hash_layers; }
  // Validates cross-field constraints (spec §9); throws Error naming the field.
  void validate() const;
  bool operator==(const ModelConfig&) const = default;
};

// Parse from JSON text / a file. Unsupported values (a compress ratio other than 0/4/128 in the
// official list, an unknown layer type, scoring_func != sqrtsoftplus, hidden_act != silu, ...)
// throw Error naming the field and the value.
ModelConfig parse_config_json(const std::string& text);
ModelConfig load_config(const std::string& path);
// Serialise (official-looking keys plus layer_types/compress_rates when ratios are not 0/4/128).
std::string config_to_json(const ModelConfig& c, bool with_quantization_config);

}  // namespace dsv4
