// ModelConfig::validate: the cross-field constraints of spec/model.md §9.
#include "core/error.h"
#include "io/config.h"

namespace dsv4 {

namespace {
void positive(int64_t v, const char* field) {
  if (v <= 0) fail("config: '", field, "' must be positive, got ", v);
}
}  // namespace

void ModelConfig::validate() const {
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(head_dim, "head_dim");
  positive(q_lora_rank, "q_lora_rank");
  positive(o_groups, "o_groups");
  positive(o_lora_rank, "o_lora_rank");
  positive(sliding_window, "sliding_window");
  positive(max_position_embeddings, "max_position_embeddings");
  positive(n_routed_experts, "n_routed_experts");
  positive(num_experts_per_tok, "num_experts_per_tok");
  positive(moe_intermediate_size, "moe_intermediate_size");
  positive(hc_mult, "hc_mult");
  positive(hc_sinkhorn_iters, "hc_sinkhorn_iters");

  // RoPE rotates the last rope_dim channels in pairs, of both the main heads and the indexer heads.
  if (rope_dim <= 0 || rope_dim % 2 != 0) fail("config: 'qk_rope_head_dim' must be even and positive, got ", rope_dim);
  if (rope_dim > head_dim) fail("config: 'qk_rope_head_dim' ", rope_dim, " exceeds head_dim ", head_dim);
  // Heads are split evenly into o_groups for the grouped output projection.
  if (num_heads % o_groups != 0)
    fail("config: 'o_groups' ", o_groups, " must divide num_attention_heads ", num_heads);
  if (num_experts_per_tok > n_routed_experts)
    fail("config: 'num_experts_per_tok' ", num_experts_per_tok, " exceeds n_routed_experts ", n_routed_experts);
  if (n_shared_experts != 1) fail("config: unsupported n_shared_experts ", n_shared_experts, " (must be 1)");
  if (num_hash_layers < 0 || num_hash_layers > num_layers)
    fail("config: 'num_hash_layers' ", num_hash_layers, " must lie in [0, num_hidden_layers = ", num_layers, "]");
  if (num_nextn_predict_layers < 0) fail("config: 'num_nextn_predict_layers' must be >= 0");
  if (!(rope_theta > 0)) fail("config: 'rope_theta' must be positive");
  if (!(compress_rope_theta > 0)) fail("config: 'compress_rope_theta' must be positive");
  if (!(rms_norm_eps > 0)) fail("config: 'rms_norm_eps' must be positive");
  if (hc_eps < 0) fail("config: 'hc_eps' must be >= 0");
  if (swiglu_limit < 0) fail("config: 'swiglu_limit' must be >= 0");
  if (bos_token_id < 0 || bos_token_id >= vocab_size) fail("config: 'bos_token_id' ", bos_token_id, " outside the vocabulary");
  if (eos_token_id < 0 || eos_token_id >= vocab_size) fail("config: 'eos_token_id' ", eos_token_id, " outside the vocabulary");
  if (!expert_dtype.empty() && expert_dtype != "fp4" && expert_dtype != "fp8")
    fail("config: unsupported expert_dtype '", expert_dtype, "' (expected fp4 or fp8)");
  if (yarn.enabled) {
    if (!(yarn.factor > 0)) fail("config: rope_scaling 'factor' must be positive");
    if (yarn.original_max_position <= 0) fail("config: rope_scaling 'original_max_position_embeddings' must be positive");
  }

  // Layer schedule: one kind and ratio per main layer; one rate per compressed kind (HF's compress_rates).
  if (static_cast<int64_t>(layer_kinds.size()) != num_layers || static_cast<int64_t>(compress_ratio.size()) != num_layers)
    fail("config: layer schedule has ", layer_kinds.size(), " kinds / ", compress_ratio.size(),
         " ratios for num_hidden_layers ", num_layers);
  int64_t csa = 0, hca = 0;
  for (int64_t i = 0; i < num_layers; ++i) {
    int64_t r = compress_ratio[i];
    AttnKind k = layer_kinds[i];
    if ((k == AttnKind::SWA) != (r == 0))
      fail("config: layer ", i, ": compress ratio ", r, " does not match its layer type");
    if (r < 0) fail("config: layer ", i, ": negative compress ratio ", r);
    int64_t& rate = k == AttnKind::CSA ? csa : hca;
    if (k != AttnKind::SWA) {
      if (rate != 0 && rate != r)
        fail("config: compress_rates: layers of one type must share a rate (layer ", i, " has ", r, ", earlier ", rate, ")");
      rate = r;
    }
  }
  if (csa != 0) {  // the Lightning Indexer exists on CSA layers only
    positive(index_n_heads, "index_n_heads");
    positive(index_head_dim, "index_head_dim");
    positive(index_topk, "index_topk");
    if (rope_dim > index_head_dim)
      fail("config: 'qk_rope_head_dim' ", rope_dim, " exceeds index_head_dim ", index_head_dim);
  }
}

}  // namespace dsv4
