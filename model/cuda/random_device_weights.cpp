#include "model/cuda/random_device_weights.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/fill_random.h"
#include "core/error.h"
#include "model/inventory.h"

namespace dsv4 {

namespace {

struct Owner {
  std::vector<cuda::DeviceBuffer> device;
  std::vector<std::vector<uint8_t>> host;
};

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Power-of-two scale byte so that stored values × scale have std ≈ 1/sqrt(in).
uint8_t scale_byte(double value_std, int64_t in) {
  const int e = static_cast<int>(std::lround(std::log2(1.0 / (value_std * std::sqrt(static_cast<double>(in))))));
  return static_cast<uint8_t>(127 + e);
}

}  // namespace

ModelWeights random_device_weights(const ModelConfig& cfg, uint64_t seed) {
  CheckpointFormat fmt;
  fmt.linears = LinearFormat::FP8Block;
  fmt.experts = LinearFormat::FP4Group32;
  fmt.has_mtp = cfg.num_nextn_predict_layers > 0;
  auto owner = std::make_shared<Owner>();
  std::map<std::string, TensorRef> refs;
  std::mt19937_64 host_rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<ExpectedTensor> spec = expected_tensors(cfg, fmt);
  std::map<std::string, const ExpectedTensor*> by_name;
  for (const auto& t : spec) by_name[t.name] = &t;
  uint64_t stream_id = 0;
  for (const ExpectedTensor& t : spec) {
    TensorRef r;
    r.info.name = t.name;
    r.info.shape = t.shape;
    r.info.dtype = t.dtypes.front();
    ++stream_id;
    const bool matrix = t.shape.size() == 2 && !ends_with(t.name, ".scale") && r.info.dtype != DType::F32 &&
                        r.info.dtype != DType::I64 && r.info.dtype != DType::I32;
    const bool device_scale = ends_with(t.name, ".scale");
    if (matrix || device_scale) {
      owner->device.emplace_back(r.info.nbytes());
      uint8_t* p = owner->device.back().as<uint8_t>();
      const int64_t n = r.info.numel();
      if (device_scale) {
        const ExpectedTensor& w = *by_name.at(t.name.substr(0, t.name.size() - 6) + ".weight");
        const bool fp4 = w.dtypes.front() == DType::I8 || w.dtypes.front() == DType::U8;
        const int64_t in = fp4 ? w.shape[1] * 2 : w.shape[1];
        cuda::fill_byte(p, n, scale_byte(fp4 ? 2.9 : 16.0, in), nullptr);
      } else if (r.info.dtype == DType::F8_E4M3) {
        cuda::fill_e4m3(p, n, seed * 1000003 + stream_id, nullptr);
      } else if (r.info.dtype == DType::I8 || r.info.dtype == DType::U8) {
        cuda::fill_e2m1_pairs(p, n, seed * 1000003 + stream_id, nullptr);
      } else {  // BF16 matrices: embed N(0,1), the rest N(0, 1/sqrt(in))
        const float std = t.name == "embed.weight" ? 1.0f : 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
        cuda::fill_normal_bf16(reinterpret_cast<uint16_t*>(p), n, std, seed * 1000003 + stream_id, nullptr);
      }
      r.data = p;
    } else {  // small tensors on the host: norms ~1, mHC / sinks / ape / bias small, tid2eid distinct
      owner->host.emplace_back(r.info.nbytes());
      uint8_t* p = owner->host.back().data();
      const int64_t n = r.info.numel();
      if (r.info.dtype == DType::I64 || r.info.dtype == DType::I32) {
        const int64_t K = t.shape[1], E = cfg.n_routed_experts;
        std::vector<int64_t> ids(static_cast<size_t>(E));
        for (int64_t row = 0; row < t.shape[0]; ++row) {
          for (int64_t e = 0; e < E; ++e) ids[e] = e;
          for (int64_t k = 0; k < K; ++k) {
            std::swap(ids[k], ids[k + static_cast<int64_t>(host_rng() % static_cast<uint64_t>(E - k))]);
            if (r.info.dtype == DType::I64) std::memcpy(p + 8 * (row * K + k), &ids[k], 8);
            else {
              const int32_t v = static_cast<int32_t>(ids[k]);
              std::memcpy(p + 4 * (row * K + k), &v, 4);
            }
          }
        }
      } else {
        const bool norm = t.name.find("norm") != std::string::npos;
        const float std = ends_with(t.name, "_fn") ? 1.0f / std::sqrt(static_cast<float>(t.shape.back())) : 0.1f;
        for (int64_t i = 0; i < n; ++i) {
          const float v = (norm ? 1.0f : 0.0f) + std * normal(host_rng);
          if (r.info.dtype == DType::F32) std::memcpy(p + 4 * i, &v, 4);
          else {
            const uint16_t b = f32_to_bf16(v);
            std::memcpy(p + 2 * i, &b, 2);
          }
        }
      }
      r.data = p;
    }
    refs[t.name] = r;
  }
  cuda::synchronize();
  return bind_weights(cfg, std::make_shared<Checkpoint>(std::move(refs), owner));
}

ModelConfig preset_config(const std::string& name, int64_t layers) {
  ModelConfig c;
  if (name == "v4-flash") {
    c.vocab_size = 129280; c.hidden_size = 4096; c.num_layers = 43; c.num_heads = 64; c.q_lora_rank = 1024;
    c.o_groups = 8; c.n_routed_experts = 256; c.moe_intermediate_size = 2048; c.index_topk = 512;
    c.routed_scaling_factor = 1.5;
  } else if (name == "v4-pro") {
    c.vocab_size = 129280; c.hidden_size = 7168; c.num_layers = 61; c.num_heads = 128; c.q_lora_rank = 1536;
    c.o_groups = 16; c.n_routed_experts = 384; c.moe_intermediate_size = 3072; c.index_topk = 1024;
    c.routed_scaling_factor = 2.5;
  } else {
    fail("--preset ", name, ": unsupported (v4-flash or v4-pro)");
  }
  c.head_dim = 512; c.rope_dim = 64; c.o_lora_rank = 1024; c.sliding_window = 128;
  c.rope_theta = 10000; c.compress_rope_theta = 160000; c.yarn = Yarn{true, 16.0, 65536, 32.0, 1.0};
  c.max_position_embeddings = 1048576; c.index_n_heads = 64; c.index_head_dim = 128;
  c.num_experts_per_tok = 6; c.num_hash_layers = 3; c.swiglu_limit = 10.0; c.num_nextn_predict_layers = 1;
  c.expert_dtype = "fp4"; c.quantized_fp8 = true;
  for (int64_t i = 0; i < c.num_layers; ++i) {  // Flash: L0-1 SWA; Pro: L0-1 HCA; then CSA/HCA alternating
    int64_t m = i < 2 ? (name == "v4-flash" ? 0 : 128) : (i % 2 == 0 ? 4 : 128);
    c.compress_ratio.push_back(m);
    c.layer_kinds.push_back(m == 0 ? AttnKind::SWA : m == 4 ? AttnKind::CSA : AttnKind::HCA);
  }
  if (layers > 0) {
    DSV4_CHECK(layers <= c.num_layers, "--layers ", layers, " exceeds the preset's ", c.num_layers);
    c.num_layers = layers;
    c.compress_ratio.resize(static_cast<size_t>(layers));
    c.layer_kinds.resize(static_cast<size_t>(layers));
    // The hash-routed layers are the first three: fewer layers keep as many as there are (so
    // that `--layers 1` or 2 builds, all hash-routed, instead of failing validation).
    c.num_hash_layers = std::min(c.num_hash_layers, layers);
  }
  c.num_nextn_predict_layers = 0;  // the main model only; `dsv4 bench --speculative-tokens` adds the MTP layer
  c.validate();
  return c;
}

}  // namespace dsv4
