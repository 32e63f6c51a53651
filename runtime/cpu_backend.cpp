#include "runtime/cpu_backend.h"

#include "core/error.h"

namespace dsv4 {

namespace {

struct CpuSequence final : BackendSequence {
  SpecState st;
  int64_t pos() const override { return st.target.pos; }
  size_t bytes() const override { return st.bytes(); }
};

struct CpuSnapshot final : BackendSnapshot {
  SpecState st;
  int64_t pos() const override { return st.target.pos; }
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
  s->st = spec_.new_state();
  return s;
}

std::vector<float> CpuBackend::forward(std::span<const BackendChunk> chunks) {
  std::vector<SpecChunk> mc;
  mc.reserve(chunks.size());
  for (const auto& c : chunks) mc.push_back({&cpu_seq(c.seq).st, c.tokens, c.verify});
  std::vector<float> all = spec_.forward(mc);  // every row of verify chunks, else the last
  const size_t V = static_cast<size_t>(model_->config().vocab_size);
  size_t in = 0, out = 0;
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

std::vector<float> CpuBackend::draft(std::span<BackendSequence* const> seqs, std::span<const int32_t> tokens) {
  std::vector<SpecState*> st;
  for (BackendSequence* s : seqs) st.push_back(&cpu_seq(s).st);
  return spec_.draft(st, tokens);
}

void CpuBackend::accept(BackendSequence& seq, int64_t new_pos) { spec_.accept(cpu_seq(&seq).st, new_pos); }

std::unique_ptr<BackendSnapshot> CpuBackend::snapshot(const BackendSequence& seq) {
  const auto* c = dynamic_cast<const CpuSequence*>(&seq);
  DSV4_CHECK(c, "CpuBackend: sequence of another backend");
  auto s = std::make_unique<CpuSnapshot>();
  s->st = c->st;
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
  return c->st.target;
}

}  // namespace dsv4
