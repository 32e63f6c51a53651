// Random stored weights for GPU linear/MoE tests: host bytes in every WeightView format, a host
// view for the CPU twin and a device copy with its view, plus the demo's FP8 activation
// quantisation on the host (the reference for the fast paths).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/weight_view.h"
#include "core/dtype.h"
#include "tests/cuda/gpu_test.h"

namespace dsv4::test {

enum class Kind { F32, BF16, FP8, FP8_F32SCALE, FP4 };

inline std::string kind_name(Kind k) {
  switch (k) {
    case Kind::F32: return "f32";
    case Kind::BF16: return "bf16";
    case Kind::FP8: return "fp8";
    case Kind::FP8_F32SCALE: return "fp8-f32scale";
    default: return "fp4";
  }
}

struct TestWeight {
  std::vector<uint8_t> data, scale;
  WeightView host, dev;
  cuda::DeviceBuffer d_data, d_scale;
};

// Values are O(1) per element after scaling, so outputs are O(sqrt(in)).
inline TestWeight make_weight(Kind kind, int64_t out, int64_t in) {
  TestWeight t;
  WeightView& v = t.host;
  v.out = out;
  v.in = in;
  std::uniform_int_distribution<int> exp_d(-3, 1), byte_d(0, 255);
  const std::vector<float> r = randn(static_cast<size_t>(out * in));
  switch (kind) {
    case Kind::F32:
      v.format = WeightFormat::Dense;
      v.dtype = DType::F32;
      t.data.resize(r.size() * 4);
      std::memcpy(t.data.data(), r.data(), t.data.size());
      break;
    case Kind::BF16: {
      v.format = WeightFormat::Dense;
      v.dtype = DType::BF16;
      t.data.resize(r.size() * 2);
      for (size_t i = 0; i < r.size(); ++i) {
        const uint16_t b = f32_to_bf16(r[i]);
        std::memcpy(t.data.data() + 2 * i, &b, 2);
      }
      break;
    }
    case Kind::FP8:
    case Kind::FP8_F32SCALE: {
      v.format = WeightFormat::FP8Block;
      v.dtype = DType::F8_E4M3;
      v.scale_cols = (in + 127) / 128;
      const int64_t sb = (out + 127) / 128 * v.scale_cols;
      const bool f32 = kind == Kind::FP8_F32SCALE;
      v.scale_dtype = f32 ? DType::F32 : DType::F8_E8M0;
      t.scale.resize(static_cast<size_t>(sb * (f32 ? 4 : 1)));
      for (int64_t i = 0; i < sb; ++i) {
        const int e = exp_d(rng()) - 5;  // codes are ~N(0, 32^2): scales ~2^-5
        if (f32) {
          const float s = std::ldexp(1.0f, e);
          std::memcpy(t.scale.data() + 4 * i, &s, 4);
        } else {
          t.scale[i] = static_cast<uint8_t>(127 + e);
        }
      }
      t.data.resize(r.size());
      for (size_t i = 0; i < r.size(); ++i) t.data[i] = f32_to_e4m3(std::clamp(r[i] * 32.f, -448.f, 448.f));
      break;
    }
    case Kind::FP4: {
      v.format = WeightFormat::FP4Group32;
      v.dtype = DType::U8;
      v.scale_cols = in / 32;
      t.scale.resize(static_cast<size_t>(out * v.scale_cols));
      for (auto& s : t.scale) s = static_cast<uint8_t>(127 + exp_d(rng()) - 1);
      t.data.resize(static_cast<size_t>(out * in / 2));
      for (auto& b : t.data) b = static_cast<uint8_t>(byte_d(rng()));
      break;
    }
  }
  t.d_data = cuda::to_device(t.data);
  if (!t.scale.empty()) t.d_scale = cuda::to_device(t.scale);
  v.data = t.data.data();
  v.scale = t.scale.empty() ? nullptr : t.scale.data();
  t.dev = v;
  t.dev.data = t.d_data.as<uint8_t>();
  t.dev.scale = t.scale.empty() ? nullptr : t.d_scale.as<uint8_t>();
  return t;
}

// Official demo: per row, per 128-channel block, s = 2^ceil(log2(max(amax, 1e-4)/448)) (exact
// ceil from the fp32 bits, as the kernel), x <- e4m3(clamp(x/s, ±448)) * s.
inline std::vector<float> fake_quant_fp8(const std::vector<float>& x, int64_t rows, int64_t in, int64_t ldx) {
  std::vector<float> y(static_cast<size_t>(rows * in));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k0 = 0; k0 < in; k0 += 128) {
      const int64_t k1 = std::min(in, k0 + 128);
      float amax = 0;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(x[r * ldx + k]));
      const float t = std::max(amax, 1e-4f) / 448.0f;
      uint32_t bits;
      std::memcpy(&bits, &t, 4);
      int e = static_cast<int>((bits >> 23) & 0xFF) - 127;
      if (bits & 0x7FFFFF) ++e;
      const float s = std::ldexp(1.0f, e);
      for (int64_t k = k0; k < k1; ++k)
        y[r * in + k] = e4m3_to_f32(f32_to_e4m3(std::clamp(x[r * ldx + k] / s, -448.f, 448.f))) * s;
    }
  return y;
}

}  // namespace dsv4::test
