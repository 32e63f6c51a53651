// Small glue kernels the device-resident model needs between the main ops.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace dsv4::cuda {

// x[i] *= a for i < n.
void scale_inplace(float* x, int64_t n, float a, cudaStream_t s);
// dst[i, :] = src[idx[i], :] for i < n (idx on the device), rows of `width` floats.
void gather_rows(const float* src, const int64_t* idx, int64_t n, int64_t width, float* dst, cudaStream_t s);
// The same from bf16 rows (bits), widened to fp32; idx null: rows 0 .. n - 1.
void gather_rows_widen(const uint16_t* src, const int64_t* idx, int64_t n, int64_t width, float* dst, cudaStream_t s);

// x[r, i, :] += b[r, :] for r < rows, i < copies: one row of `width` floats added to each of a
// row's `copies` streams (the MTP module's input: W_h·Ĥ_i + W_e·ê).
void add_row_broadcast(float* x, const float* b, int64_t rows, int64_t copies, int64_t width, cudaStream_t s);

}  // namespace dsv4::cuda
