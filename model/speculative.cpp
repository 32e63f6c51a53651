#include "model/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

size_t SpecState::bytes() const { return target.bytes() + mtp.bytes() + feed.bytes(); }

SpecModel::SpecModel(Model& model, bool with_mtp)
    : model_(&model),
      mtp_(with_mtp ? std::make_unique<MtpModule>(model) : nullptr),
      target_lay_(target_layout(model.config())),
      mtp_lay_(mtp_layout(model.config())) {}

SpecState SpecModel::new_state() const {
  const ModelConfig& cfg = model_->config();
  SpecState s;
  s.target = model_->new_sequence();
  if (mtp_) {
    s.mtp = mtp_->new_state();
    s.feed = MtpFeed(cfg.hc_mult * cfg.hidden_size, cfg.sliding_window);
  }
  return s;
}

std::vector<float> SpecModel::forward(std::span<const SpecChunk> chunks) {
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size;
  std::vector<SequenceChunk> mc;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.s->target_undo.empty(), "speculative: accept() the previous verify first");
    DSV4_CHECK(c.verify || !c.s->feed.drafting(), "speculative: drafts must be verified");
    if (c.verify) undo_record(c.s->target_undo, c.s->target, target_lay_, static_cast<int64_t>(c.tokens.size()));
    mc.push_back({&c.s->target, c.tokens, c.verify});
  }
  std::vector<float> hidden;
  std::vector<float> logits = model_->forward(mc, false, mtp_ ? &hidden : nullptr);
  if (!mtp_) return logits;
  size_t row = 0;
  for (const auto& c : chunks) {
    c.s->feed.push(c.s->target.pos - static_cast<int64_t>(c.tokens.size()), c.tokens, hidden.data() + row * hd);
    row += c.tokens.size();
  }
  return logits;
}

std::vector<float> SpecModel::draft(std::span<SpecState* const> seqs, std::span<const int32_t> tokens) {
  DSV4_CHECK(mtp_, "speculative: the model was loaded without its MTP module");
  DSV4_CHECK(seqs.size() == tokens.size(), "speculative: one token per sequence");
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size;
  std::vector<MtpChunk> chunks;
  std::vector<MtpFeed::Step> steps;
  steps.reserve(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecState& s = *seqs[i];
    steps.push_back(s.feed.step(s.target.pos, s.mtp.pos, tokens[i]));
    const MtpFeed::Step& st = steps.back();
    if (st.feedback) undo_record(s.mtp_undo, s.mtp, mtp_lay_, 1);  // undone by accept()
    s.mtp.pos = st.start;
    chunks.push_back({&s.mtp, st.streams, st.next});
  }
  std::vector<float> streams;
  std::vector<float> logits = mtp_->forward(chunks, false, &streams);
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->feed.stepped(streams.data() + i * hd, seqs[i]->target.pos);
  return logits;
}

void SpecModel::accept(SpecState& s, int64_t new_pos) {
  undo_truncate(s.target_undo, s.target, target_lay_, new_pos);
  if (mtp_) {
    if (!s.mtp_undo.empty()) undo_truncate(s.mtp_undo, s.mtp, mtp_lay_, s.mtp_undo.pos0);
    s.feed.accept(new_pos);
  }
}

}  // namespace dsv4
