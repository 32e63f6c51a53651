// TMA tensor maps (sm_90): the descriptor a cp.async.bulk.tensor copy reads to move a box of a
// global array into shared memory (optionally into every CTA of a cluster), laid out in one of
// the wgmma swizzles on the way. Built on the host by the driver's cuTensorMapEncodeTiled (found
// through the runtime, so nothing links libcuda) and passed to a kernel by value inside a
// __grid_constant__ parameter.
#pragma once
#include <cstdint>

namespace dsv4::cuda::detail {

// CUtensorMap's size and alignment without cuda.h in every includer.
struct alignas(64) TensorMap {
  unsigned char bytes[128];
};

// rows x row_bytes bytes at base (row pitch row_bytes), read in boxes of box_rows rows x
// box_bytes bytes, written to shared memory in the 128-byte swizzle (16-byte chunk c of box row r
// at chunk c ^ (r % 8), from a 1024-byte aligned destination); rows past the last read as zeros.
// Errors name what the encoder refused (row_bytes % 16, box_bytes <= 128, base 16-byte aligned).
TensorMap byte_rows_map_sw128(const void* base, uint64_t row_bytes, uint64_t rows, uint32_t box_bytes,
                              uint32_t box_rows);

}  // namespace dsv4::cuda::detail
