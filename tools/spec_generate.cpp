// generate_speculative: prefill, then rounds of k MTP drafts + one verify forward of k+1
// tokens through a ModelBackend (CPU or CUDA), accepting by the rule of runtime/spec_accept.h.
#include <algorithm>

#include "core/error.h"
#include "runtime/cpu_backend.h"
#include "runtime/sampler.h"
#include "runtime/spec_accept.h"
#include "tools/generate.h"

namespace dsv4 {

namespace {

struct Picker {
  SamplingParams sp;
  uint64_t seed;
  bool greedy() const { return sp.temperature == 0.0f; }
  std::vector<double> dist(const float* l, size_t V) const {
    return sampling_distribution(std::span<const float>(l, V), sp);
  }
  int32_t argmax(const float* l, size_t V) const { return static_cast<int32_t>(std::max_element(l, l + V) - l); }
};

}  // namespace

std::vector<int32_t> generate_speculative(Model& model, const GenerateOptions& opt, SpecStats* stats) {
  CpuBackend backend(model, true);
  return generate_speculative(backend, opt, stats);
}

std::vector<int32_t> generate_speculative(ModelBackend& backend, const GenerateOptions& opt, SpecStats* stats) {
  DSV4_CHECK(!opt.prompt.empty(), "generate: empty prompt");
  DSV4_CHECK(opt.speculative_tokens >= 1 && opt.speculative_tokens <= 16, "--speculative-tokens must be in [1, 16]");
  DSV4_CHECK(backend.has_mtp(), "--speculative-tokens: the backend has no MTP module");
  const ModelConfig& cfg = backend.config();
  const size_t V = static_cast<size_t>(cfg.vocab_size);
  auto seq = backend.new_sequence(static_cast<int64_t>(opt.prompt.size()) + opt.max_new_tokens + opt.speculative_tokens + 1);
  Picker pk{{}, opt.seed};
  pk.sp.temperature = opt.temperature;
  pk.sp.top_p = opt.top_p;
  pk.sp.top_k = opt.top_k;
  auto feed = [&](std::span<const int32_t> toks, bool verify) {
    BackendChunk c{seq.get(), toks, true, verify};
    return backend.forward(std::span<const BackendChunk>(&c, 1));
  };
  auto pick = [&](const float* l, uint64_t step) {
    return pk.greedy() ? pk.argmax(l, V) : draw_token(pk.dist(l, V), sampling_uniform(pk.seed, step));
  };

  std::vector<float> logits;
  const size_t chunk = opt.prefill_chunk > 0 ? static_cast<size_t>(opt.prefill_chunk) : opt.prompt.size();
  for (size_t i = 0; i < opt.prompt.size(); i += chunk)
    logits = feed(std::span<const int32_t>(opt.prompt.data() + i, std::min(chunk, opt.prompt.size() - i)), false);
  std::vector<int32_t> out{pick(logits.data(), 0)};
  SpecStats local;
  auto done = [&] {
    return static_cast<int64_t>(out.size()) >= opt.max_new_tokens ||
           (opt.stop_at_eos && out.back() == static_cast<int32_t>(cfg.eos_token_id));
  };
  while (!done()) {
    const int64_t k = std::min<int64_t>(opt.speculative_tokens, opt.max_new_tokens - static_cast<int64_t>(out.size()) - 1);
    const uint64_t g = out.size();  // generated index of the token row 0 of the verify decides
    if (k == 0) {
      logits = feed(std::span<const int32_t>(&out.back(), 1), false);
      out.push_back(pick(logits.data(), g));
      continue;
    }
    std::vector<int32_t> verify{out.back()};
    std::vector<std::vector<double>> q;
    for (int64_t j = 1; j <= k; ++j) {
      BackendSequence* sp = seq.get();
      const int32_t last = verify.back();
      std::vector<float> dl = backend.draft(std::span<BackendSequence* const>(&sp, 1), std::span<const int32_t>(&last, 1));
      if (pk.greedy()) {
        verify.push_back(pk.argmax(dl.data(), V));
      } else {
        q.push_back(pk.dist(dl.data(), V));
        verify.push_back(draw_token(q.back(), sampling_uniform(spec_seed(pk.seed, kSaltDraft), g + j - 1)));
      }
    }
    const int64_t p0 = seq->pos();
    std::vector<float> rows = feed(verify, true);
    int64_t kept = 0;
    for (int64_t j = 0; j <= k; ++j) {
      const float* row = rows.data() + j * V;
      const uint64_t step = g + j;
      int32_t t;
      bool ok = false;
      if (pk.greedy()) {
        t = pk.argmax(row, V);
        ok = j < k && t == verify[j + 1];
      } else if (j < k) {
        const DraftVerdict v = verify_draft(pk.dist(row, V), q[j], verify[j + 1],
                                            sampling_uniform(spec_seed(pk.seed, kSaltAccept), step),
                                            sampling_uniform(spec_seed(pk.seed, kSaltResample), step));
        t = v.token;
        ok = v.accepted;
      } else {
        t = pick(row, step);
      }
      out.push_back(t);
      if (!ok) break;
      ++kept;
    }
    backend.accept(*seq, p0 + 1 + kept);
    ++local.rounds;
    local.drafted += k;
    local.accepted += kept;
    // An EOS inside the accepted run ends the output there.
    if (opt.stop_at_eos) {
      auto eos = std::find(out.end() - (kept + 1), out.end(), static_cast<int32_t>(cfg.eos_token_id));
      if (eos != out.end()) out.erase(eos + 1, out.end());
    }
  }
  if (static_cast<int64_t>(out.size()) > opt.max_new_tokens) out.resize(static_cast<size_t>(opt.max_new_tokens));
  if (stats) *stats = local;
  return out;
}

}  // namespace dsv4
