// A self-check of the TMA path the clustered expert kernels rely on (tensor_map.h, cluster.cuh,
// mbarrier.cuh): one cluster loads 32-row boxes of a byte matrix by multicast TMA, each CTA its
// share, and every CTA writes back what landed in its shared memory. The tests compare that with
// the 128-byte swizzle of the source rows (zeros past the last row), so a wrong map, swizzle
// assumption, byte count or cluster hand-off shows up apart from the expert kernels' arithmetic.
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/cluster.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/mbarrier.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kBoxRows = 32, kBoxBytes = kBoxRows * 128, kMaxBoxes = 8;

template <int C>
__global__ void __launch_bounds__(128) tma_probe_kernel(const __grid_constant__ TensorMap map, int x, int row0,
                                                        int boxes, uint8_t* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  cluster_arrive();
  cluster_wait();
  const uint32_t rank = cluster_rank();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(boxes * kBoxBytes));
    for (int b = static_cast<int>(rank); b < boxes; b += C)
      tma_load_2d_multicast(smem + b * kBoxBytes, &map, x, row0 + b * kBoxRows, &bar,
                            static_cast<uint16_t>((1u << C) - 1u));
  }
  mbar_wait(&bar, 0);
  uint8_t* dst = out + static_cast<int64_t>(rank) * boxes * kBoxBytes;
  for (int i = threadIdx.x; i < boxes * kBoxBytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(smem)[i];
  cluster_arrive();  // no CTA leaves while another's copy may still write into it
  cluster_wait();
#endif
}

}  // namespace

void tma_multicast_probe(const uint8_t* src, int64_t row_bytes, int64_t rows, int x, int row0, int boxes, int cluster,
                         uint8_t* out, cudaStream_t s) {
  DSV4_CHECK(wgmma_available(), "tma_multicast_probe: needs an sm_90 device and an arch-90a build");
  DSV4_CHECK((cluster == 2 || cluster == 4) && boxes >= 1 && boxes <= kMaxBoxes,
             "tma_multicast_probe: clusters of 2 or 4, 1..", kMaxBoxes, " boxes");
  const TensorMap map = byte_rows_map_sw128(src, static_cast<uint64_t>(row_bytes), static_cast<uint64_t>(rows), 128,
                                            kBoxRows);
  const size_t smem = 1024 + static_cast<size_t>(boxes) * kBoxBytes;
  auto kernel = cluster == 4 ? tma_probe_kernel<4> : tma_probe_kernel<2>;
  DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  launch_dependent_clustered(kernel, dim3(static_cast<unsigned>(cluster)), dim3(128), smem,
                             static_cast<unsigned>(cluster), s, map, x, row0, boxes, out);
}

}  // namespace dsv4::cuda::detail
