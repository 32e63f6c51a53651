#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/config.h"
#include "test_util.h"

namespace dsv4 {
namespace {

using nlohmann::json;
const std::string kData = std::string(DSV4_SOURCE_DIR) + "/tests/io/data/";

json read_json(const std::string& name) {
  std::ifstream in(kData + name);
  return json::parse(in);
}
ModelConfig parse(const json& j) { return parse_config_json(j.dump()); }

// The same model in transformers' own keys (spec §2.3): layer_types + compress_rates,
// mlp_layer_types, partial_rotary_factor, rope_parameters.
json to_hf_form(json j) {
  json lt = json::array();
  const auto& cr = j["compress_ratios"];
  for (int64_t i = 0; i < j["num_hidden_layers"].get<int64_t>(); ++i) {
    int r = cr[i].get<int>();
    lt.push_back(r == 0 ? "sliding_attention" : r == 4 ? "compressed_sparse_attention" : "heavily_compressed_attention");
  }
  json mlt = json::array();
  for (int64_t i = 0; i < j["num_hidden_layers"].get<int64_t>(); ++i)
    mlt.push_back(i < j["num_hash_layers"].get<int64_t>() ? "hash_moe" : "moe");
  json ys = j["rope_scaling"];
  ys.erase("type");
  ys["rope_type"] = "yarn";
  j["rope_parameters"] = ys;
  j["partial_rotary_factor"] = 64.0 / 512.0;
  j["layer_types"] = lt;
  j["mlp_layer_types"] = mlt;
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  for (const char* k : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling"}) j.erase(k);
  return j;
}

// spec §9's tested tiny config (HF 5.17 and the official demo ran it).
json tiny() {
  return json{{"vocab_size", 512}, {"hidden_size", 256}, {"num_hidden_layers", 4},
              {"layer_types", {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                               "compressed_sparse_attention"}},
              {"compress_rates", {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 8}}},
              {"mlp_layer_types", {"hash_moe", "moe", "moe", "moe"}},
              {"num_attention_heads", 4}, {"num_key_value_heads", 1}, {"head_dim", 128}, {"qk_rope_head_dim", 64},
              {"q_lora_rank", 128}, {"o_groups", 2}, {"o_lora_rank", 128}, {"index_n_heads", 4},
              {"index_head_dim", 128}, {"index_topk", 4}, {"sliding_window", 8}, {"n_routed_experts", 8},
              {"num_experts_per_tok", 2}, {"moe_intermediate_size", 128}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20},
              {"rope_parameters", {{"rope_type", "yarn"}, {"factor", 16}, {"original_max_position_embeddings", 64},
                                   {"beta_fast", 32}, {"beta_slow", 1}}},
              {"rope_theta", 1e4}, {"compress_rope_theta", 1.6e5}, {"max_position_embeddings", 1024},
              {"routed_scaling_factor", 1.5}, {"model_type", "deepseek_v4"}};
}

TEST(Config, RealFlash) {
  ModelConfig c = load_config(kData + "config-v4-flash.json");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers, 43);
  EXPECT_EQ(c.rope_dim, 64);
  EXPECT_TRUE(c.mtp_present_in_ratios);
  ASSERT_EQ(c.layer_kinds.size(), 43u);
  int csa = 0, hca = 0;
  for (int i = 0; i < 43; ++i) {
    AttnKind want = i < 2 ? AttnKind::SWA : i % 2 == 0 ? AttnKind::CSA : AttnKind::HCA;
    EXPECT_EQ(c.layer_kinds[i], want) << i;
    csa += c.layer_kinds[i] == AttnKind::CSA;
    hca += c.layer_kinds[i] == AttnKind::HCA;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c.compress_ratio[2], 4);
  EXPECT_EQ(c.compress_ratio[3], 128);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.factor, 16.0);
  EXPECT_EQ(c.yarn.original_max_position, 65536);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_EQ(c.num_hash_layers, 3);
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_EQ(c.index_topk, 512);
  EXPECT_TRUE(c.quantized_fp8);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
}

TEST(Config, RealPro) {
  ModelConfig c = load_config(kData + "config-v4-pro.json");
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.o_groups, 16);
  int csa = 0, hca = 0;
  for (auto k : c.layer_kinds) csa += k == AttnKind::CSA, hca += k == AttnKind::HCA;
  EXPECT_EQ(csa, 30);
  EXPECT_EQ(hca, 31);
  EXPECT_EQ(c.layer_kinds[0], AttnKind::HCA);
  EXPECT_EQ(c.layer_kinds[1], AttnKind::HCA);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
}

TEST(Config, BothFormsParseToTheSameConfig) {
  for (const char* f : {"config-v4-flash.json", "config-v4-pro.json"}) {
    json off = read_json(f);
    ModelConfig a = parse(off), b = parse(to_hf_form(off));
    EXPECT_FALSE(b.mtp_present_in_ratios);
    b.mtp_present_in_ratios = a.mtp_present_in_ratios;
    EXPECT_TRUE(a == b) << f;

    // HF-derived nested rope_parameters (what DeepseekV4Config stores after __post_init__).
    json nested = to_hf_form(off);
    json y = nested["rope_parameters"];
    y["rope_theta"] = 160000.0;
    y["attention_factor"] = 1.0;
    nested["rope_parameters"] = {{"main", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}, {"compress", y}};
    ModelConfig n = parse(nested);
    n.mtp_present_in_ratios = a.mtp_present_in_ratios;
    EXPECT_TRUE(a == n) << f;
  }
}

TEST(Config, TinyConfigWithSmallRates) {
  ModelConfig c = parse(tiny());
  EXPECT_EQ(c.compress_ratio, (std::vector<int64_t>{0, 4, 8, 4}));
  EXPECT_EQ(c.num_hash_layers, 1);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.original_max_position, 64);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);  // HF's default when absent
  json legacy = tiny();
  legacy.erase("compress_rates");
  legacy["compress_rate_hca"] = 8;  // HF folds the legacy scalar in
  EXPECT_TRUE(parse(legacy) == c);
}

TEST(Config, WriterRoundTrips) {
  for (const char* f : {"config-v4-flash.json", "config-v4-pro.json"}) {
    ModelConfig a = load_config(kData + f);
    json out = json::parse(config_to_json(a, true));
    EXPECT_EQ(out["compress_ratios"].size(), a.num_layers + 1u) << f;  // official list incl. MTP entry
    EXPECT_FALSE(out.contains("layer_types"));
    EXPECT_EQ(out["quantization_config"]["quant_method"], "fp8");
    EXPECT_TRUE(parse(out) == a) << f;
    json plain = json::parse(config_to_json(a, false));
    EXPECT_FALSE(plain.contains("quantization_config"));
    ModelConfig b = parse(plain);
    EXPECT_FALSE(b.quantized_fp8);
    b.quantized_fp8 = true;
    b.expert_dtype = a.expert_dtype;
    EXPECT_TRUE(b == a);
  }
  ModelConfig t = parse(tiny());
  json out = json::parse(config_to_json(t, false));
  EXPECT_FALSE(out.contains("compress_ratios"));  // rate 8 has no legacy code
  EXPECT_EQ(out["layer_types"].size(), 4u);
  EXPECT_EQ(out["compress_rates"]["heavily_compressed_attention"], 8);
  EXPECT_EQ(out["mlp_layer_types"][0], "hash_moe");
  EXPECT_EQ(out["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(out["num_key_value_heads"], 1);
  EXPECT_TRUE(parse(out) == t);
}

// Each edit of the real Flash config must fail with a message naming the field (and value).
TEST(Config, UnsupportedValuesNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<const char*> parts;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["compress_ratios"][5] = 8; }, {"compress_ratios", "8"}},
      {[](json& j) { j["compress_ratios"].erase(0); j["compress_ratios"].erase(0); }, {"compress_ratios", "42 entries"}},
      {[](json& j) { j["compress_ratios"][43] = 4; }, {"compress_ratios", "MTP"}},
      {[](json& j) { j["scoring_func"] = "softmax"; }, {"scoring_func", "softmax"}},
      {[](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
      {[](json& j) { j["num_key_value_heads"] = 8; }, {"num_key_value_heads", "8"}},
      {[](json& j) { j["n_shared_experts"] = 2; }, {"n_shared_experts", "2"}},
      {[](json& j) { j["topk_method"] = "greedy"; }, {"topk_method", "greedy"}},
      {[](json& j) { j["norm_topk_prob"] = false; }, {"norm_topk_prob"}},
      {[](json& j) { j["tie_word_embeddings"] = true; }, {"tie_word_embeddings"}},
      {[](json& j) { j["model_type"] = "deepseek_v3"; }, {"model_type", "deepseek_v3"}},
      {[](json& j) { j["rope_scaling"]["type"] = "linear"; }, {"rope_scaling", "linear"}},
      {[](json& j) { j["rope_scaling"].erase("factor"); }, {"rope_scaling.factor"}},
      {[](json& j) { j["rope_scaling"]["attention_factor"] = 1.3; }, {"rope_scaling.attention_factor"}},
      {[](json& j) { j["quantization_config"]["quant_method"] = "bitsandbytes"; }, {"quantization_config.quant_method", "bitsandbytes"}},
      {[](json& j) { j["quantization_config"]["fmt"] = "e5m2"; }, {"quantization_config.fmt", "e5m2"}},
      {[](json& j) { j["quantization_config"]["weight_block_size"] = {64, 64}; }, {"quantization_config.weight_block_size", "64"}},
      {[](json& j) { j["quantization_config"]["scale_fmt"] = "fp32"; }, {"quantization_config.scale_fmt", "fp32"}},
      {[](json& j) { j["quantization_config"]["activation_scheme"] = "static"; }, {"quantization_config.activation_scheme"}},
      {[](json& j) { j["expert_dtype"] = "int4"; }, {"expert_dtype", "int4"}},
      {[](json& j) { j["hidden_size"] = "4096"; }, {"hidden_size"}},
      {[](json& j) { j["hc_mult"] = 0; }, {"hc_mult"}},
      {[](json& j) { j["hc_sinkhorn_iters"] = 0; }, {"hc_sinkhorn_iters"}},
      // §9 constraints.
      {[](json& j) { j["qk_rope_head_dim"] = 63; }, {"qk_rope_head_dim", "63"}},
      {[](json& j) { j["qk_rope_head_dim"] = 1024; }, {"qk_rope_head_dim", "head_dim"}},
      {[](json& j) { j["index_head_dim"] = 32; }, {"qk_rope_head_dim", "index_head_dim"}},
      {[](json& j) { j["o_groups"] = 5; }, {"o_groups", "5"}},
      {[](json& j) { j["num_experts_per_tok"] = 300; }, {"num_experts_per_tok", "300"}},
      {[](json& j) { j["num_hash_layers"] = 44; }, {"num_hash_layers", "44"}},
      {[](json& j) { j["eos_token_id"] = 200000; }, {"eos_token_id"}},
      {[](json& j) { j["partial_rotary_factor"] = 0.25; }, {"qk_rope_head_dim", "partial_rotary_factor"}},
  };
  const json base = read_json("config-v4-flash.json");
  for (size_t i = 0; i < cases.size(); ++i) {
    json j = base;
    cases[i].edit(j);
    std::string msg = test::error_of([&] { parse(j); });
    for (const char* p : cases[i].parts) EXPECT_NE(msg.find(p), std::string::npos) << "case " << i << ": '" << p << "' not in: " << msg;
  }
}

TEST(Config, HfFormErrorsNameTheField) {
  struct Case {
    std::function<void(json&)> edit;
    std::vector<const char*> parts;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["layer_types"][1] = "full_attention"; }, {"layer_types", "full_attention"}},
      {[](json& j) { j["layer_types"].erase(0); }, {"layer_types", "3 entries"}},
      {[](json& j) { j["mlp_layer_types"][2] = "dense"; }, {"mlp_layer_types", "dense"}},
      {[](json& j) { j["mlp_layer_types"] = {"moe", "hash_moe", "moe", "moe"}; }, {"mlp_layer_types", "hash_moe"}},
      {[](json& j) { j["compress_rates"]["csa"] = 4; }, {"compress_rates.csa"}},
      {[](json& j) { j["compress_rates"]["heavily_compressed_attention"] = "x"; }, {"compress_rates.heavily_compressed_attention"}},
      {[](json& j) { j["rope_parameters"]["rope_type"] = "llama3"; }, {"rope_parameters", "llama3"}},
      {[](json& j) { j["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}}}}; }, {"rope_parameters", "sliding_attention"}},
      {[](json& j) { j["rope_parameters"] = {{"main", {{"rope_type", "default"}}}}; }, {"rope_parameters", "compress"}},
      {[](json& j) { j["rope_parameters"] = {{"main", {{"rope_type", "yarn"}, {"factor", 2}, {"original_max_position_embeddings", 8}}}, {"compress", {{"rope_type", "default"}}}}; }, {"rope_parameters.main"}},
      {[](json& j) { j["compress_ratios"] = {0, 4, 4, 4}; }, {"compress_ratios", "layer_types"}},
      {[](json& j) { j["num_hash_layers"] = 2; }, {"num_hash_layers", "mlp_layer_types"}},
      {[](json& j) { j.erase("qk_rope_head_dim"); j["partial_rotary_factor"] = 0.3; }, {"partial_rotary_factor"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    json j = tiny();
    cases[i].edit(j);
    std::string msg = test::error_of([&] { parse(j); });
    for (const char* p : cases[i].parts) EXPECT_NE(msg.find(p), std::string::npos) << "case " << i << ": '" << p << "' not in: " << msg;
  }
}

TEST(Config, MissingRequiredFieldsAreNamed) {
  const json base = read_json("config-v4-flash.json");
  for (const char* f : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                        "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "max_position_embeddings",
                        "index_n_heads", "index_head_dim", "index_topk", "n_routed_experts", "num_experts_per_tok",
                        "moe_intermediate_size", "routed_scaling_factor", "qk_rope_head_dim", "compress_ratios",
                        "num_hash_layers"}) {
    json j = base;
    j.erase(f);
    std::string msg = test::error_of([&] { parse(j); });
    EXPECT_NE(msg.find(std::string("'") + f + "'"), std::string::npos) << f << ": " << msg;
  }
}

TEST(Config, FileAndJsonErrors) {
  EXPECT_ERROR_HAS(load_config("/nonexistent/config.json"), "/nonexistent/config.json");
  EXPECT_ERROR_HAS(parse_config_json("{\"hidden_size\": "), "JSON");
  EXPECT_ERROR_HAS(parse_config_json("[]"), "object");
}

TEST(Config, ValidateCatchesProgrammaticMistakes) {
  ModelConfig c = parse(tiny());
  c.layer_kinds.pop_back();
  EXPECT_ERROR_HAS(c.validate(), "num_hidden_layers");
  c = parse(tiny());
  c.compress_ratio[3] = 16;  // two CSA layers with different rates cannot be written as compress_rates
  EXPECT_ERROR_HAS(c.validate(), "compress_rates", "16");
  c = parse(tiny());
  c.compress_ratio[0] = 4;  // SWA with a ratio
  EXPECT_ERROR_HAS(c.validate(), "layer 0");
}

}  // namespace
}  // namespace dsv4
