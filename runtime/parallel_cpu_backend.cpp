#include "runtime/parallel_cpu_backend.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

void check_parallel_flags(const ParallelLayout& l, const std::string& device, int64_t speculative_tokens) {
  check_layout(l);
  DSV4_CHECK(device != "cuda",
             "--tp/--ep with --device cuda: not supported yet (the CUDA model has no tensor/expert-parallel forward; "
             "the NCCL communicator is built with -DDSV4_NCCL=ON). --device cpu runs the ranks simulated in-process");
  DSV4_CHECK(device == "cpu", "--device ", device, ": unsupported (cpu or cuda)");
  DSV4_CHECK(speculative_tokens == 0, "--speculative-tokens with --tp/--ep: not supported (the MTP block is not sharded)");
}

namespace {

struct WorldSequence final : BackendSequence {
  LocalWorld::Sequence st;
  int64_t pos() const override { return st.pos(); }
  size_t bytes() const override { return st.bytes(); }
};

struct WorldSnapshot final : BackendSnapshot {
  LocalWorld::Sequence st;
  int64_t pos() const override { return st.pos(); }
  size_t bytes() const override { return st.bytes(); }
};

WorldSequence& world_seq(BackendSequence* s) {
  auto* w = dynamic_cast<WorldSequence*>(s);
  DSV4_CHECK(w, "ParallelCpuBackend: sequence of another backend");
  return *w;
}

}  // namespace

std::unique_ptr<BackendSequence> ParallelCpuBackend::new_sequence(int64_t) {
  auto s = std::make_unique<WorldSequence>();
  s->st = world_->new_sequence();
  return s;
}

std::vector<float> ParallelCpuBackend::forward(std::span<const BackendChunk> chunks) {
  std::vector<LocalWorld::Chunk> wc;
  std::vector<size_t> keep;  // chunks whose last-row logits the engine wants
  for (size_t i = 0; i < chunks.size(); ++i) {
    DSV4_CHECK(!chunks[i].verify, "ParallelCpuBackend: speculative verification needs the MTP module, "
               "which is not sharded (drop --speculative-tokens with --tp/--ep)");
    wc.push_back({&world_seq(chunks[i].seq).st, chunks[i].tokens, false});
    if (chunks[i].want_logits) keep.push_back(i);
  }
  std::vector<float> all = world_->forward(wc, false);  // one row per chunk
  const size_t V = static_cast<size_t>(config().vocab_size);
  std::vector<float> out(keep.size() * V);
  for (size_t j = 0; j < keep.size(); ++j) std::copy_n(all.begin() + keep[j] * V, V, out.begin() + j * V);
  return out;
}

std::unique_ptr<BackendSnapshot> ParallelCpuBackend::snapshot(const BackendSequence& seq) {
  const auto* w = dynamic_cast<const WorldSequence*>(&seq);
  DSV4_CHECK(w, "ParallelCpuBackend: sequence of another backend");
  auto s = std::make_unique<WorldSnapshot>();
  s->st = w->st;
  return s;
}

std::unique_ptr<BackendSequence> ParallelCpuBackend::restore(const BackendSnapshot& snap, int64_t) {
  const auto* w = dynamic_cast<const WorldSnapshot*>(&snap);
  DSV4_CHECK(w, "ParallelCpuBackend: snapshot of another backend");
  auto s = std::make_unique<WorldSequence>();
  s->st = w->st;
  return s;
}

}  // namespace dsv4
