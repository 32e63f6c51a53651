#include "runtime/cuda_backend.h"

#include <algorithm>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace dsv4 {

namespace {

struct CudaSequence final : BackendSequence {
  explicit CudaSequence(DeviceSequence s) : seq(std::move(s)) {}
  DeviceSequence seq;
  int64_t pos() const override { return seq.pos; }
  size_t bytes() const override { return seq.bytes(); }
};

struct CudaSnapshot final : BackendSnapshot {
  explicit CudaSnapshot(DeviceSequence s) : seq(std::move(s)) {}
  DeviceSequence seq;
  int64_t pos() const override { return seq.pos; }
  size_t bytes() const override { return seq.bytes(); }
};

DeviceSequence& dev_seq(BackendSequence* s) {
  auto* c = dynamic_cast<CudaSequence*>(s);
  DSV4_CHECK(c, "CudaBackend: sequence of another backend");
  return c->seq;
}

}  // namespace

std::unique_ptr<BackendSequence> CudaBackend::new_sequence(int64_t capacity) {
  return std::make_unique<CudaSequence>(model_->new_sequence(std::max<int64_t>(capacity, 1)));
}

std::vector<float> CudaBackend::forward(std::span<const BackendChunk> chunks) {
  std::vector<DeviceChunk> dc;
  dc.reserve(chunks.size());
  for (const auto& c : chunks) dc.push_back({&dev_seq(c.seq), c.tokens});
  std::vector<float> all = model_->forward(dc, false);  // one row per chunk
  const size_t V = static_cast<size_t>(model_->config().vocab_size);
  size_t k = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (!chunks[i].want_logits) continue;
    if (k != i) std::copy(all.begin() + i * V, all.begin() + (i + 1) * V, all.begin() + k * V);
    ++k;
  }
  all.resize(k * V);
  return all;
}

std::unique_ptr<BackendSnapshot> CudaBackend::snapshot(const BackendSequence& seq) {
  const auto* c = dynamic_cast<const CudaSequence*>(&seq);
  DSV4_CHECK(c, "CudaBackend: sequence of another backend");
  DeviceSequence copy = model_->new_sequence(std::max<int64_t>(c->seq.pos, 1));
  copy.copy_state_from(c->seq, model_->stream());
  DSV4_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  return std::make_unique<CudaSnapshot>(std::move(copy));
}

std::unique_ptr<BackendSequence> CudaBackend::restore(const BackendSnapshot& snap, int64_t capacity) {
  const auto* c = dynamic_cast<const CudaSnapshot*>(&snap);
  DSV4_CHECK(c, "CudaBackend: snapshot of another backend");
  DeviceSequence seq = model_->new_sequence(std::max(capacity, c->seq.pos + 1));
  seq.copy_state_from(c->seq, model_->stream());
  DSV4_CUDA_CHECK(cudaStreamSynchronize(model_->stream()));
  return std::make_unique<CudaSequence>(std::move(seq));
}

}  // namespace dsv4
