// Routed experts on the GPU: tokens grouped by expert on the device (histogram, prefix sum,
// permutation), grouped SwiGLU-expert GEMMs reading each expert's stored weights (FP4 packed
// stays FP4 in memory), weighted scatter-add into the output. Twin: model/moe.cpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/linear.h"
#include "backend/weight_view.h"

namespace dsv4::cuda {

struct ExpertSet {
  // Per routed expert: gate w1 [I, d], down w2 [d, I], up w3 [I, d] (device views).
  std::vector<WeightView> w1, w2, w3;
  int64_t d = 0, I = 0;
};

class MoeRunner {
 public:
  MoeRunner();
  ~MoeRunner();
  // out [R, d] += Σ_k weights[r,k] · expert_{experts[r,k]}(x[r]) with clamped SwiGLU (limit <= 0: none).
  // experts/weights [R, K] are device arrays (from moe_route).
  void run(const ExpertSet& set, const float* x, int64_t R, const int32_t* experts, const float* weights, int64_t K,
           float limit, float* out, Precision p, cudaStream_t s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::cuda
