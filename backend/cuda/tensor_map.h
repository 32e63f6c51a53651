// TMA tensor maps (sm_90): the descriptor a cp.async.bulk.tensor copy reads to move a box of a
// global array into shared memory (optionally into every CTA of a cluster), laid out in one of
// the wgmma swizzles on the way. Built on the host by the driver's cuTensorMapEncodeTiled (found
// through the runtime, so nothing links libcuda) and passed to a kernel by value inside a
// __grid_constant__ parameter.
#pragma once
#include <cuda_runtime.h>

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

// The self-check of the clustered TMA path (tma_probe.cu): one cluster of `cluster` (2 or 4) CTAs
// loads `boxes` boxes of 32 rows x 128 bytes at (x bytes, row0 + 32 b) of src's map, box b by CTA
// b % cluster, multicast to all; CTA r writes what landed in its shared memory (the swizzled
// layout, boxes x 4 KB) to out + r x boxes x 4 KB. Needs an sm_90 device and an arch-90a build.
void tma_multicast_probe(const uint8_t* src, int64_t row_bytes, int64_t rows, int x, int row0, int boxes, int cluster,
                         uint8_t* out, cudaStream_t s);

}  // namespace dsv4::cuda::detail
