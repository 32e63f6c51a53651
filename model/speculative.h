// MTP speculative decoding on the CPU model (spec/model.md §5.6): a sequence carries the
// target state, the MTP module's state and its feed (model/mtp_feed.h). A round is: draft() k times (the first call catches the MTP up on the target's newest
// positions, later calls feed its own output streams back), one forward() of the k+1 tokens
// with verify set (every row's logits, undo recorded), then accept() with the position the
// acceptance rule reached: rejected tokens and the draft rows are rolled back (state_undo.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/mtp.h"
#include "model/mtp_feed.h"
#include "model/state_undo.h"

namespace dsv4 {

struct SpecState {
  SequenceState target, mtp;
  StateUndo target_undo, mtp_undo;
  MtpFeed feed;  // target streams the MTP has not consumed yet, and the draft streams
  size_t bytes() const;
};

struct SpecChunk {
  SpecState* s;
  std::span<const int32_t> tokens;
  bool verify = false;  // logits of every row, and the forward can be rolled back by accept()
};

class SpecModel {
 public:
  // with_mtp = false: plain decoding through the same interface (no streams kept).
  SpecModel(Model& model, bool with_mtp);
  bool has_mtp() const { return mtp_ != nullptr; }
  const Model& model() const { return *model_; }
  SpecState new_state() const;

  // Logits in chunk order: every row of verify chunks, the last row of the others.
  std::vector<float> forward(std::span<const SpecChunk> chunks);
  // One draft step for each state; tokens[i] is the newest token of seqs[i] (not yet given to
  // the target on the first step, the previous draft after). Returns [seqs, vocab].
  std::vector<float> draft(std::span<SpecState* const> seqs, std::span<const int32_t> tokens);
  // Ends a round: the target keeps its first new_pos tokens, the MTP drops its draft rows.
  void accept(SpecState& s, int64_t new_pos);

 private:
  Model* model_;
  std::unique_ptr<MtpModule> mtp_;
  StateLayout target_lay_, mtp_lay_;
};

}  // namespace dsv4
