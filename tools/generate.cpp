#include "tools/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

namespace dsv4 {

int32_t sample_token(const float* logits, int64_t vocab, const GenerateOptions& opt, uint64_t step) {
  if (opt.temperature <= 0.0f) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = opt.top_k > 0 ? std::min(opt.top_k, vocab) : vocab;
  std::vector<double> p(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += (p[i] = std::exp((logits[idx[i]] - mx) / opt.temperature));
  if (opt.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double c = 0;
    for (int64_t i = 0; i < keep; ++i) {
      c += p[i] / sum;
      if (c >= opt.top_p) {
        keep = i + 1;
        break;
      }
    }
    p.resize(static_cast<size_t>(keep));
    sum = std::accumulate(p.begin(), p.end(), 0.0);
  }
  // One seeded stream per (seed, step): the same seed gives the same tokens.
  std::mt19937_64 rng(opt.seed * 0x9E3779B97F4A7C15ull + step);
  double r = (rng() >> 11) * (1.0 / 9007199254740992.0) * sum;
  for (int64_t i = 0; i < keep; ++i) {
    if ((r -= p[i]) < 0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(const FeedFn& feed, int64_t vocab, int32_t eos, const GenerateOptions& opt) {
  DSV4_CHECK(!opt.prompt.empty(), "generate: empty prompt");
  std::vector<float> logits;
  const size_t chunk = opt.prefill_chunk > 0 ? static_cast<size_t>(opt.prefill_chunk) : opt.prompt.size();
  for (size_t i = 0; i < opt.prompt.size(); i += chunk)
    logits = feed(std::span<const int32_t>(opt.prompt.data() + i, std::min(chunk, opt.prompt.size() - i)));
  std::vector<int32_t> out;
  for (int64_t s = 0; s < opt.max_new_tokens; ++s) {
    const int32_t tok = sample_token(logits.data(), vocab, opt, static_cast<uint64_t>(s));
    out.push_back(tok);
    if ((opt.stop_at_eos && tok == eos) || s + 1 == opt.max_new_tokens) break;
    logits = feed(std::span<const int32_t>(&out.back(), 1));
  }
  return out;
}

std::vector<int32_t> generate(Model& model, const GenerateOptions& opt) {
  if (opt.speculative_tokens > 0) return generate_speculative(model, opt);
  SequenceState st = model.new_sequence();
  auto feed = [&](std::span<const int32_t> toks) {
    SequenceChunk c{&st, toks};
    return model.forward(std::span<const SequenceChunk>(&c, 1), false);
  };
  return generate(feed, model.config().vocab_size, static_cast<int32_t>(model.config().eos_token_id), opt);
}

}  // namespace dsv4
