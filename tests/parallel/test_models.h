// Test checkpoints for the parallel tests, written once per process into a temp folder with
// the same code as `dsv4 make-tiny --config` (fixed seed): tiny-tp (tests/parallel/data, dims
// that split by 4 heads-groups and 8 experts), the golden configs of tests/model/data, and
// their dequantised BF16 twins (no FP8 blocks to respect, so odd TP degrees work).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "io/config.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"

namespace dsv4::test {

inline std::string source_dir() { return DSV4_SOURCE_DIR; }

// name: "tiny-tp", "tiny-a", "tiny-b", "tiny-c"; quantised or the dequantised twin.
inline const ModelWeights& test_weights(const std::string& name, bool quantized = true) {
  static std::map<std::string, ModelWeights> cache;
  const std::string key = name + (quantized ? "" : "-bf16");
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const std::string cfg_path = source_dir() + (name == "tiny-tp" ? "/tests/parallel/data/" : "/tests/model/data/") + name +
                               "/config.json";
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dsv4-parallel-" + std::to_string(::getpid()) + "-" + key);
  std::filesystem::create_directories(dir);
  RandomCheckpointOptions opt;
  opt.seed = 7;
  write_random_checkpoint(load_config(cfg_path), dir.string(), quantized, opt);
  ModelWeights w = load_weights(dir.string());
  std::filesystem::remove_all(dir);  // the mmaps stay valid after unlink
  return cache.emplace(key, std::move(w)).first->second;
}

}  // namespace dsv4::test
