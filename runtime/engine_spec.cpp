// The engine's speculative-decoding round (EngineOptions::speculative_tokens): MTP drafts for
// the decode chunks of a step, and the acceptance rule over the verify rows (spec_accept.h).
// Uniforms come from (seed, generated index) per purpose, so seeded requests stay reproducible.
#include <algorithm>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/spec_accept.h"

namespace dsv4 {

namespace {

bool penalized(const SamplingParams& p) {
  return !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
         p.presence_penalty != 0.0f;
}

int32_t argmax(std::span<const float> z) {
  return static_cast<int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
}

}  // namespace

void Engine::draft_round(const std::vector<ScheduledChunk>& plan, std::vector<std::vector<int32_t>>& verify,
                         std::vector<std::vector<std::vector<double>>>& q) {
  int64_t left = opt_.limits.max_tokens_per_step;
  for (const auto& c : plan) left -= c.n;
  std::vector<size_t> idx;
  std::vector<int64_t> depth;
  for (size_t i = 0; i < plan.size(); ++i) {
    EngineRequest& r = *plan[i].r;
    // Only a chunk that is exactly the newest token: the drafts continue after it.
    if (!plan[i].want_logits || plan[i].n != 1) continue;
    const int64_t k = std::min({opt_.speculative_tokens, r.max_tokens - r.generated() - 1, left});
    if (k <= 0 || !budget_.reserve(r.resv, r.computed() + 1 + k)) continue;
    left -= k;
    idx.push_back(i);
    depth.push_back(k);
    verify[i] = {r.tokens.back()};
  }
  const int64_t V = backend_->config().vocab_size;
  for (int64_t j = 1; !idx.empty(); ++j) {
    std::vector<BackendSequence*> seqs;
    std::vector<int32_t> toks;
    std::vector<size_t> who;
    for (size_t a = 0; a < idx.size(); ++a) {
      if (depth[a] < j) continue;
      seqs.push_back(plan[idx[a]].r->seq.get());
      toks.push_back(verify[idx[a]].back());
      who.push_back(idx[a]);
    }
    if (seqs.empty()) break;
    std::vector<float> logits = backend_->draft(seqs, toks);
    for (size_t b = 0; b < who.size(); ++b) {
      EngineRequest& r = *plan[who[b]].r;
      const SamplingParams& sp = r.req.sampling;
      std::vector<float> z(logits.begin() + b * V, logits.begin() + (b + 1) * V);
      apply_penalties(z, sp, r.history);  // any q is valid; this one tracks the target better
      int32_t d;
      if (sp.temperature == 0.0f) {
        d = argmax(z);
      } else {
        q[who[b]].push_back(sampling_distribution(z, sp));
        const uint64_t step = static_cast<uint64_t>(r.generated() + j - 1);  // index of the token d proposes
        d = draw_token(q[who[b]].back(), sampling_uniform(spec_seed(r.seed, kSaltDraft), step));
      }
      verify[who[b]].push_back(d);
    }
  }
}

std::vector<int32_t> Engine::accept_round(EngineRequest& r, const std::vector<int32_t>& verify,
                                          const std::vector<std::vector<double>>& q, const float* rows) {
  const SamplingParams& sp = r.req.sampling;
  const size_t V = static_cast<size_t>(backend_->config().vocab_size), n = verify.size();
  const bool pen = penalized(sp);
  TokenHistory hist = pen ? r.history : TokenHistory(0, {});  // penalties see the accepted tokens
  std::vector<int32_t> out;
  for (size_t j = 0; j < n; ++j) {
    std::vector<float> z(rows + j * V, rows + (j + 1) * V);
    if (pen) apply_penalties(z, sp, hist);
    const uint64_t step = static_cast<uint64_t>(r.generated()) + j;
    int32_t t;
    bool kept = false;
    if (sp.temperature == 0.0f) {
      t = argmax(z);
      kept = j + 1 < n && t == verify[j + 1];
    } else {
      const std::vector<double> p = sampling_distribution(z, sp);
      if (j + 1 < n) {
        const DraftVerdict v = verify_draft(p, q[j], verify[j + 1], sampling_uniform(spec_seed(r.seed, kSaltAccept), step),
                                            sampling_uniform(spec_seed(r.seed, kSaltResample), step));
        t = v.token;
        kept = v.accepted;
      } else {  // every draft kept: the bonus token
        t = draw_token(p, sampling_uniform(r.seed, step));
      }
    }
    out.push_back(t);
    if (!kept) break;
    if (pen) hist.add_generated(t);
  }
  return out;
}

}  // namespace dsv4
