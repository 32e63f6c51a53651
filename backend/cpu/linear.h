// CPU reference linear: y[r, o] = sum_k W[o, k] x[r, k] in fp32 on weights dequantised row by
// row on the fly (FP8/FP4 stay as stored in memory).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/weight_view.h"

namespace dsv4::cpu {

float dot(const float* a, const float* b, int64_t n);

// Dequantises row `o` of w into dst[0..in).
void dequant_row(const WeightView& w, int64_t o, float* dst);

// y [rows, row_end-row_begin] = x [rows, in] · W[row_begin:row_end]^T. ldx/ldy = row strides.
void linear(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
            int64_t ldx, int64_t ldy);

inline void linear(const WeightView& w, const float* x, int64_t rows, float* y) {
  linear(w, x, rows, y, 0, w.out, w.in, w.out);
}

// Whole matrix dequantised to fp32 (tests, small matrices).
std::vector<float> dequant_all(const WeightView& w);

}  // namespace dsv4::cpu
