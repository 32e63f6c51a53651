// The DeepSeek-V4 forward on the CPU reference backend (fp32 math): embedding → n-stream mHC
// decoder blocks → hc_head → norm → head. Any mix of sequences and chunk lengths per call.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/parallel/rank_context.h"
#include "model/rope.h"
#include "model/state.h"
#include "model/weights.h"

namespace dsv4 {

struct SequenceChunk {
  SequenceState* state;
  std::span<const int32_t> tokens;  // continue from state->pos
  bool every_row = false;           // logits of every token of this chunk even when !all_logits
};

class Model {
 public:
  explicit Model(ModelWeights weights);
  // One rank of a parallel world: `weights` is its shard, `par` its groups (model/parallel/).
  Model(ModelWeights weights, const RankContext& par);
  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  SequenceState new_sequence() const { return make_sequence_state(w_.config); }

  // Runs each chunk (distinct sequences), advancing their states. Returns logits [rows, vocab]:
  // every token's row when all_logits, else one row (the last token) per chunk.
  // hidden (optional) receives every row's streams after the last block, before hc_head
  // ([rows, hc_mult · hidden], chunk order): the MTP module's input.
  std::vector<float> forward(std::span<const SequenceChunk> chunks, bool all_logits,
                             std::vector<float>* hidden = nullptr);

 private:
  ModelWeights w_;
  RopeFreqs rope_swa_, rope_compressed_;
  RankContext par_;
};

}  // namespace dsv4
