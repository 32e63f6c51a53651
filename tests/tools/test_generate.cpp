// `dsv4 generate` logic and the shipped tiny model (models/tiny).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "tools/generate.h"

namespace dsv4 {
namespace {

const std::string kTiny = std::string(DSV4_SOURCE_DIR) + "/models/tiny";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(ShippedTiny, IsReproducibleFromMakeTiny) {
  // models/tiny is exactly `dsv4 make-tiny --out models/tiny --seed 1`.
  const std::string dir = (std::filesystem::temp_directory_path() / ("dsv4-shipped-" + std::to_string(::getpid()))).string();
  write_random_checkpoint(tiny_config(), dir, true, RandomCheckpointOptions{1, true});
  EXPECT_EQ(slurp(dir + "/model.safetensors"), slurp(kTiny + "/model.safetensors"));
  EXPECT_EQ(slurp(dir + "/config.json"), slurp(kTiny + "/config.json"));
  std::filesystem::remove_all(dir);
}

TEST(Generate, GreedyIsDeterministicAndChunkInvariant) {
  Model m(load_weights(kTiny));
  GenerateOptions o;
  o.prompt = {0, 17, 42, 99, 3, 250, 7, 7, 12, 300, 401, 5};
  o.max_new_tokens = 10;
  o.stop_at_eos = false;
  std::vector<int32_t> a = generate(m, o);
  o.prefill_chunk = 5;
  std::vector<int32_t> b = generate(m, o);
  EXPECT_EQ(a.size(), 10u);
  EXPECT_EQ(a, b);
}

TEST(Generate, SeededSamplingRepeatsPerSeed) {
  Model m(load_weights(kTiny));
  GenerateOptions o;
  o.prompt = {0, 17, 42, 99};
  o.max_new_tokens = 16;
  o.temperature = 1.0f;
  o.stop_at_eos = false;
  o.seed = 5;
  std::vector<int32_t> a = generate(m, o), b = generate(m, o);
  o.seed = 6;
  std::vector<int32_t> c = generate(m, o);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sample, TopKOneIsArgmaxAndTopPKeepsMass) {
  std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  GenerateOptions o;
  o.temperature = 1.0f;
  o.top_k = 1;
  for (uint64_t s = 0; s < 20; ++s) EXPECT_EQ(sample_token(logits.data(), 4, o, s), 1);
  o.top_k = 0;
  o.top_p = 0.3f;  // the top token alone holds > 30% of the mass
  for (uint64_t s = 0; s < 20; ++s) EXPECT_EQ(sample_token(logits.data(), 4, o, s), 1);
  o.top_p = 1.0f;
  int seen[4] = {0, 0, 0, 0};
  for (uint64_t s = 0; s < 400; ++s) ++seen[sample_token(logits.data(), 4, o, s)];
  EXPECT_GT(seen[2], 50);  // the runner-up is sampled too
}

}  // namespace
}  // namespace dsv4
