// Where one rank sits in a tensor × expert parallel world. The world has max(tp, ep) ranks
// (the smaller degree divides the larger): TP groups are consecutive blocks of tp ranks,
// EP groups consecutive blocks of ep ranks. So `--tp 4 --ep 4` is 4 ranks that split both
// attention heads and experts, `--tp 1 --ep 8` 8 ranks with attention replicated, and
// `--tp 2 --ep 4` 4 ranks whose two TP pairs each split heads while all 4 split experts.
#pragma once
#include <vector>

#include "io/config.h"

namespace dsv4 {

struct ShardSpec {
  int tp_rank = 0, tp_size = 1;
  int ep_rank = 0, ep_size = 1;
};

struct ParallelLayout {
  int tp = 1, ep = 1;

  int world() const { return tp > ep ? tp : ep; }
  ShardSpec spec(int rank) const { return {rank % tp, tp, rank % ep, ep}; }
  int tp_group(int rank) const { return rank / tp; }  // which block of tp ranks
  int ep_group(int rank) const { return rank / ep; }
};

// Throws Error naming the flag when tp/ep cannot form a world.
void check_layout(const ParallelLayout& l);

// Throws Error naming the config field when the model cannot be split this way: heads follow
// output groups (o_groups % tp), shared expert width % tp, n_routed_experts % ep.
void check_shardable(const ModelConfig& cfg, const ParallelLayout& l);

}  // namespace dsv4
