#include "model/random_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/inventory.h"

namespace dsv4 {

namespace {

// splitmix64: a portable, seedable stream (std distributions differ between standard libraries).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  float normal() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }
};

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, keyed by the seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Master fp32 values of one tensor: scales chosen so activations stay O(1) through the block and
// every tensor the HF initialiser leaves at zero/one gets non-trivial values.
std::vector<float> master_values(const std::string& name, int64_t rows, int64_t cols, Rng& rng, float output_scale) {
  const int64_t n = rows * cols;
  std::vector<float> v(static_cast<size_t>(n));
  auto fill_normal = [&](float mean, float std) {
    for (auto& x : v) x = mean + std * rng.normal();
  };
  if (contains(name, "norm")) {
    fill_normal(1.0f, 0.1f);
  } else if (ends_with(name, "_fn")) {
    fill_normal(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
  } else if (ends_with(name, "_base")) {
    fill_normal(0.0f, 0.5f);
  } else if (ends_with(name, "_scale")) {
    for (auto& x : v) x = static_cast<float>(0.5 + rng.uniform());
  } else if (ends_with(name, "attn_sink")) {
    fill_normal(0.0f, 1.0f);
  } else if (ends_with(name, ".ape")) {
    fill_normal(0.0f, 0.5f);
  } else if (ends_with(name, "gate.bias")) {
    fill_normal(0.0f, 0.1f);
  } else if (name == "embed.weight") {
    fill_normal(0.0f, 1.0f);
  } else {
    const bool output_proj = ends_with(name, "wo_b.weight") || ends_with(name, ".w2.weight");
    fill_normal(0.0f, (output_proj ? output_scale : 1.0f) / std::sqrt(static_cast<float>(cols)));
  }
  return v;
}

std::vector<uint8_t> to_bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = f32_to_bf16(v[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
  return out;
}

std::vector<uint8_t> to_f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

float pow2_ceil_scale(float amax, float qmax, float floor_amax) {
  return std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(std::max(amax, floor_amax) / qmax))));
}

// 128×128 block FP8: returns e4m3 codes, fills the E8M0 scale grid and the dequantised values.
std::vector<uint8_t> quant_fp8(const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& scale,
                               std::vector<float>& deq) {
  const int64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  std::vector<uint8_t> q(w.size());
  scale.assign(static_cast<size_t>(br * bc), 0);
  deq.resize(w.size());
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j) {
      float amax = 0;
      for (int64_t r = i * 128; r < std::min(rows, (i + 1) * 128); ++r)
        for (int64_t c = j * 128; c < std::min(cols, (j + 1) * 128); ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = pow2_ceil_scale(amax, 448.0f, 1e-4f);
      scale[i * bc + j] = f32_pow2_to_e8m0(s);
      for (int64_t r = i * 128; r < std::min(rows, (i + 1) * 128); ++r)
        for (int64_t c = j * 128; c < std::min(cols, (j + 1) * 128); ++c) {
          const size_t k = static_cast<size_t>(r * cols + c);
          q[k] = f32_to_e4m3(std::clamp(w[k] / s, -448.0f, 448.0f));
          deq[k] = e4m3_to_f32(q[k]) * s;
        }
    }
  return q;
}

// Per-32 group FP4 e2m1, packed two per byte (even element in the low nibble).
std::vector<uint8_t> quant_fp4(const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& scale,
                               std::vector<float>& deq) {
  DSV4_CHECK(cols % 32 == 0, "FP4 experts need an input dim divisible by 32, got ", cols);
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols / 2), 0);
  scale.assign(static_cast<size_t>(rows * cols / 32), 0);
  deq.resize(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / 32; ++g) {
      float amax = 0;
      for (int64_t c = g * 32; c < (g + 1) * 32; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = pow2_ceil_scale(amax, 6.0f, 6.0f * std::ldexp(1.0f, -126));
      scale[r * (cols / 32) + g] = f32_pow2_to_e8m0(s);
      for (int64_t c = g * 32; c < (g + 1) * 32; ++c) {
        const size_t k = static_cast<size_t>(r * cols + c);
        const uint8_t code = f32_to_e2m1(w[k] / s);
        q[k / 2] |= (c & 1) ? static_cast<uint8_t>(code << 4) : code;
        deq[k] = e2m1_to_f32(code) * s;
      }
    }
  return q;
}

std::vector<uint8_t> tid2eid_values(int64_t vocab, int64_t k, int64_t experts, Rng& rng, DType dt) {
  std::vector<uint8_t> out(static_cast<size_t>(vocab * k) * dtype_size(dt));
  std::vector<int64_t> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < vocab; ++t) {
    for (int64_t e = 0; e < experts; ++e) ids[e] = e;
    for (int64_t i = 0; i < k; ++i) {  // partial Fisher-Yates: k distinct ids
      const int64_t j = i + static_cast<int64_t>(rng.next() % static_cast<uint64_t>(experts - i));
      std::swap(ids[i], ids[j]);
      const size_t at = static_cast<size_t>(t * k + i) * dtype_size(dt);
      if (dt == DType::I64) std::memcpy(out.data() + at, &ids[i], 8);
      else {
        const int32_t v = static_cast<int32_t>(ids[i]);
        std::memcpy(out.data() + at, &v, 4);
      }
    }
  }
  return out;
}

}  // namespace

void write_random_checkpoint(const ModelConfig& cfg, const std::string& dir, bool quantized,
                             const RandomCheckpointOptions& opt) {
  cfg.validate();
  CheckpointFormat fmt;
  fmt.linears = quantized ? LinearFormat::FP8Block : LinearFormat::Dense;
  fmt.experts = quantized ? LinearFormat::FP4Group32 : LinearFormat::Dense;
  fmt.has_mtp = opt.with_mtp && cfg.num_nextn_predict_layers > 0;
  // The quantised layout decides which tensors are FP8/FP4; the twin stores their dequantised values.
  CheckpointFormat qfmt = fmt;
  qfmt.linears = LinearFormat::FP8Block;
  qfmt.experts = LinearFormat::FP4Group32;
  std::map<std::string, ExpectedTensor> qspec;
  for (auto& t : expected_tensors(cfg, qfmt)) qspec[t.name] = t;

  SafetensorsWriter out;
  for (const ExpectedTensor& t : expected_tensors(cfg, fmt)) {
    if (ends_with(t.name, ".scale")) continue;  // written with its weight
    const ExpectedTensor& q = qspec.at(t.name);
    const DType qdt = q.dtypes.front();
    Rng rng{name_seed(opt.seed, t.name)};
    if (qdt == DType::I64 || qdt == DType::I32) {  // tid2eid
      out.add(t.name, qdt, t.shape, tid2eid_values(t.shape[0], t.shape[1], cfg.n_routed_experts, rng, qdt));
      continue;
    }
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    int64_t cols = 1;
    for (size_t i = 1; i < t.shape.size(); ++i) cols *= t.shape[i];
    const bool fp4 = qdt == DType::I8 || qdt == DType::U8;
    if (fp4) cols = q.shape[1] * 2;  // packed in the quantised layout
    std::vector<float> w = master_values(t.name, rows, cols, rng, opt.output_scale);
    if (qdt == DType::F8_E4M3 || fp4) {
      std::vector<uint8_t> scale;
      std::vector<float> deq;
      std::vector<uint8_t> codes = fp4 ? quant_fp4(w, rows, cols, scale, deq) : quant_fp8(w, rows, cols, scale, deq);
      const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
      if (quantized) {
        out.add(t.name, qdt, q.shape, std::move(codes));
        out.add(base + ".scale", DType::F8_E8M0, qspec.at(base + ".scale").shape, std::move(scale));
      } else {
        out.add(t.name, DType::BF16, {rows, cols}, to_bf16_bytes(deq));  // exact: fp8/fp4 × 2^k fits bf16
      }
    } else if (qdt == DType::BF16) {
      out.add(t.name, DType::BF16, t.shape, to_bf16_bytes(w));
    } else {
      out.add(t.name, DType::F32, t.shape, to_f32_bytes(w));
    }
  }
  std::filesystem::create_directories(dir);
  out.set_metadata("format", "pt");
  out.write_folder(dir, size_t{1} << 32);
  std::ofstream(dir + "/config.json") << config_to_json(cfg, quantized);
}

ModelConfig tiny_config() {
  ModelConfig c;
  // Vocab = the shipped tokenizer's (models/tiny/tokenizer.json: 8960 BPE + 1283 added tokens);
  // hidden 128 keeps the BF16 embed/head small enough to ship.
  c.vocab_size = 10240;
  c.hidden_size = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.head_dim = 128;
  c.rope_dim = 64;
  c.q_lora_rank = 128;
  c.o_groups = 2;
  c.o_lora_rank = 128;
  c.sliding_window = 8;
  c.layer_kinds = {AttnKind::SWA, AttnKind::CSA, AttnKind::HCA, AttnKind::CSA};
  c.compress_ratio = {0, 4, 8, 4};
  c.rope_theta = 10000.0;
  c.compress_rope_theta = 160000.0;
  c.yarn = Yarn{true, 16.0, 64, 32.0, 1.0};
  c.max_position_embeddings = 1024;
  c.index_n_heads = 16;  // many heads: exact-zero score ties (all ReLUs 0) stay rare
  c.index_head_dim = 128;
  c.index_topk = 4;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 128;
  c.num_hash_layers = 1;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.num_nextn_predict_layers = 1;
  c.expert_dtype = "fp4";
  return c;
}

}  // namespace dsv4
