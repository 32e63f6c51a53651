// What one weight-streaming kernel can reach at the decode step's sizes, with nothing but the
// reads: the FP8 GEMVs read 32 MB in ~17.8 µs (ncu, 59% of DRAM peak, bench/NOTES.md step 23) and
// the batch-1 floor counts every byte at the large-copy bandwidth. A kernel of S bytes pays a ramp
// (the first loads' latency) and a tail (the last CTAs) that a large copy spreads over gigabytes;
// this bench measures that ideal per size, so the GEMVs' ratios can be split into what any reader
// pays and what is theirs. Each kernel reads its own S-byte window of a buffer larger than L2 (so
// nothing hits L2 from the kernel before), 16 of them replayed as one CUDA graph (no launch gaps),
// two ways: full dependencies between kernels, and as programmatic dependents (trigger at the
// start, wait before the reads: the decode chain's form, pdl.cuh) whose CTAs may launch early.
// Two access patterns: grid-stride (a copy's) and one contiguous chunk per CTA (a GEMV's rows).
// Usage: bench_stream (prints µs and TB/s per size, pattern, CTAs per SM and dependency form).
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
constexpr int kUnroll = 4;    // 16-byte loads in flight per thread per iteration
constexpr int kKernels = 16;  // per graph
constexpr int64_t kBuffer = int64_t{2} << 30;

// Reads n16 16-byte words at p; a result no one sees keeps the loads live. chunked: CTA b reads
// words [b, b + 1) x n16 / grid, else a grid-stride loop.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4* __restrict__ p, int64_t n16, bool chunked,
                                                        bool pdl, unsigned* sink) {
  if (pdl) {
    pdl_trigger();
    pdl_wait();
  }
  int64_t begin = threadIdx.x, end = n16, step = kThreads;
  if (chunked) {
    begin += n16 * blockIdx.x / gridDim.x;
    end = n16 * (blockIdx.x + 1) / gridDim.x;
  } else {
    begin += static_cast<int64_t>(blockIdx.x) * kThreads;
    step = static_cast<int64_t>(gridDim.x) * kThreads;
  }
  unsigned acc = 0;
  int64_t i = begin;
  for (; i + (kUnroll - 1) * step < end; i += kUnroll * step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(p + i + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < end; i += step) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// µs per kernel of kKernels reads of `bytes` each (consecutive windows of the buffer), as one graph.
double per_kernel_us(const uint8_t* buf, int64_t bytes, int grid, bool chunked, bool pdl, unsigned* sink,
                     cudaStream_t s) {
  cudaGraph_t graph;
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kKernels; ++k) {
    const auto* p = reinterpret_cast<const uint4*>(buf + (k * bytes) % (kBuffer - bytes) / 256 * 256);
    if (pdl)
      launch_dependent(read_kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), 0, s, p, bytes / 16, chunked,
                       true, sink);
    else
      read_kernel<<<static_cast<unsigned>(grid), kThreads, 0, s>>>(p, bytes / 16, chunked, false, sink);
  }
  DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = dsv4::bench::median_event_ms([&](int) { DSV4_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 2, 15, s);
  DSV4_CUDA_CHECK(cudaGraphExecDestroy(exec));
  DSV4_CUDA_CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / kKernels;
}

}  // namespace

int main() {
  int dev = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  DSV4_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const int sms = sm_count();
  uint8_t* buf = nullptr;
  unsigned* sink = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&buf, kBuffer));
  DSV4_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  DSV4_CUDA_CHECK(cudaMemset(buf, 1, kBuffer));
  cudaStream_t s;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("bench_stream: %s, %d SMs, L2 %d MB, %d kernels a graph, %d threads a CTA\n", prop.name, sms,
              prop.l2CacheSize >> 20, kKernels, kThreads);
  // The large-read reference: 1 GB grid-stride at 8 CTAs per SM.
  const double big = per_kernel_us(buf, int64_t{1} << 30, 8 * sms, false, false, sink, s);
  const double peak = (double{1 << 30} / (big * 1e-6)) / 1e12;
  std::printf("read 1024 MB stride 8/SM plain: %.1f us, %.2f TB/s (the reference below)\n", big, peak);
  for (const int mb : {8, 16, 27, 32, 54}) {
    const int64_t bytes = int64_t{mb} << 20;
    for (const bool chunked : {false, true})
      for (const int per_sm : {1, 2, 3, 4, 8})
        for (const bool pdl : {false, true}) {
          const double us = per_kernel_us(buf, bytes, per_sm * sms, chunked, pdl, sink, s);
          const double tbs = (static_cast<double>(bytes) / (us * 1e-6)) / 1e12;
          std::printf("read %d MB %s %d/SM %s: %.2f us, %.2f TB/s, %.2fx the reference's time\n", mb,
                      chunked ? "chunked" : "stride", per_sm, pdl ? "pdl" : "plain", us, tbs, peak / tbs);
        }
  }
  DSV4_CUDA_CHECK(cudaStreamDestroy(s));
  DSV4_CUDA_CHECK(cudaFree(sink));
  DSV4_CUDA_CHECK(cudaFree(buf));
  return 0;
}
