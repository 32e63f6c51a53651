// Per-request token sampling with OpenAI/vLLM semantics.
//
// Order (vLLM V1): raw logits → logit_bias → repetition penalty (prompt + generated tokens:
// positive logits divided, negative multiplied) → frequency/presence penalties (generated
// tokens only: l -= frequency·count + presence·[count > 0]) → greedy argmax if temperature == 0,
// else /temperature → softmax → min_p (drop p < min_p·p_max) → top_k → top_p (smallest
// most-probable set whose mass reaches top_p) → renormalise → draw.
//
// The draw uses an RNG derived from (seed, step) only — step = index of the generated token —
// so a seeded request gives the same tokens whatever else is in the batch, and after
// preemption.
//
// Logprobs: LogprobsMode::Raw (default, as vLLM V1's default `raw_logprobs`) is the
// log-softmax of the model's logits; LogprobsMode::Processed is the log-softmax of the logits
// the draw used (after bias, penalties, temperature and truncation; removed tokens -inf).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace dsv4 {

enum class LogprobsMode { Raw, Processed };

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0 or -1 = off
  float min_p = 0.0f;        // [0, 1]
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;  // [-2, 2]
  float repetition_penalty = 1.0f;                           // > 0; 1 = off
  std::optional<uint64_t> seed;                              // absent: the engine picks one
  std::vector<std::pair<int32_t, float>> logit_bias;         // token id → added to its logit
  bool logprobs = false;  // report the sampled token's logprob
  int32_t top_logprobs = 0;  // and this many most likely tokens (0..20)
  LogprobsMode logprobs_mode = LogprobsMode::Raw;

  // Throws Error naming the field when out of range (vocab: for token ids in logit_bias).
  void validate(int64_t vocab) const;
};

// The tokens a request has seen, for the penalties.
class TokenHistory {
 public:
  TokenHistory(int64_t vocab, std::span<const int32_t> prompt);
  void add_generated(int32_t token);
  int32_t generated_count(int32_t token) const { return out_count_[token]; }
  bool seen(int32_t token) const { return seen_[token]; }  // in prompt or generated
  // Distinct tokens in first-seen order (the penalties touch only these).
  const std::vector<int32_t>& seen_tokens() const { return seen_list_; }
  const std::vector<int32_t>& generated_tokens() const { return out_tokens_; }

 private:
  std::vector<int32_t> out_count_;
  std::vector<uint8_t> seen_;
  std::vector<int32_t> seen_list_, out_tokens_;
};

// logit_bias and the three penalties, in place.
void apply_penalties(std::span<float> logits, const SamplingParams& p, const TokenHistory& h);

// Probabilities the draw uses, from penalised logits (temperature > 0): 0 for removed tokens.
std::vector<double> sampling_distribution(std::span<const float> penalized, const SamplingParams& p);

// Uniform in [0, 1) from (seed, step) alone.
double sampling_uniform(uint64_t seed, uint64_t step);

struct TokenLogprob {
  int32_t token;
  float logprob;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;                    // when params.logprobs or top_logprobs > 0
  std::vector<TokenLogprob> top_logprobs;  // most likely first (ties: lower id first)
};

// Picks the next token from one row of raw logits.
SampleResult sample_next(std::span<const float> raw_logits, const SamplingParams& p, const TokenHistory& h,
                         uint64_t seed, uint64_t step);

// The result sample_next would report for `token` chosen elsewhere (speculative decoding).
SampleResult describe_token(std::span<const float> raw_logits, const SamplingParams& p, const TokenHistory& h,
                            int32_t token);

// log-softmax of a logit row (−inf entries stay −inf).
std::vector<float> log_softmax(std::span<const float> logits);

}  // namespace dsv4
