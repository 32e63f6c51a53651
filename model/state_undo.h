// Rollback of a sequence's state after speculative verification (spec/model.md §6): forwards
// recorded in a StateUndo can be undone down to any position they started from. Only what a
// forward overwrites is saved — the window-ring slots of its tokens (n × head_dim floats per
// layer). Closed entries and indexer keys are append-only and are cut by count; compressor
// rows are pinned (kept past their window's close) so cutting them needs no copy either.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/state.h"

namespace dsv4 {

// Which layers a state holds: the main model's, or the MTP module's single SWA layer.
struct StateLayout {
  std::vector<AttnKind> kinds;
  std::vector<int64_t> ratios;  // m per layer, 0 for SWA
  int64_t window = 0, head_dim = 0, index_head_dim = 0;
};
StateLayout target_layout(const ModelConfig& cfg);
StateLayout mtp_layout(const ModelConfig& cfg);

struct StateUndo {
  int64_t pos0 = -1;              // position of the first recorded forward; -1 = nothing recorded
  std::vector<int64_t> slot_pos;  // positions whose ring slot was saved, in recording order
  std::vector<float> saved;       // [slot_pos.size(), layers, head_dim]: the slot before the write
  bool empty() const { return pos0 < 0; }
};

// Call before a forward of n tokens on st: saves the ring slots it will write, pins compressor rows.
void undo_record(StateUndo& u, SequenceState& st, const StateLayout& lay, int64_t n);
// Back to new_pos (u.pos0 <= new_pos <= st.pos): bitwise the state a run that stopped at new_pos
// would have, compressor rows included (the pinned rows it no longer needs are dropped). Clears u.
void undo_truncate(StateUndo& u, SequenceState& st, const StateLayout& lay, int64_t new_pos);

}  // namespace dsv4
