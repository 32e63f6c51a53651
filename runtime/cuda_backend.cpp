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
  for (const auto& c : chunks) {
    DeviceSequence& seq = dev_seq(c.seq);
    // A verify chunk saves the ring rows it overwrites, so accept() can roll the rejected ones back.
    if (c.verify) seq.begin_verify(static_cast<int64_t>(c.tokens.size()), model_->stream());
    dc.push_back({&seq, c.tokens, c.verify});
  }
  std::vector<float> all = model_->forward(dc, false);  // every row of verify chunks, else the last
  const size_t V = static_cast<size_t>(model_->config().vocab_size);
  size_t in = 0, out = 0;  // rows read from `all`, rows kept (out <= in: compacted in place)
  for (const auto& c : chunks) {
    const size_t rows = c.verify ? c.tokens.size() : 1;
    if (c.verify || c.want_logits) {
      if (out != in) std::copy(all.begin() + in * V, all.begin() + (in + rows) * V, all.begin() + out * V);
      out += rows;
    }
    in += rows;
  }
  all.resize(out * V);
  return all;
}

void CudaBackend::accept(BackendSequence& seq, int64_t new_pos) { dev_seq(&seq).truncate(new_pos, model_->stream()); }

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
