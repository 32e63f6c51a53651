#include "model/cuda/branches.h"

#include "backend/cuda/check.h"

namespace dsv4 {

Branches::Branches(cudaStream_t main) : main_(main) {
  for (int k = 0; k < kSides; ++k) {
    DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&side_[k], cudaStreamNonBlocking));
    DSV4_CUDA_CHECK(cudaEventCreateWithFlags(&fork_[k], cudaEventDisableTiming));
    DSV4_CUDA_CHECK(cudaEventCreateWithFlags(&join_[k], cudaEventDisableTiming));
  }
}

Branches::~Branches() {
  for (int k = 0; k < kSides; ++k) {
    if (side_[k]) cudaStreamSynchronize(side_[k]);
    if (fork_[k]) cudaEventDestroy(fork_[k]);
    if (join_[k]) cudaEventDestroy(join_[k]);
    if (side_[k]) cudaStreamDestroy(side_[k]);
  }
}

// A wait takes the event's state when it is enqueued, so one event per side is reused for
// every fork (and one for every join), in eager runs and in stream capture alike.
cudaStream_t Branches::fork(int k) {
  if (!on_) return main_;
  DSV4_CUDA_CHECK(cudaEventRecord(fork_[k], main_));
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(side_[k], fork_[k], 0));
  return side_[k];
}

void Branches::join(int k) {
  if (!on_) return;
  DSV4_CUDA_CHECK(cudaEventRecord(join_[k], side_[k]));
  DSV4_CUDA_CHECK(cudaStreamWaitEvent(main_, join_[k], 0));
}

}  // namespace dsv4
