#include "model/block.h"

#include <algorithm>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "model/attention.h"
#include "model/mhc.h"
#include "model/moe.h"
#include "model/parallel/moe_parallel.h"

namespace dsv4 {

void decoder_block(const LayerWeights& L, size_t layer, const ModelConfig& cfg, const RopeFreqs& rope,
                   const BatchRows& batch, bool hash, std::vector<float>& X, const RankContext* par) {
  const int64_t R = batch.rows, d = cfg.hidden_size, n = cfg.hc_mult;
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  std::vector<float> u(R * d), F(R * d);
  HcMix mix;
  hc_pre(L.hc_attn, cfg, X.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), L.attn_norm.data(), u.data(), R, d, eps);
  attention_forward(L, layer, cfg, rope, batch, u.data(), F.data());
  if (par && par->tp) par->tp->all_reduce_sum(F.data(), F.size());  // wo_b partial sums of our heads
  hc_post(mix, F.data(), X.data(), R, n, d);
  hc_pre(L.hc_ffn, cfg, X.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), L.ffn_norm.data(), u.data(), R, d, eps);
  if (par && par->active()) {
    moe_forward_parallel(L.ffn, cfg, hash, batch, u.data(), F.data(), *par);
  } else {
    moe_forward(L.ffn, cfg, hash, batch, u.data(), F.data());
  }
  hc_post(mix, F.data(), X.data(), R, n, d);
}

std::vector<float> head_logits(const HcWeights& hc, const Vec& norm, const WeightView& head, const ModelConfig& cfg,
                               const std::vector<float>& X, const std::vector<int64_t>& rows,
                               std::vector<float>* streams) {
  const int64_t d = cfg.hidden_size, n = cfg.hc_mult, V = cfg.vocab_size, O = static_cast<int64_t>(rows.size());
  std::vector<float> Xo(O * n * d), h(O * d), logits(O * V);
  for (int64_t i = 0; i < O; ++i) std::copy_n(X.data() + rows[i] * n * d, n * d, Xo.data() + i * n * d);
  hc_head(hc, cfg, Xo.data(), O, h.data());
  cpu::rms_norm(h.data(), norm.data(), h.data(), O, d, static_cast<float>(cfg.rms_norm_eps));
  cpu::linear(head, h.data(), O, logits.data());
  if (streams) *streams = std::move(Xo);
  return logits;
}

}  // namespace dsv4
