// `dsv4 generate`: prefill a prompt of token ids, then decode greedily or with seeded sampling.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/backend.h"

namespace dsv4 {

struct GenerateOptions {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;
  int64_t top_k = 0;         // 0 = off
  uint64_t seed = 0;
  int64_t prefill_chunk = 0; // 0 = whole prompt at once
  bool stop_at_eos = true;
  int64_t speculative_tokens = 0;  // MTP drafts per step (0 = off); see generate_speculative
};

struct SpecStats {
  int64_t rounds = 0, drafted = 0, accepted = 0;
  double acceptance() const { return drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0; }
};

// Feeds tokens to one sequence and returns the last token's logits (any backend).
using FeedFn = std::function<std::vector<float>(std::span<const int32_t>)>;

std::vector<int32_t> generate(const FeedFn& feed, int64_t vocab, int32_t eos, const GenerateOptions& opt);
// With opt.speculative_tokens > 0 this runs generate_speculative.
std::vector<int32_t> generate(Model& model, const GenerateOptions& opt);

// MTP speculative decoding (model/speculative.h) of one sequence: greedy gives exactly the
// tokens of plain decoding; sampled tokens follow the same distribution (rejection rule,
// runtime/spec_accept.h) but come from other uniforms, so a seed gives other tokens.
std::vector<int32_t> generate_speculative(Model& model, const GenerateOptions& opt, SpecStats* stats = nullptr);
// The same through any backend with an MTP module (CpuBackend, CudaBackend).
std::vector<int32_t> generate_speculative(ModelBackend& backend, const GenerateOptions& opt, SpecStats* stats = nullptr);

// Picks a token from logits: argmax when temperature == 0, else seeded top-k/top-p sampling.
int32_t sample_token(const float* logits, int64_t vocab, const GenerateOptions& opt, uint64_t step);

}  // namespace dsv4
