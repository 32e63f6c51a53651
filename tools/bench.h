// `dsv4 bench`: end-to-end GPU benchmark of a V4-shaped model (random weights, fewer layers):
// prefill tokens/s and decode tokens/s per batch size, each against its floor, in one run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4 {

struct BenchOptions {
  std::string preset = "v4-flash";
  int64_t layers = 8;
  bool random_weights = true;
  std::string precision = "fast";
  std::vector<int64_t> batches = {1, 16, 64};
  int64_t context = 512;   // tokens of each decode sequence before timing
  int64_t prefill = 4096;  // prompt length of the prefill measurement
  int64_t steps = 16;      // timed decode steps per batch size
  uint64_t seed = 1;
  bool profile = false;            // per-op GPU time of a few eager decode steps per batch size
  int64_t speculative_tokens = 0;  // > 0: also engine decode with and without MTP (tools/bench_spec.h)
};

int run_bench(const BenchOptions& opt);

}  // namespace dsv4
