// ModelBackend over the device-resident CudaModel: a sequence's state is allocated on the GPU
// for its whole capacity at creation; snapshots are device copies trimmed to their position.
// With mtp, sequences also carry the MTP module's device state and feed (model/mtp_feed.h) and
// the engine can decode speculatively: draft() runs the module, verify chunks save the ring
// rows they overwrite and accept() restores those of rejected tokens.
#pragma once
#include "model/cuda/cuda_model.h"
#include "runtime/backend.h"

namespace dsv4 {

class CudaBackend final : public ModelBackend {
 public:
  explicit CudaBackend(CudaModel& model, bool mtp = false);
  const ModelConfig& config() const override { return model_->config(); }
  bool fixed_capacity() const override { return true; }
  std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) override;
  std::vector<float> forward(std::span<const BackendChunk> chunks) override;
  bool has_mtp() const override { return mtp_; }
  std::vector<float> draft(std::span<BackendSequence* const> seqs, std::span<const int32_t> tokens) override;
  // Rolls a sequence back to new_pos after a verify chunk (DeviceSequence::truncate), and drops
  // the MTP module's draft rows.
  void accept(BackendSequence& seq, int64_t new_pos) override;
  std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) override;
  std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) override;

 private:
  CudaModel* model_;
  bool mtp_;
};

}  // namespace dsv4
