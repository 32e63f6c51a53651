// Median time of CUDA work by events, as bench_linear, bench_ops and bench_hops measure it: `warm`
// calls first (then a device sync), then `reps` calls each between two events recorded on the
// stream the work runs on — events on another stream time nothing (a non-blocking stream does not
// order with the legacy default one). call(i) gets the call's index (warm-ups first).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/check.h"

namespace dsv4::bench {

template <class F>
double median_event_ms(F call, int warm, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t a, b;
  DSV4_CUDA_CHECK(cudaEventCreate(&a));
  DSV4_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) call(i);
  DSV4_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    DSV4_CUDA_CHECK(cudaEventRecord(a, stream));
    call(warm + i);
    DSV4_CUDA_CHECK(cudaEventRecord(b, stream));
    DSV4_CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace dsv4::bench
