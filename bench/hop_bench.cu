// The fixed cost of one dependent hop in the decode step's kernel chain, against what a persistent
// kernel would pay for the same hand-off (bench/NOTES.md step 22: a batch-1 layer is ~17
// dependent kernels, ~160 µs on the H200 against ~55 µs of weight bytes). Each hop is a trivial
// cross-CTA dependency: CTA b writes v[h % 2][b] = v[(h + 1) % 2][(b + 1) % G] + 1, so every hop
// reads what another CTA wrote in the hop before. Three forms of H hops over G CTAs:
//  - plain: H kernels on a stream, replayed as one CUDA graph (a full dependency per hop);
//  - pdl: the same as programmatic dependents (trigger at the start, wait before the read: the
//    decode chain's form, pdl.cuh);
//  - persistent: one cooperative kernel, a grid barrier per hop (an arrival counter in global
//    memory) — about what a persistent decode kernel's task hand-offs would cost.
// Every form's result is checked (each entry ends at H), so a broken barrier cannot pass as fast.
// Usage: bench_hops (prints µs per hop at G = SMs and 2 x SMs).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"
#include "bench/event_timing.h"

using namespace dsv4::cuda;
using namespace dsv4::cuda::detail;

namespace {

constexpr int kThreads = 256;
constexpr int kHops = 256;
constexpr int kReps = 15;

__device__ __forceinline__ void hop(int* v, int G, int h) {
  const int b = blockIdx.x;
  // __ldcg: from L2, not a line this SM's L1 kept from two hops before (the persistent form has
  // no kernel boundary to drop it).
  if (threadIdx.x == 0) v[(h & 1) * G + b] = __ldcg(v + ((h + 1) & 1) * G + (b + 1) % G) + 1;
}

__global__ void hop_kernel(int* v, int G, int h) {
  hop(v, G, h);
}

__global__ void hop_pdl_kernel(int* v, int G, int h) {
  pdl_trigger();
  pdl_wait();
  hop(v, G, h);
}

// All G CTAs resident (cooperative launch); `arrived` counts CTA arrivals over all hops.
__global__ void hop_persistent_kernel(int* v, int G, int hops, unsigned* arrived) {
  for (int h = 0; h < hops; ++h) {
    hop(v, G, h);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();  // this CTA's write before its arrival
      atomicAdd(arrived, 1u);
      const unsigned target = static_cast<unsigned>(h + 1) * static_cast<unsigned>(G);
      while (*static_cast<volatile unsigned*>(arrived) < target) {
      }
      __threadfence();  // the others' writes after their arrivals
    }
    __syncthreads();
  }
}

template <class F>
double median_ms(cudaStream_t s, F call) {
  return dsv4::bench::median_event_ms([&](int) { call(); }, 1, kReps, s);
}

// Every entry of the last hop's buffer is kHops (all start at 0): false if a hop read stale data.
bool check(const int* v, int G, cudaStream_t s) {
  std::vector<int> host(static_cast<size_t>(2 * G));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(host.data(), v, host.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
  const int* last = host.data() + ((kHops - 1) & 1) * G;
  return std::all_of(last, last + G, [](int x) { return x == kHops; });
}

// The chain of kHops kernels (pdl or plain) after a reset of v, as one graph.
cudaGraphExec_t chain_graph(int* v, int G, bool pdl, cudaStream_t s) {
  cudaGraph_t g;
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  DSV4_CUDA_CHECK(cudaMemsetAsync(v, 0, 2 * G * sizeof(int), s));
  for (int h = 0; h < kHops; ++h) {
    if (pdl)
      launch_dependent(hop_pdl_kernel, dim3(G), dim3(kThreads), 0, s, v, G, h);
    else
      hop_kernel<<<G, kThreads, 0, s>>>(v, G, h);
  }
  DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  DSV4_CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}

void run(int G, cudaStream_t s) {
  int* v;
  unsigned* arrived;
  DSV4_CUDA_CHECK(cudaMalloc(&v, 2 * G * sizeof(int)));
  DSV4_CUDA_CHECK(cudaMalloc(&arrived, sizeof(unsigned)));
  for (bool pdl : {false, true}) {
    cudaGraphExec_t e = chain_graph(v, G, pdl, s);
    const double ms = median_ms(s, [&] { DSV4_CUDA_CHECK(cudaGraphLaunch(e, s)); });
    const bool ok = check(v, G, s);
    std::printf("%-10s G %4d: %7.3f us per hop (%d hops in %.3f ms)%s\n", pdl ? "pdl" : "plain", G,
                ms * 1e3 / kHops, kHops, ms, ok ? "" : "  WRONG RESULT");
    DSV4_CUDA_CHECK(cudaGraphExecDestroy(e));
  }
  int per_sm = 0;
  DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, hop_persistent_kernel, kThreads, 0));
  if (per_sm * sm_count() < G) {
    std::printf("persistent G %4d: not co-resident (%d per SM)\n", G, per_sm);
  } else {
    int hops = kHops;
    void* args[] = {&v, &G, &hops, &arrived};
    const double ms = median_ms(s, [&] {
      DSV4_CUDA_CHECK(cudaMemsetAsync(v, 0, 2 * G * sizeof(int), s));
      DSV4_CUDA_CHECK(cudaMemsetAsync(arrived, 0, sizeof(unsigned), s));
      DSV4_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(hop_persistent_kernel), dim3(G),
                                                  dim3(kThreads), args, 0, s));
    });
    const bool ok = check(v, G, s);
    std::printf("%-10s G %4d: %7.3f us per hop (%d hops in %.3f ms, with the launch)%s\n", "persistent", G,
                ms * 1e3 / kHops, kHops, ms, ok ? "" : "  WRONG RESULT");
  }
  DSV4_CUDA_CHECK(cudaFree(v));
  DSV4_CUDA_CHECK(cudaFree(arrived));
}

}  // namespace

int main() {
  if (!available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaStream_t s;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int G : {sm_count(), 2 * sm_count()}) run(G, s);
  DSV4_CUDA_CHECK(cudaStreamDestroy(s));
  return 0;
}
