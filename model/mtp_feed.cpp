#include "model/mtp_feed.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

void MtpFeed::push(int64_t p0, std::span<const int32_t> tokens, const float* rows) {
  DSV4_CHECK(pend0_ + static_cast<int64_t>(tokens_.size()) == p0, "MTP feed: target forward at ", p0,
             " does not continue the queued positions");
  // A draft only attends the last window of positions: keep at most that many rows, so a long
  // prefill chunk costs window rows here, not its length.
  const int64_t n = static_cast<int64_t>(tokens.size()), from = p0 + n - window_;
  const int64_t drop = std::clamp<int64_t>(from - pend0_, 0, static_cast<int64_t>(tokens_.size()));
  hidden_.erase(hidden_.begin(), hidden_.begin() + drop * hd_);
  tokens_.erase(tokens_.begin(), tokens_.begin() + drop);
  pend0_ += drop;
  const int64_t skip = tokens_.empty() ? std::clamp<int64_t>(from - p0, 0, n) : 0;
  if (tokens_.empty()) pend0_ = p0 + skip;
  hidden_.insert(hidden_.end(), rows + skip * hd_, rows + n * hd_);
  tokens_.insert(tokens_.end(), tokens.begin() + skip, tokens.end());
}

MtpFeed::Step MtpFeed::step(int64_t target_pos, int64_t mtp_pos, int32_t token) const {
  if (drafting_) return Step{mtp_pos, {token}, draft_streams_.data(), true};
  // Positions the window no longer reaches are skipped.
  const int64_t end = target_pos, start = std::max({pend0_, mtp_pos, end - window_});
  DSV4_CHECK(start < end && pend0_ + static_cast<int64_t>(tokens_.size()) == end,
             "speculative: no target position to draft from");
  Step s{start, std::vector<int32_t>(tokens_.begin() + (start - pend0_) + 1, tokens_.end()),
         hidden_.data() + (start - pend0_) * hd_, false};
  s.next.push_back(token);
  return s;
}

void MtpFeed::stepped(const float* out_streams, int64_t target_pos) {
  draft_streams_.assign(out_streams, out_streams + hd_);
  if (!drafting_) {
    hidden_.clear();
    tokens_.clear();
    pend0_ = target_pos;
    drafting_ = true;
  }
}

void MtpFeed::accept(int64_t new_pos) {
  const int64_t keep = std::clamp<int64_t>(new_pos - pend0_, 0, static_cast<int64_t>(tokens_.size()));
  tokens_.resize(static_cast<size_t>(keep));
  hidden_.resize(static_cast<size_t>(keep * hd_));
  drafting_ = false;
}

}  // namespace dsv4
