// Concurrent branches of a forward on one GPU: side streams forked from the main stream and
// joined back before their results are read. At decode sizes every kernel is latency-bound and
// fills a fraction of the GPU, so independent chains (the compressor and the indexer beside the
// query path, the shared expert beside the routed experts, the mHC gates beside the mixing) run
// side by side; a captured graph keeps them as parallel branches. Disabled, every fork returns
// the main stream and joins do nothing: the same launches in one order, the same bits.
#pragma once
#include <cuda_runtime.h>

namespace dsv4 {

class Branches {
 public:
  static constexpr int kSides = 3;
  explicit Branches(cudaStream_t main);
  ~Branches();
  Branches(const Branches&) = delete;
  Branches& operator=(const Branches&) = delete;

  void set_enabled(bool on) { on_ = on; }
  bool enabled() const { return on_; }
  // Side stream k, ordered after everything enqueued on the main stream so far (the main stream
  // itself when disabled). Forking again adds the main stream's newer work as a dependency.
  cudaStream_t fork(int k);
  // The main stream waits for everything enqueued on side k so far (nothing when disabled).
  void join(int k);
  // Side k without a fork, and its fork event, for ops that fork inside (cuda::hc_pre's gates);
  // nullptr when disabled.
  cudaStream_t side(int k) const { return on_ ? side_[k] : nullptr; }
  cudaEvent_t fork_event(int k) const { return on_ ? fork_[k] : nullptr; }

 private:
  cudaStream_t main_;
  cudaStream_t side_[kSides] = {};
  cudaEvent_t fork_[kSides] = {}, join_[kSides] = {};
  bool on_ = true;
};

}  // namespace dsv4
