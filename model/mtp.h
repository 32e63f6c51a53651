// The MTP module mtp.0 on the CPU (spec/model.md §5.6): for position t, from the main model's
// streams X_t (after the last block, before hc_head) and token t+1,
//   ê = RMSNorm(Embed[tok_{t+1}]; enorm), Ĥ_i = RMSNorm(X_t[i]; hnorm), Z_i = W_h Ĥ_i + W_e ê,
// one decoder block (SWA attention with rope_theta and no YaRN, non-hash MoE with bias) over
// its own window ring, then mtp.hc_head → RMSNorm(mtp.norm) → the shared head: logits for
// token t+2. Further draft steps feed the block's output streams back in place of X (vLLM).
// The embedding is not masked at position 0 (vLLM zeroes it there; the spec formula does not).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/rope.h"
#include "model/state.h"

namespace dsv4 {

struct MtpChunk {
  SequenceState* state;           // the module's own state (MtpModule::new_state), rows at state->pos…
  const float* streams;           // [n, hc_mult · hidden] input streams of the n rows
  std::span<const int32_t> next;  // token t+1 of each row
};

class MtpModule {
 public:
  explicit MtpModule(const Model& model);  // the checkpoint must hold mtp.0.*
  SequenceState new_state() const;

  // Runs each chunk, advancing its state. Returns logits [rows, vocab] (every row when
  // all_logits, else each chunk's last); out_streams (optional) gets the block's output
  // streams of the same rows [rows, hc_mult · hidden].
  std::vector<float> forward(std::span<const MtpChunk> chunks, bool all_logits,
                             std::vector<float>* out_streams = nullptr) const;

 private:
  const Model* model_;
  RopeFreqs rope_;
};

}  // namespace dsv4
