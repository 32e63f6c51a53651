// Error checks for every CUDA runtime / cuBLASLt call and after every kernel launch.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

#define DSV4_CUDA_CHECK(expr)                                                                   \
  do {                                                                                          \
    cudaError_t err__ = (expr);                                                                 \
    if (err__ != cudaSuccess)                                                                   \
      ::dsv4::fail(#expr, " failed: ", cudaGetErrorString(err__), " at ", __FILE__, ":", __LINE__); \
  } while (0)

#define DSV4_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                     \
    cublasStatus_t st__ = (expr);                                                          \
    if (st__ != CUBLAS_STATUS_SUCCESS)                                                     \
      ::dsv4::fail(#expr, " failed: cublas status ", static_cast<int>(st__), " at ", __FILE__, ":", __LINE__); \
  } while (0)

// After a <<<>>> launch: catches bad configurations immediately (async faults surface at the next sync).
#define DSV4_CUDA_LAUNCH_CHECK() DSV4_CUDA_CHECK(cudaGetLastError())
