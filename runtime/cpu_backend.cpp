#include "runtime/cpu_backend.h"

#include "core/error.h"

namespace dsv4 {

namespace {

struct CpuSequence final : BackendSequence {
  SequenceState st;
  int64_t pos() const override { return st.pos; }
  size_t bytes() const override { return st.bytes(); }
};

struct CpuSnapshot final : BackendSnapshot {
  SequenceState st;
  int64_t pos() const override { return st.pos; }
  size_t bytes() const override { return st.bytes(); }
};

CpuSequence& cpu_seq(BackendSequence* s) {
  auto* c = dynamic_cast<CpuSequence*>(s);
  DSV4_CHECK(c, "CpuBackend: sequence of another backend");
  return *c;
}

}  // namespace

std::unique_ptr<BackendSequence> CpuBackend::new_sequence(int64_t) {
  auto s = std::make_unique<CpuSequence>();
  s->st = model_->new_sequence();
  return s;
}

std::vector<float> CpuBackend::forward(std::span<const BackendChunk> chunks) {
  std::vector<SequenceChunk> mc;
  mc.reserve(chunks.size());
  for (const auto& c : chunks) mc.push_back({&cpu_seq(c.seq).st, c.tokens});
  std::vector<float> all = model_->forward(mc, false);  // one row per chunk
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

std::unique_ptr<BackendSnapshot> CpuBackend::snapshot(const BackendSequence& seq) {
  auto s = std::make_unique<CpuSnapshot>();
  s->st = state_of(seq);
  return s;
}

std::unique_ptr<BackendSequence> CpuBackend::restore(const BackendSnapshot& snap, int64_t) {
  const auto* c = dynamic_cast<const CpuSnapshot*>(&snap);
  DSV4_CHECK(c, "CpuBackend: snapshot of another backend");
  auto s = std::make_unique<CpuSequence>();
  s->st = c->st;
  return s;
}

const SequenceState& CpuBackend::state_of(const BackendSequence& seq) {
  const auto* c = dynamic_cast<const CpuSequence*>(&seq);
  DSV4_CHECK(c, "CpuBackend: sequence of another backend");
  return c->st;
}

}  // namespace dsv4
