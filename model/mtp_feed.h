// The MTP module's input queue, kept per sequence beside the target and MTP states (the same
// bookkeeping for the CPU SpecModel and the CUDA backend). The module at position t needs the
// target's streams X_t and token t+1, so the streams of each target forward wait here until a
// draft round consumes them; only the last window of positions can still be attended, older
// rows are dropped. Host memory: [rows, hc_mult · hidden] floats.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dsv4 {

class MtpFeed {
 public:
  MtpFeed() = default;
  MtpFeed(int64_t row_floats, int64_t window) : hd_(row_floats), window_(window) {}

  // After a target forward of `tokens` that started at p0: queue their streams (`rows`, one
  // per token, hd floats each). At most the last `window` positions stay queued.
  void push(int64_t p0, std::span<const int32_t> tokens, const float* rows);

  // A draft step's input for one sequence.
  struct Step {
    int64_t start;               // MTP position of the first row
    std::vector<int32_t> next;   // token t+1 of each row
    const float* streams;        // [next.size(), hd] input streams
    bool feedback;               // rows are speculative (the module's own streams fed back)
  };
  // The first step of a round catches the module up on the queued positions (their next
  // tokens are known; the last is `token`, about to be fed to the target at target_pos);
  // later steps feed the previous step's output streams back with the previous draft.
  Step step(int64_t target_pos, int64_t mtp_pos, int32_t token) const;
  // After a step: keep its output streams (hd floats); the first step empties the queue.
  void stepped(const float* out_streams, int64_t target_pos);
  // End of a round: the target kept new_pos tokens, queued rows past it are dropped.
  void accept(int64_t new_pos);

  bool drafting() const { return drafting_; }
  // The most bytes() can reach: window rows and their tokens, plus one row of draft streams.
  static size_t max_bytes(int64_t row_floats, int64_t window) {
    return sizeof(float) * static_cast<size_t>(window * (row_floats + 1) + row_floats);
  }
  size_t bytes() const { return sizeof(float) * (hidden_.size() + tokens_.size() + draft_streams_.size()); }

 private:
  int64_t hd_ = 0, window_ = 0;
  std::vector<float> hidden_;     // queued streams of positions [pend0_, pend0_ + tokens_.size())
  std::vector<int32_t> tokens_;   // and the tokens fed at those positions
  int64_t pend0_ = 0;
  std::vector<float> draft_streams_;  // output streams of the last step
  bool drafting_ = false;             // a step ran since the last accept()
};

}  // namespace dsv4
