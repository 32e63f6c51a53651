// Parity of the row-wise / elementwise CUDA ops with their CPU twins on fresh random inputs.
#include <array>
#include <algorithm>
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;
using test::rel_error;

struct Table {
  std::vector<uint8_t> data, scale;
  WeightView host, dev;
  DeviceBuffer d_data, d_scale;
};

Table make_table(WeightFormat f, DType t, int64_t out, int64_t in) {
  Table tb;
  WeightView& v = tb.host;
  v.format = f;
  v.dtype = t;
  v.out = out;
  v.in = in;
  const std::vector<float> x = randn(out * in);
  if (f == WeightFormat::FP8Block) {
    tb.data.resize(out * in);
    for (size_t i = 0; i < x.size(); ++i) tb.data[i] = f32_to_e4m3(x[i] * 50.f);
    v.scale_cols = (in + 127) / 128;
    v.scale_dtype = DType::F8_E8M0;
    tb.scale.resize(((out + 127) / 128) * v.scale_cols);
    for (size_t i = 0; i < tb.scale.size(); ++i) tb.scale[i] = static_cast<uint8_t>(120 + i % 7);
  } else if (t == DType::BF16) {
    tb.data.resize(out * in * 2);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t b = f32_to_bf16(x[i]);
      std::memcpy(tb.data.data() + 2 * i, &b, 2);
    }
  } else {
    tb.data.resize(out * in * 4);
    std::memcpy(tb.data.data(), x.data(), tb.data.size());
  }
  v.data = tb.data.data();
  v.scale = tb.scale.empty() ? nullptr : tb.scale.data();
  tb.d_data = to_device(tb.data);
  if (!tb.scale.empty()) tb.d_scale = to_device(tb.scale);
  tb.dev = v;
  tb.dev.data = tb.d_data.as<uint8_t>();
  tb.dev.scale = tb.scale.empty() ? nullptr : tb.d_scale.as<uint8_t>();
  return tb;
}

TEST(CudaOpsNorm, EmbedMatchesDequantRow) {
  DSV4_REQUIRE_GPU();
  const int64_t V = 300, d = 200, rows = 7, copies = 4;
  for (auto [f, t] : {std::pair{WeightFormat::Dense, DType::F32}, std::pair{WeightFormat::Dense, DType::BF16},
                      std::pair{WeightFormat::FP8Block, DType::F8_E4M3}}) {
    Table tb = make_table(f, t, V, d);
    std::vector<int32_t> tok(rows);
    for (auto& x : tok) x = static_cast<int32_t>(test::rng()() % V);
    tok[0] = V - 1;
    DeviceBuffer d_tok = to_device(tok), d_X = poisoned<float>(rows * copies * d);
    cuda::embed(tb.dev, d_tok.as<int32_t>(), rows, copies, d_X.as<float>(), nullptr);
    std::vector<float> ref(rows * copies * d), row(d);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::dequant_row(tb.host, tok[r], row.data());
      for (int64_t c = 0; c < copies; ++c) std::copy(row.begin(), row.end(), ref.begin() + (r * copies + c) * d);
    }
    EXPECT_EQ(rel_error(to_host<float>(d_X, ref.size()), ref), 0.0) << "format " << int(f) << " dtype " << int(t);
  }
}

TEST(CudaOpsNorm, RmsNormMatchesCpu) {
  DSV4_REQUIRE_GPU();
  for (int64_t n : {4096, 512, 130, 7}) {
    const int64_t rows = 37;
    const std::vector<float> x = randn(rows * n, 3.0f), g = randn(n);
    for (bool weighted : {true, false}) {
      std::vector<float> ref(x.size());
      cpu::rms_norm(x.data(), weighted ? g.data() : nullptr, ref.data(), rows, n, 1e-6f);
      DeviceBuffer dx = to_device(x), dg = to_device(g), dy = poisoned<float>(x.size());
      cuda::rms_norm(dx.as<float>(), weighted ? dg.as<float>() : nullptr, dy.as<float>(), rows, n, 1e-6f, nullptr);
      EXPECT_LE(rel_error(to_host<float>(dy, x.size()), ref), 1e-6) << "n " << n;
      cuda::rms_norm(dx.as<float>(), weighted ? dg.as<float>() : nullptr, dx.as<float>(), rows, n, 1e-6f, nullptr);
      EXPECT_LE(rel_error(to_host<float>(dx, x.size()), ref), 1e-6) << "in place, n " << n;
    }
  }
}

TEST(CudaOpsNorm, RopeMatchesCpuAtLongPositions) {
  DSV4_REQUIRE_GPU();
  const int64_t rows = 19, heads = 5, len = 128, pairs = 32;
  const std::vector<float> f = test::inv_freqs(pairs);
  std::vector<int64_t> pos = test::rand_positions(rows, 1 << 20);
  pos[0] = 0;
  for (bool inverse : {false, true}) {
    std::vector<float> x = randn(rows * heads * len), ref = x;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < heads; ++h)
        cpu::rope_inplace(ref.data() + (r * heads + h) * len, len, f.data(), pairs, pos[r], inverse);
    DeviceBuffer dx = to_device(x), df = to_device(f), dp = to_device(pos);
    cuda::rope(dx.as<float>(), rows, heads, len, df.as<float>(), pairs, dp.as<int64_t>(), inverse, nullptr);
    EXPECT_LE(rel_error(to_host<float>(dx, x.size()), ref), 1e-6) << "inverse " << inverse;
  }
}

// The fused q-norm / kv-norm + RoPE against its unfused CPU twin (rms_norm, then rope_inplace).
TEST(CudaOpsNorm, RmsNormRopeMatchesCpu) {
  DSV4_REQUIRE_GPU();
  for (auto [heads, len, pairs] : {std::array<int64_t, 3>{8, 512, 32}, {1, 512, 32}, {3, 128, 6}, {2, 70, 5}, {2, 1032, 16}}) {
    const int64_t rows = 11;
    const std::vector<float> f = test::inv_freqs(pairs), g = randn(len);
    std::vector<int64_t> pos = test::rand_positions(rows, 1 << 20);
    for (bool weighted : {true, false}) {
      const std::vector<float> x = randn(rows * heads * len, 3.0f);
      std::vector<float> ref(x.size());
      cpu::rms_norm(x.data(), weighted ? g.data() : nullptr, ref.data(), rows * heads, len, 1e-6f);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < heads; ++h)
          cpu::rope_inplace(ref.data() + (r * heads + h) * len, len, f.data(), pairs, pos[r], false);
      DeviceBuffer dx = to_device(x), dg = to_device(g), df = to_device(f), dp = to_device(pos);
      cuda::rms_norm_rope(dx.as<float>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                          df.as<float>(), pairs, dp.as<int64_t>(), nullptr);
      EXPECT_LE(rel_error(to_host<float>(dx, x.size()), ref), 1e-6)
          << "heads " << heads << " len " << len << " pairs " << pairs << " weighted " << weighted;
      // bf16 output (a model storing bf16 keys): the same values rounded to nearest even.
      DeviceBuffer dx2 = to_device(x), d16 = poisoned<uint16_t>(x.size());
      cuda::rms_norm_rope(dx2.as<float>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                          df.as<float>(), pairs, dp.as<int64_t>(), nullptr, d16.as<uint16_t>());
      const std::vector<float> y = to_host<float>(dx, x.size());
      const std::vector<uint16_t> b = to_host<uint16_t>(d16, x.size());
      size_t bad = 0;
      for (size_t i = 0; i < y.size(); ++i) bad += b[i] != test::bf16_bits_of(y[i]);
      EXPECT_EQ(bad, 0u) << "bf16 output, heads " << heads << " len " << len;
      // bf16 input in place (wq_b's bf16 output): the fp32 form on the widened values, bit for bit.
      if (len % 4 != 0 || (2 * pairs) % 4 != 0) continue;
      std::vector<uint16_t> x16(x.size());
      for (size_t i = 0; i < x.size(); ++i) x16[i] = test::bf16_bits_of(x[i]);
      DeviceBuffer dxw = to_device(test::bf16_round(x)), dw16 = poisoned<uint16_t>(x.size()), di16 = to_device(x16);
      cuda::rms_norm_rope(dxw.as<float>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                          df.as<float>(), pairs, dp.as<int64_t>(), nullptr, dw16.as<uint16_t>());
      cuda::rms_norm_rope_bf16(di16.as<uint16_t>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                               df.as<float>(), pairs, dp.as<int64_t>(), nullptr);
      EXPECT_EQ(to_host<uint16_t>(di16, x.size()), to_host<uint16_t>(dw16, x.size()))
          << "bf16 input, heads " << heads << " len " << len;
      // ... and into fp32 (the fp32-key model's q): rms_norm_rope in place on the widened values.
      DeviceBuffer dxw2 = to_device(test::bf16_round(x)), dj16 = to_device(x16), df32 = poisoned<float>(x.size());
      cuda::rms_norm_rope(dxw2.as<float>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                          df.as<float>(), pairs, dp.as<int64_t>(), nullptr);
      cuda::rms_norm_rope_bf16(dj16.as<uint16_t>(), weighted ? dg.as<float>() : nullptr, rows, heads, len, 1e-6f,
                               df.as<float>(), pairs, dp.as<int64_t>(), nullptr, df32.as<float>());
      EXPECT_EQ(to_host<float>(df32, x.size()), to_host<float>(dxw2, x.size()))
          << "bf16 input, fp32 output, heads " << heads << " len " << len;
    }
  }
}

TEST(CudaOpsNorm, SwigluMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const int64_t rows = 9, I = 333;
  const std::vector<float> gu = randn(rows * 2 * I, 8.0f);
  for (float limit : {10.0f, 0.0f}) {
    std::vector<float> ref(rows * I);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < I; ++i) {
        float g = gu[r * 2 * I + i], v = gu[r * 2 * I + I + i];
        if (limit > 0) {
          g = std::min(g, limit);
          v = std::clamp(v, -limit, limit);
        }
        ref[r * I + i] = cpu::silu(g) * v;
      }
    DeviceBuffer dgu = to_device(gu), dh = poisoned<float>(ref.size());
    cuda::swiglu(dgu.as<float>(), rows, I, limit, dh.as<float>(), nullptr);
    EXPECT_LE(rel_error(to_host<float>(dh, ref.size()), ref), 1e-6) << "limit " << limit;
  }
}

TEST(CudaOpsNorm, AddApeAndRingStore) {
  DSV4_REQUIRE_GPU();
  const int64_t R = 11, m = 4, width = 260;
  const std::vector<float> z = randn(R * width), ape = randn(m * width);
  const std::vector<int64_t> pos = test::rand_positions(R, 100000);
  std::vector<float> ref = z;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < width; ++c) ref[r * width + c] += ape[(pos[r] % m) * width + c];
  DeviceBuffer dz = to_device(z), da = to_device(ape), dp = to_device(pos);
  cuda::add_ape(dz.as<float>(), dp.as<int64_t>(), da.as<float>(), R, m, width, nullptr);
  EXPECT_EQ(rel_error(to_host<float>(dz, ref.size()), ref), 0.0);

  // Ring: chunks longer and shorter than the ring, starting at unaligned positions.
  const int64_t ring_rows = 8;
  for (auto [p0, n] : {std::pair<int64_t, int64_t>{13, 20}, {5, 3}, {0, 8}}) {
    const std::vector<float> rows = randn(n * width), ring0 = randn(ring_rows * width);
    std::vector<float> want = ring0;
    for (int64_t t = std::max(p0, p0 + n - ring_rows); t < p0 + n; ++t)
      std::copy_n(rows.data() + (t - p0) * width, width, want.data() + (t % ring_rows) * width);
    DeviceBuffer drows = to_device(rows), dring = to_device(ring0);
    cuda::ring_store(drows.as<float>(), n, width, p0, dring.as<float>(), ring_rows, nullptr);
    EXPECT_EQ(to_host<float>(dring, want.size()), want) << "p0 " << p0 << " n " << n;
  }

  // The same cases as jobs of one ring_store_jobs launch (each job its own ring and width),
  // with a grid bound above every job's row count; the bytes after each ring stay untouched.
  struct Case {
    int64_t p0, n, width, ring_rows;
  };
  const std::vector<Case> cases = {{13, 20, 260, 8}, {5, 3, 7, 8}, {0, 8, 64, 8}, {40, 1, 33, 128}, {3, 1, 5, 4}};
  std::vector<DeviceBuffer> srcs, rings;
  std::vector<std::vector<float>> wants;
  std::vector<cuda::RingJob> jobs;
  for (const Case& c : cases) {
    const std::vector<float> rows = randn(c.n * c.width), ring0 = randn((c.ring_rows + 1) * c.width);
    std::vector<float> want = ring0;
    for (int64_t t = std::max(c.p0, c.p0 + c.n - c.ring_rows); t < c.p0 + c.n; ++t)
      std::copy_n(rows.data() + (t - c.p0) * c.width, c.width, want.data() + (t % c.ring_rows) * c.width);
    srcs.push_back(to_device(rows));
    rings.push_back(to_device(ring0));
    wants.push_back(want);
    jobs.push_back({srcs.back().as<float>(), c.p0, c.n, c.width, rings.back().as<float>(), c.ring_rows});
  }
  DeviceBuffer djobs = to_device(jobs);
  cuda::ring_store_jobs(djobs.as<cuda::RingJob>(), static_cast<int64_t>(jobs.size()), 24, nullptr);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(to_host<float>(rings[i], wants[i].size()), wants[i]) << "job " << i;
}

}  // namespace
}  // namespace dsv4
