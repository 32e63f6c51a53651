// Device-side random fills for benchmark weights at real shapes (tens of GB: generating them on
// the host and uploading would dominate a short lease). Counter-based, so reproducible.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// n values ~ N(0, std) as BF16 (bits) or F32.
void fill_normal_bf16(uint16_t* p, int64_t n, float std, uint64_t seed, cudaStream_t s);
void fill_normal_f32(float* p, int64_t n, float std, uint64_t seed, cudaStream_t s);
// n e4m3 codes of N(0, 16) values (finite; never the NaN code).
void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t s);
// n bytes of two random e2m1 nibbles each.
void fill_e2m1_pairs(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t s);
// n copies of one byte (E8M0 scales).
void fill_byte(uint8_t* p, int64_t n, uint8_t value, cudaStream_t s);

}  // namespace dsv4::cuda
