#include "backend/cpu/linear.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

namespace {
float scale_at(const WeightView& w, int64_t r, int64_t c) {
  const int64_t i = r * w.scale_cols + c;
  if (w.scale_dtype == DType::F32) {
    float f;
    std::memcpy(&f, w.scale + i * 4, 4);
    return f;
  }
  return e8m0_to_f32(w.scale[i]);
}

float dense_at(DType t, const uint8_t* p, int64_t i) {
  switch (t) {
    case DType::F32: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case DType::BF16: {
      uint16_t b;
      std::memcpy(&b, p + i * 2, 2);
      return bf16_to_f32(b);
    }
    default:
      fail("linear: unsupported dense dtype ", dtype_name(t));
  }
}
}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums: vectorisable without -ffast-math, and more accurate.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  float tail = 0.f;
  for (; k < n; ++k) tail += a[k] * b[k];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void dequant_row(const WeightView& w, int64_t o, float* dst) {
  switch (w.format) {
    case WeightFormat::Dense:
      if (w.dtype == DType::F32) {
        std::memcpy(dst, w.data + o * w.in * 4, w.in * 4);
      } else {
        for (int64_t k = 0; k < w.in; ++k) dst[k] = dense_at(w.dtype, w.data, o * w.in + k);
      }
      return;
    case WeightFormat::FP8Block: {
      const uint8_t* row = w.data + o * w.in;
      for (int64_t kb = 0; kb * 128 < w.in; ++kb) {
        const float s = scale_at(w, o / 128, kb);
        const int64_t end = std::min<int64_t>(w.in, (kb + 1) * 128);
        for (int64_t k = kb * 128; k < end; ++k) dst[k] = e4m3_to_f32(row[k]) * s;
      }
      return;
    }
    case WeightFormat::FP4Group32: {
      const uint8_t* row = w.data + o * (w.in / 2);
      for (int64_t kb = 0; kb * 32 < w.in; ++kb) {
        const float s = scale_at(w, o, kb);
        for (int64_t k = kb * 32; k < (kb + 1) * 32; ++k) dst[k] = e2m1_packed_get(row, k) * s;
      }
      return;
    }
  }
}

void linear(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin, int64_t row_end,
            int64_t ldx, int64_t ldy) {
  DSV4_CHECK(row_begin >= 0 && row_end <= w.out && row_begin <= row_end, "linear: bad row range");
  const int64_t n_out = row_end - row_begin;
  parallel_for(static_cast<size_t>(n_out), [&](size_t b, size_t e) {
    std::vector<float> wrow(w.in);
    for (size_t oi = b; oi < e; ++oi) {
      dequant_row(w, row_begin + static_cast<int64_t>(oi), wrow.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        y[r * ldy + static_cast<int64_t>(oi)] = dot(wrow.data(), xr, w.in);
      }
    }
  }, 4);
}

std::vector<float> dequant_all(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.out * w.in));
  for (int64_t o = 0; o < w.out; ++o) dequant_row(w, o, out.data() + o * w.in);
  return out;
}

}  // namespace dsv4::cpu
