// ModelBackend over the CPU reference Model: SequenceState grows as tokens arrive, a snapshot
// is a plain copy of it. With mtp, sequences also carry the MTP module's state and the engine
// can decode speculatively (model/speculative.h).
#pragma once
#include "model/model.h"
#include "model/speculative.h"
#include "runtime/backend.h"

namespace dsv4 {

class CpuBackend final : public ModelBackend {
 public:
  explicit CpuBackend(Model& model, bool mtp = false) : model_(&model), spec_(model, mtp) {}
  const ModelConfig& config() const override { return model_->config(); }
  bool fixed_capacity() const override { return false; }
  std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) override;
  std::vector<float> forward(std::span<const BackendChunk> chunks) override;
  std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) override;
  std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) override;
  bool has_mtp() const override { return spec_.has_mtp(); }
  std::vector<float> draft(std::span<BackendSequence* const> seqs, std::span<const int32_t> tokens) override;
  void accept(BackendSequence& seq, int64_t new_pos) override;

  // The state behind a sequence of this backend (tests compare its bytes with the budget).
  static const SequenceState& state_of(const BackendSequence& seq);

 private:
  Model* model_;
  SpecModel spec_;
};

}  // namespace dsv4
