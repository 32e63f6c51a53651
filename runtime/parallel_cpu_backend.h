// ModelBackend over a LocalWorld: the serving engine drives a TP × EP world simulated in one
// process exactly as it drives the single-rank CpuBackend (`dsv4 serve --tp N --ep M` on the
// CPU). Sequences hold every rank's state; a snapshot copies all of them. No MTP: the MTP
// block is not sharded (has_mtp() is false, so the engine never drafts).
#pragma once
#include <string>

#include "model/parallel/local_world.h"
#include "runtime/backend.h"

namespace dsv4 {

inline bool parallel_requested(const ParallelLayout& l) { return l.tp != 1 || l.ep != 1; }

// `--tp/--ep` against the other flags (generate and serve): throws Error naming what is
// unsupported (CUDA: no TP/EP forward in the CUDA model yet; MTP speculative decoding).
void check_parallel_flags(const ParallelLayout& l, const std::string& device, int64_t speculative_tokens);

class ParallelCpuBackend final : public ModelBackend {
 public:
  explicit ParallelCpuBackend(LocalWorld& world) : world_(&world) {}
  const ModelConfig& config() const override { return world_->config(); }
  bool fixed_capacity() const override { return false; }
  std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) override;
  std::vector<float> forward(std::span<const BackendChunk> chunks) override;
  std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) override;
  std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) override;

 private:
  LocalWorld* world_;
};

}  // namespace dsv4
