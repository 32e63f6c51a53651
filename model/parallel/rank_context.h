// What a rank's forward needs to know about the others: its place (ShardSpec) and the
// communicators of its TP and EP groups (null where that degree is 1). A Model built without
// one is the plain single-rank model.
#pragma once
#include "backend/parallel/communicator.h"
#include "model/parallel/shard_spec.h"

namespace dsv4 {

struct RankContext {
  ShardSpec spec;
  Communicator* tp = nullptr;
  Communicator* ep = nullptr;
  bool active() const { return tp != nullptr || ep != nullptr; }
};

}  // namespace dsv4
