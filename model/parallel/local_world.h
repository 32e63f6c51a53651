// A TP × EP world simulated in one process: one Model per rank on its shard of the weights,
// in-process communicators for its groups, one thread per rank in every forward. It computes
// exactly what the multi-process world computes, so CPU tests check sharding, collectives
// and the dispatch/combine against the single-rank model, and `dsv4 generate/serve --tp/--ep`
// can run it on the CPU.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "backend/parallel/local_communicator.h"
#include "model/model.h"
#include "model/parallel/shard_spec.h"

namespace dsv4 {

class LocalWorld {
 public:
  // Throws Error (naming the flag and config field) when the model cannot be split this way.
  LocalWorld(const ModelWeights& full, ParallelLayout layout);
  int world() const { return layout_.world(); }
  const ParallelLayout& layout() const { return layout_; }
  const ModelConfig& config() const { return cfg_; }  // the whole model's
  const Model& rank_model(int r) const { return *models_[r]; }

  // A sequence's state on every rank (each rank keeps its own replicated KV/compressor state).
  struct Sequence {
    std::vector<SequenceState> ranks;
    int64_t pos() const { return ranks.front().pos; }
    size_t bytes() const;
  };
  Sequence new_sequence() const;

  struct Chunk {
    Sequence* seq;
    std::span<const int32_t> tokens;
    bool every_row = false;
  };
  // Same contract as Model::forward. Every rank computes the logits; they must agree bitwise
  // (an Error otherwise: the ranks' replicated streams diverged).
  std::vector<float> forward(std::span<const Chunk> chunks, bool all_logits);

 private:
  ParallelLayout layout_;
  ModelConfig cfg_;
  std::vector<std::shared_ptr<LocalGroup>> groups_;
  std::vector<std::unique_ptr<LocalCommunicator>> comms_;
  std::vector<std::unique_ptr<Model>> models_;
};

}  // namespace dsv4
