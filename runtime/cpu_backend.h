// ModelBackend over the CPU reference Model: SequenceState grows as tokens arrive, a snapshot
// is a plain copy of it.
#pragma once
#include "model/model.h"
#include "runtime/backend.h"

namespace dsv4 {

class CpuBackend final : public ModelBackend {
 public:
  explicit CpuBackend(Model& model) : model_(&model) {}
  const ModelConfig& config() const override { return model_->config(); }
  bool fixed_capacity() const override { return false; }
  std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) override;
  std::vector<float> forward(std::span<const BackendChunk> chunks) override;
  std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) override;
  std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) override;

  // The state behind a sequence of this backend (tests compare its bytes with the budget).
  static const SequenceState& state_of(const BackendSequence& seq);

 private:
  Model* model_;
};

}  // namespace dsv4
