#include "backend/cuda/tensor_map.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>

#include "backend/cuda/check.h"

namespace dsv4::cuda::detail {
namespace {

// The copy instructions need the map 64-byte aligned (the driver's type asks for 128 on the host).
static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) >= 64);

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    DSV4_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    DSV4_CHECK(found == cudaDriverEntryPointSuccess && p, "tensor maps: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

TensorMap byte_rows_map_sw128(const void* base, uint64_t row_bytes, uint64_t rows, uint32_t box_bytes,
                              uint32_t box_rows) {
  DSV4_CHECK(row_bytes % 16 == 0 && box_bytes <= 128 && box_bytes % 16 == 0 && box_rows >= 1 && box_rows <= 256 &&
                 rows >= 1 && reinterpret_cast<uintptr_t>(base) % 16 == 0,
             "byte_rows_map_sw128: unsupported layout (row bytes ", row_bytes, ", box ", box_rows, " x ", box_bytes,
             ")");
  CUtensorMap map;
  const cuuint64_t dims[2] = {row_bytes, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_bytes, box_rows};
  const cuuint32_t step[2] = {1, 1};
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, step,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  DSV4_CHECK(r == CUDA_SUCCESS, "byte_rows_map_sw128: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ")");
  TensorMap out;
  std::memcpy(out.bytes, &map, sizeof(map));
  return out;
}

}  // namespace dsv4::cuda::detail
