// Loads a golden case (tests/model/data/<name>): config, case settings, oracle logits, and
// writes its quantised checkpoint + dequantised twin with make-tiny's generator.
#pragma once
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <unistd.h>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

namespace dsv4::test {

// The environment wins over the compiled-in path so binaries built elsewhere (carried to the GPU
// machine) find the test data of the checkout they run in.
inline std::string source_dir() {
  const char* env = std::getenv("DSV4_SOURCE_DIR");
  return env && *env ? env : DSV4_SOURCE_DIR;
}

struct GoldenCase {
  std::string name;
  ModelConfig cfg;
  std::vector<int32_t> ids;
  std::vector<float> logits;         // [L, V]
  std::vector<float> decode_logits;  // [L - P + 1, V]: prefill P, then one row per step
  int64_t prefill = 0;
  std::string quant_dir, dequant_dir;
};

inline std::vector<float> read_f32(const TensorRef& t) {
  std::vector<float> v(static_cast<size_t>(t.info.numel()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

inline std::vector<int64_t> read_i64(const TensorRef& t) {
  std::vector<int64_t> v(static_cast<size_t>(t.info.numel()));
  std::memcpy(v.data(), t.data, v.size() * 8);
  return v;
}

inline std::map<std::string, std::unique_ptr<GoldenCase>>& golden_cache() {
  static std::map<std::string, std::unique_ptr<GoldenCase>> cache;
  return cache;
}

// Removes the temp checkpoints of every case loaded so far.
inline void remove_golden_checkpoints() {
  for (auto& [name, c] : golden_cache())
    if (c) std::filesystem::remove_all(std::filesystem::path(c->quant_dir).parent_path());
}

// Checkpoints are written once per process into a temp folder.
inline const GoldenCase& golden_case(const std::string& name) {
  auto& slot = golden_cache()[name];
  if (slot) return *slot;
  auto c = std::make_unique<GoldenCase>();
  const std::string dir = source_dir() + "/tests/model/data/" + name;
  c->name = name;
  c->cfg = load_config(dir + "/config.json");
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/case.json"));
  SafetensorsFile g(dir + "/golden.safetensors");
  for (int64_t id : read_i64(g.tensors().at("input_ids"))) c->ids.push_back(static_cast<int32_t>(id));
  c->logits = read_f32(g.tensors().at("logits"));
  c->decode_logits = read_f32(g.tensors().at("decode_logits"));
  c->prefill = read_i64(g.tensors().at("decode_prefill"))[0];
  const std::string tmp = (std::filesystem::temp_directory_path() / ("dsv4-golden-" + std::to_string(::getpid()) + "-" + name)).string();
  c->quant_dir = tmp + "/quant";
  c->dequant_dir = tmp + "/dequant";
  RandomCheckpointOptions opt{meta.at("ckpt_seed").get<uint64_t>(), true};
  write_random_checkpoint(c->cfg, c->quant_dir, true, opt);
  write_random_checkpoint(c->cfg, c->dequant_dir, false, opt);
  slot = std::move(c);
  return *slot;
}

inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates as a failure
  }
  return m;
}

}  // namespace dsv4::test
