#include "model/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

size_t SpecState::bytes() const {
  return target.bytes() + mtp.bytes() + 4 * (hidden.size() + tokens.size() + draft_streams.size());
}

SpecModel::SpecModel(Model& model, bool with_mtp)
    : model_(&model),
      mtp_(with_mtp ? std::make_unique<MtpModule>(model) : nullptr),
      target_lay_(target_layout(model.config())),
      mtp_lay_(mtp_layout(model.config())) {}

SpecState SpecModel::new_state() const {
  SpecState s;
  s.target = model_->new_sequence();
  if (mtp_) s.mtp = mtp_->new_state();
  return s;
}

std::vector<float> SpecModel::forward(std::span<const SpecChunk> chunks) {
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size, W = model_->config().sliding_window;
  std::vector<SequenceChunk> mc;
  for (const auto& c : chunks) {
    DSV4_CHECK(c.s->target_undo.empty(), "speculative: accept() the previous verify first");
    DSV4_CHECK(c.verify || !c.s->drafting, "speculative: drafts must be verified");
    if (c.verify) undo_record(c.s->target_undo, c.s->target, target_lay_, static_cast<int64_t>(c.tokens.size()));
    mc.push_back({&c.s->target, c.tokens, c.verify});
  }
  std::vector<float> hidden;
  std::vector<float> logits = model_->forward(mc, false, mtp_ ? &hidden : nullptr);
  if (!mtp_) return logits;
  size_t row = 0;
  for (const auto& c : chunks) {
    SpecState& s = *c.s;
    // Only the last window of positions can still be attended by a draft.
    const int64_t p0 = s.target.pos - static_cast<int64_t>(c.tokens.size());
    const int64_t drop = std::clamp<int64_t>(p0 - W - s.pend0, 0, static_cast<int64_t>(s.tokens.size()));
    s.hidden.erase(s.hidden.begin(), s.hidden.begin() + drop * hd);
    s.tokens.erase(s.tokens.begin(), s.tokens.begin() + drop);
    s.pend0 += drop;
    s.hidden.insert(s.hidden.end(), hidden.begin() + row * hd, hidden.begin() + (row + c.tokens.size()) * hd);
    s.tokens.insert(s.tokens.end(), c.tokens.begin(), c.tokens.end());
    row += c.tokens.size();
  }
  return logits;
}

std::vector<float> SpecModel::draft(std::span<SpecState* const> seqs, std::span<const int32_t> tokens) {
  DSV4_CHECK(mtp_, "speculative: the model was loaded without its MTP module");
  DSV4_CHECK(seqs.size() == tokens.size(), "speculative: one token per sequence");
  const int64_t hd = model_->config().hc_mult * model_->config().hidden_size, W = model_->config().sliding_window;
  std::vector<MtpChunk> chunks;
  std::vector<std::vector<int32_t>> next(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecState& s = *seqs[i];
    if (s.drafting) {  // feed the module's own streams back; undone by accept()
      undo_record(s.mtp_undo, s.mtp, mtp_lay_, 1);
      next[i] = {tokens[i]};
      chunks.push_back({&s.mtp, s.draft_streams.data(), next[i]});
      continue;
    }
    // Catch up on the target's newest positions [start, target.pos): their next tokens are
    // known, the last one is tokens[i]. Positions the window no longer reaches are skipped.
    const int64_t end = s.target.pos, start = std::max({s.pend0, s.mtp.pos, end - W});
    DSV4_CHECK(start < end && s.pend0 + static_cast<int64_t>(s.tokens.size()) == end,
               "speculative: no target position to draft from");
    s.mtp.pos = start;
    next[i].assign(s.tokens.begin() + (start - s.pend0) + 1, s.tokens.end());
    next[i].push_back(tokens[i]);
    chunks.push_back({&s.mtp, s.hidden.data() + (start - s.pend0) * hd, next[i]});
  }
  std::vector<float> streams;
  std::vector<float> logits = mtp_->forward(chunks, false, &streams);
  for (size_t i = 0; i < seqs.size(); ++i) {
    SpecState& s = *seqs[i];
    s.draft_streams.assign(streams.begin() + i * hd, streams.begin() + (i + 1) * hd);
    if (!s.drafting) {
      s.hidden.clear();
      s.tokens.clear();
      s.pend0 = s.target.pos;
      s.drafting = true;
    }
  }
  return logits;
}

void SpecModel::accept(SpecState& s, int64_t new_pos) {
  undo_truncate(s.target_undo, s.target, target_lay_, new_pos);
  if (mtp_) {
    if (!s.mtp_undo.empty()) undo_truncate(s.mtp_undo, s.mtp, mtp_lay_, s.mtp_undo.pos0);
    const int64_t keep = std::max<int64_t>(0, new_pos - s.pend0);
    s.tokens.resize(static_cast<size_t>(std::min<int64_t>(keep, static_cast<int64_t>(s.tokens.size()))));
    s.hidden.resize(s.tokens.size() * static_cast<size_t>(model_->config().hc_mult * model_->config().hidden_size));
    s.drafting = false;
  }
}

}  // namespace dsv4
