// MoeRunner vs the expert part of model/moe.cpp (clamped SwiGLU experts, weighted sum) on the
// CPU: FP4 experts as stored (and FP8 / bf16 ones), decode (GEMV) and prefill (tile) paths.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <string>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/moe.h"
#include "tests/cuda/random_weights.h"

// Skips without a GPU, or where the wgmma expert tiles are not built or not supported.
#define DSV4_REQUIRE_WGMMA_TILES()                                                                            \
  do {                                                                                                        \
    DSV4_REQUIRE_GPU();                                                                                       \
    if (!::dsv4::cuda::moe_wgmma_available())                                                                 \
      GTEST_SKIP() << "wgmma expert tiles need an sm_90 device and an arch-90a build";                        \
  } while (0)

namespace dsv4::test {
namespace {

struct Experts {
  std::vector<TestWeight> w1, w2, w3;
  cuda::ExpertSet dev;
};

Experts make_experts(Kind kind, int E, int64_t d, int64_t I) {
  Experts ex;
  for (int e = 0; e < E; ++e) {
    ex.w1.push_back(make_weight(kind, I, d));
    ex.w2.push_back(make_weight(kind, d, I));
    ex.w3.push_back(make_weight(kind, I, d));
  }
  for (int e = 0; e < E; ++e) {
    ex.dev.w1.push_back(ex.w1[e].dev);
    ex.dev.w2.push_back(ex.w2[e].dev);
    ex.dev.w3.push_back(ex.w3[e].dev);
  }
  ex.dev.d = d;
  ex.dev.I = I;
  return ex;
}

// out[r] += Σ_k w[r,k] W2 (silu(min(W1 x, L)) ⊙ clamp(W3 x, ±L)), as model/moe.cpp's experts.
// quant: x and h FP8-quantised per 128 channels first (the official W4A8 numerics of Fast).
void cpu_moe(const Experts& ex, const std::vector<float>& x_in, int64_t R, const std::vector<int32_t>& experts,
             const std::vector<float>& weights, int64_t K, float limit, bool quant, std::vector<float>& out) {
  const int64_t d = ex.dev.d, I = ex.dev.I;
  const std::vector<float> x = quant ? fake_quant_fp8(x_in, R, d, d) : x_in;
  std::vector<float> g(I), v(I), y(d);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const int e = experts[r * K + k];
      cpu::linear(ex.w1[e].host, x.data() + r * d, 1, g.data());
      cpu::linear(ex.w3[e].host, x.data() + r * d, 1, v.data());
      for (int64_t i = 0; i < I; ++i) {
        float gi = g[i], vi = v[i];
        if (limit > 0) {
          gi = std::min(gi, limit);
          vi = std::clamp(vi, -limit, limit);
        }
        g[i] = cpu::silu(gi) * vi;
      }
      if (quant) g = fake_quant_fp8(g, 1, I, I);
      cpu::linear(ex.w2[e].host, g.data(), 1, y.data());
      for (int64_t c = 0; c < d; ++c) out[r * d + c] += weights[r * K + k] * y[c];
    }
}

// Distinct random experts per row (top-k), positive weights; repeat: each row names only two
// experts, each several times (a hash table may; tiles then exceed the kernels' row bound).
void route(int64_t R, int64_t K, int E, std::vector<int32_t>& experts, std::vector<float>& weights,
           bool repeat = false) {
  std::vector<int32_t> ids(E);
  std::iota(ids.begin(), ids.end(), 0);
  std::uniform_real_distribution<float> wd(0.1f, 1.5f);
  experts.resize(R * K);
  weights.resize(R * K);
  for (int64_t r = 0; r < R; ++r) {
    std::shuffle(ids.begin(), ids.end(), rng());
    for (int64_t k = 0; k < K; ++k) {
      experts[r * K + k] = ids[repeat ? k % 2 : k];
      weights[r * K + k] = wd(rng());
    }
  }
}

double run_moe(const Experts& ex, int64_t R, int64_t K, float limit, cuda::Precision p, cuda::MoeRunner& runner,
               bool repeat = false) {
  const int E = static_cast<int>(ex.w1.size());
  const int64_t d = ex.dev.d;
  // x scaled so that W1 x / W3 x often exceed the clamp limit.
  const std::vector<float> x = randn(static_cast<size_t>(R * d), 0.5f);
  std::vector<int32_t> experts;
  std::vector<float> weights;
  route(R, K, E, experts, weights, repeat);
  const std::vector<float> out0 = randn(static_cast<size_t>(R * d));
  std::vector<float> ref(out0);
  cpu_moe(ex, x, R, experts, weights, K, limit, p == cuda::Precision::Fast, ref);

  cuda::DeviceBuffer dx = cuda::to_device(x), de = cuda::to_device(experts), dw = cuda::to_device(weights);
  cuda::DeviceBuffer dout = cuda::to_device(out0);
  runner.run(ex.dev, dx.as<float>(), R, de.as<int32_t>(), dw.as<float>(), K, limit, dout.as<float>(), p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = cuda::to_host<float>(dout, static_cast<size_t>(R * d));
  // Compare the routed contribution (out - out0), not the random base it was added to.
  std::vector<float> dg(got.size()), dr(ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    dg[i] = got[i] - out0[i];
    dr[i] = ref[i] - out0[i];
  }
  return rel_error(dg, dr);
}

// One random routing of R tokens to K of E experts, on the host and the device.
struct Routing {
  std::vector<float> x, w;
  std::vector<int32_t> ids;
  cuda::DeviceBuffer dx, de, dw;
};
Routing make_routing(int64_t R, int64_t d, int64_t K, int E) {
  Routing rt;
  rt.x = randn(static_cast<size_t>(R * d), 0.5f);
  route(R, K, E, rt.ids, rt.w);
  rt.dx = cuda::to_device(rt.x);
  rt.de = cuda::to_device(rt.ids);
  rt.dw = cuda::to_device(rt.w);
  return rt;
}

// runner.run (Fast, accumulate = false) into an output poisoned with NaN bytes: every element
// must be written.
std::vector<float> run_poisoned(cuda::MoeRunner& runner, const Experts& ex, const Routing& rt, int64_t R, int64_t K) {
  const int64_t d = ex.dev.d;
  cuda::DeviceBuffer dout(static_cast<size_t>(R * d) * 4);
  dout.fill_bytes(0xFF);
  runner.run(ex.dev, rt.dx.as<float>(), R, rt.de.as<int32_t>(), rt.dw.as<float>(), K, 10.f, dout.as<float>(),
             cuda::Precision::Fast, nullptr, false);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return cuda::to_host<float>(dout, static_cast<size_t>(R * d));
}

struct MoeCase {
  Kind kind;
  int E;
  int64_t d, I, K;
};

TEST(CudaMoe, MatchesCpuExperts) {
  DSV4_REQUIRE_GPU();
  const MoeCase cases[] = {
      {Kind::FP4, 16, 256, 128, 4},   // vectorised GEMV
      {Kind::FP4, 12, 224, 96, 3},    // d, I not multiples of 32 -> scalar GEMV
      {Kind::FP8, 8, 256, 192, 2},
      {Kind::BF16, 8, 128, 64, 2},
  };
  for (const MoeCase& c : cases) {
    const Experts ex = make_experts(c.kind, c.E, c.d, c.I);
    cuda::MoeRunner runner;
    // R = 1, 2, 3, 17: GEMV tiles (kernels bounded at 1, 2, 4, 16 rows per tile); 300: 64-token
    // SIMT tiles (pairs > 8 E).
    for (int64_t R : {1, 2, 3, 17, 300}) {
      for (float limit : {10.f, 0.f}) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s E=%d d=%lld I=%lld K=%lld R=%lld limit=%g", kind_name(c.kind).c_str(), c.E,
                      (long long)c.d, (long long)c.I, (long long)c.K, (long long)R, limit);
        SCOPED_TRACE(buf);
        const double ex_err = run_moe(ex, R, c.K, limit, cuda::Precision::Exact, runner);
        EXPECT_LE(ex_err, 1e-5) << buf;
        const double fast_err = run_moe(ex, R, c.K, limit, cuda::Precision::Fast, runner);
        EXPECT_LE(fast_err, 1e-2) << buf;
        std::printf("moe %-55s exact %.2e fast %.2e\n", buf, ex_err, fast_err);
      }
    }
    // Repeated experts within a token: tiles of K/2 x R slots on kernels bounded at R rows.
    for (int64_t R : {1, 2, 3, 5}) {
      const double err = run_moe(ex, R, c.K, 10.f, cuda::Precision::Exact, runner, true);
      EXPECT_LE(err, 1e-5) << kind_name(c.kind) << " repeated experts R=" << R;
      const double fast = run_moe(ex, R, c.K, 10.f, cuda::Precision::Fast, runner, true);
      EXPECT_LE(fast, 1e-2) << kind_name(c.kind) << " repeated experts R=" << R << " (fast)";
    }
  }
}

// run_routed (the router's selection inside the grouping launch up to one row per 32 experts,
// moe_route's grid past that) against moe_route then run: the same experts, weights and output bits, for score
// and hash routing, with the sum made by run and deferred to the caller.
TEST(CudaMoe, RoutedRunMatchesRouteThenRun) {
  DSV4_REQUIRE_GPU();
  const int E = 64;  // the grouping block routes up to 2 rows itself
  const int64_t d = 256, I = 128, K = 4, vocab = 50;
  const Experts ex = make_experts(Kind::FP4, E, d, I);
  const std::vector<float> bias = randn(E, 0.3f);
  std::vector<int32_t> tid2eid(vocab * K);
  for (int64_t t = 0; t < vocab; ++t)
    for (int64_t k = 0; k < K; ++k) tid2eid[t * K + k] = static_cast<int32_t>((t * 5 + k * 3) % E);
  const cuda::DeviceBuffer db = cuda::to_device(bias), dt = cuda::to_device(tid2eid);
  for (int64_t R : {1, 2, 3, 40}) {
    const std::vector<float> x = randn(static_cast<size_t>(R * d), 0.5f), logits = randn(static_cast<size_t>(R * E));
    std::vector<int32_t> tokens(R);
    for (int64_t r = 0; r < R; ++r) tokens[r] = static_cast<int32_t>((r * 7) % vocab);
    const cuda::DeviceBuffer dx = cuda::to_device(x), dl = cuda::to_device(logits), dtok = cuda::to_device(tokens);
    for (int hash = 0; hash < 2; ++hash) {
      for (int defer = 0; defer < 2; ++defer) {
        std::vector<float> out[2], w[2];
        std::vector<int32_t> e[2];
        for (int fused = 0; fused < 2; ++fused) {
          cuda::MoeRunner runner;
          runner.set_poison_scratch(true);
          cuda::DeviceBuffer de(static_cast<size_t>(R * K) * 4), dw(static_cast<size_t>(R * K) * 4),
              dout(static_cast<size_t>(R * d) * 4);
          for (cuda::DeviceBuffer* b : {&de, &dw, &dout}) b->fill_bytes(0xFF);  // unwritten: -1 / NaN
          const cuda::MoeRoute route{dl.as<float>(),  db.as<float>(),  hash ? dt.as<int32_t>() : nullptr,
                                     dtok.as<int32_t>(), 2.5f,         de.as<int32_t>(),
                                     dw.as<float>()};
          cuda::RoutedRows rows;
          if (fused) {
            runner.run_routed(ex.dev, dx.as<float>(), R, route, K, 10.f, dout.as<float>(), cuda::Precision::Fast,
                              nullptr, false, defer ? &rows : nullptr);
          } else {
            cuda::moe_route(route.logits, route.bias, route.tid2eid, route.tokens, R, E, K, route.routed_scale,
                            route.experts, route.weights, nullptr);
            runner.run(ex.dev, dx.as<float>(), R, de.as<int32_t>(), dw.as<float>(), K, 10.f, dout.as<float>(),
                       cuda::Precision::Fast, nullptr, false, defer ? &rows : nullptr);
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          if (defer) {  // the pairs' rows Y the caller sums (hc_post's sum is tested with the mHC ops)
            ASSERT_NE(rows.Y, nullptr);
            out[fused].resize(static_cast<size_t>(R * K * d));
            ASSERT_EQ(cudaMemcpy(out[fused].data(), rows.Y, out[fused].size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
          } else {
            out[fused] = cuda::to_host<float>(dout, static_cast<size_t>(R * d));
          }
          e[fused] = cuda::to_host<int32_t>(de, static_cast<size_t>(R * K));
          w[fused] = cuda::to_host<float>(dw, static_cast<size_t>(R * K));
        }
        const std::string what = "R=" + std::to_string(R) + (hash ? " hash" : " score") + (defer ? " deferred" : "");
        EXPECT_EQ(e[1], e[0]) << what;
        EXPECT_EQ(w[1], w[0]) << what;
        EXPECT_EQ(out[1], out[0]) << what;
        for (int32_t v : e[1]) ASSERT_TRUE(v >= 0 && v < E) << what;
      }
    }
  }
}

// The re-packed FP4 layout (pack_for_tensor_cores) feeds the same numbers to the same mma
// sequence: outputs bitwise equal to the stored layout's tensor-core path, at decode sizes and
// at a prefill size (many 8-token tiles per expert); Exact on packed experts is refused.
TEST(CudaMoe, PackedExpertsMatchStoredLayout) {
  DSV4_REQUIRE_GPU();
  // The last shape has K = 10 128-blocks (uneven K slices) and 75 tokens per expert at R = 300
  // (a full and a partial 64-token tile).
  for (auto [E, d, I, K] : {std::array<int64_t, 4>{16, 256, 128, 4}, {8, 512, 384, 2}, {8, 1280, 1152, 2}}) {
    const Experts ex = make_experts(Kind::FP4, static_cast<int>(E), d, I);
    struct Run {
      int64_t R;
      std::vector<float> x, w;
      std::vector<int32_t> ids;
      std::vector<float> stored;
    };
    std::vector<Run> runs;
    for (int64_t R : {1, 3, 8, 300}) {
      Run r{R, randn(static_cast<size_t>(R * d), 0.5f), {}, {}, {}};
      route(R, K, static_cast<int>(E), r.ids, r.w);
      runs.push_back(std::move(r));
    }
    cuda::MoeRunner runner;
    auto run = [&](const Run& r) {
      cuda::DeviceBuffer dx = cuda::to_device(r.x), de = cuda::to_device(r.ids), dw = cuda::to_device(r.w);
      cuda::DeviceBuffer dout(static_cast<size_t>(r.R * d) * 4);
      dout.fill_bytes(0);
      runner.run(ex.dev, dx.as<float>(), r.R, de.as<int32_t>(), dw.as<float>(), K, 10.f, dout.as<float>(),
                 cuda::Precision::Fast, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return cuda::to_host<float>(dout, static_cast<size_t>(r.R * d));
    };
    for (Run& r : runs) r.stored = run(r);
    ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    runner.set_poison_scratch(true);  // H and Y NaN before each run: every element must be written again
    // Every kernel variant (row blocks per CTA, CTAs per SM, 8- or 64-token tiles) sums in the
    // same order: same bits.
    auto expect_stored_bits = [&](const char* variant) {
      for (const Run& r : runs) {
        const std::vector<float> packed = run(r);
        ASSERT_EQ(packed.size(), r.stored.size());
        size_t diff = 0;
        for (size_t i = 0; i < packed.size(); ++i) diff += packed[i] != r.stored[i];
        EXPECT_EQ(diff, 0u) << "d=" << d << " I=" << I << " R=" << r.R << " " << variant
                            << ": packed != stored layout";
      }
    };
    cuda::set_moe_wide_tiles(-1);
    cuda::set_moe_decode_wgmma(-1);  // the FP8 wgmma tiles sum groups in the tensor core: other bits
    for (auto [rb, occ] : {std::pair{0, 2}, {1, 2}, {2, 2}, {4, 2}, {0, 3}, {1, 3}, {4, 3}}) {
      cuda::set_moe_mma_variant(rb, occ);
      expect_stored_bits(("rb=" + std::to_string(rb) + " occ=" + std::to_string(occ)).c_str());
    }
    cuda::set_moe_mma_variant(0, 3);
    cuda::set_moe_wide_tiles(1);
    expect_stored_bits("64-token tiles");
    cuda::set_moe_wide_tiles(0);
    cuda::set_moe_decode_wgmma(0);
    const Run& r = runs.front();
    cuda::DeviceBuffer dx = cuda::to_device(r.x), de = cuda::to_device(r.ids), dw = cuda::to_device(r.w);
    cuda::DeviceBuffer dout(static_cast<size_t>(r.R * d) * 4);
    EXPECT_THROW(runner.run(ex.dev, dx.as<float>(), r.R, de.as<int32_t>(), dw.as<float>(), K, 10.f, dout.as<float>(),
                            cuda::Precision::Exact, nullptr),
                 std::exception);
  }
  // Non-FP4 experts are left alone.
  const Experts fp8 = make_experts(Kind::FP8, 4, 256, 128);
  cuda::MoeRunner runner;
  EXPECT_FALSE(runner.pack_for_tensor_cores(fp8.dev, nullptr));
}

// E8M0 bytes 0x00 (2^-127) and 0xFF (NaN) take the exact decode of the tensor-core kernels (the
// cheap one moves the byte into the exponent field: 0 and +inf). A NaN group scale in one W2 row
// makes that output channel NaN for every token that routes to the expert (+inf would survive
// as ±inf); every other channel matches the CPU.
TEST(CudaMoe, SpecialScaleBytesDecodeExactly) {
  DSV4_REQUIRE_GPU();
  const int64_t d = 256, I = 128, K = 2, R = 3, nan_row = 37;
  Experts ex = make_experts(Kind::FP4, 2, d, I);
  auto poke = [](TestWeight& w, size_t i, uint8_t b) {
    w.scale[i] = b;
    ASSERT_EQ(cudaMemcpy(w.d_scale.as<uint8_t>() + i, &b, 1, cudaMemcpyHostToDevice), cudaSuccess);
  };
  poke(ex.w2[1], static_cast<size_t>(nan_row * (I / 32) + 1), 0xFF);
  poke(ex.w1[0], static_cast<size_t>(5 * (d / 32) + 2), 0x00);
  poke(ex.w3[1], static_cast<size_t>(70 * (d / 32)), 0x00);
  const std::vector<float> x = randn(static_cast<size_t>(R * d), 0.5f);
  const std::vector<int32_t> experts = {0, 1, 1, 0, 0, 1};
  const std::vector<float> weights = {0.5f, 0.7f, 1.1f, 0.2f, 0.9f, 0.4f};
  std::vector<float> ref(static_cast<size_t>(R * d), 0.f);
  cpu_moe(ex, x, R, experts, weights, K, 10.f, true, ref);
  cuda::MoeRunner runner;
  ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
  cuda::DeviceBuffer dx = cuda::to_device(x), de = cuda::to_device(experts), dw = cuda::to_device(weights);
  // The mma.sync kernels, then the FP8 wgmma ones where the device has them (default there), then
  // the FP8 prefill tiles (mode 2: the scales folded into the weights; a 0x00 byte beside ~2^-4
  // ones is a spread far past the exact tables', a 0xFF byte makes the row's scale NaN).
  for (int mode : {-1, 0, 2}) {
    if (mode == 2 && !cuda::moe_wgmma_available()) continue;
    SCOPED_TRACE(mode < 0 ? "mma.sync decode tiles" : mode == 0 ? "default decode tiles" : "FP8 prefill tiles");
    cuda::set_moe_decode_wgmma(mode == 2 ? 0 : mode);
    if (mode == 2) cuda::set_moe_wide_tiles(4);
    cuda::DeviceBuffer dout(static_cast<size_t>(R * d) * 4);
    dout.fill_bytes(0);
    runner.run(ex.dev, dx.as<float>(), R, de.as<int32_t>(), dw.as<float>(), K, 10.f, dout.as<float>(),
               cuda::Precision::Fast, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::set_moe_decode_wgmma(0);
    cuda::set_moe_wide_tiles(0);
    const std::vector<float> got = cuda::to_host<float>(dout, static_cast<size_t>(R * d));
    std::vector<float> g, r;
    for (int64_t t = 0; t < R; ++t)
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(t * d + c);
        if (c == nan_row) {
          EXPECT_TRUE(std::isnan(ref[i])) << "token " << t;  // the CPU twin decodes 0xFF as NaN
          EXPECT_TRUE(std::isnan(got[i])) << "token " << t << ": " << got[i];
          continue;
        }
        ASSERT_TRUE(std::isfinite(got[i])) << "token " << t << " channel " << c;
        g.push_back(got[i]);
        r.push_back(ref[i]);
      }
    // The CPU twin also rounds h to FP8; where the GPU's h sits on the other side of a rounding
    // boundary one of a sum's 128 terms moves by up to 1/16 of itself. The prefill tiles' h comes
    // from the FP8 tensor core's 128-product sums (coarser than the decode tiles' 32), so more of
    // the 768 codes of this 3-token case flip: 1.11e-2 was seen once against the decode tiles'
    // 1e-2 bound. A wrong table, row or scale is O(1).
    EXPECT_LE(rel_error(g, r), mode == 2 ? 3e-2 : 1e-2);
  }
}

// 8- and 16-token tiles on FP8 wgmma (moe_wgmma_decode.cu): the mma.sync kernels' numbers up to
// the tensor core's sum of each group's 32 products (the sums differ in low bits, and a few of
// the FP8 codes of h round the other way), and the CPU formula; the 16-token tiles (R = 40: 10 or
// 20 tokens per expert, full and partial tiles) the 8-token ones' numbers. Outputs and scratch
// poisoned first; at least one element differs from the mma.sync bits (the wgmma kernels ran,
// not a fallback).
TEST(CudaMoe, Fp8WgmmaDecodeTilesMatchMmaSync) {
  DSV4_REQUIRE_GPU();
  if (!cuda::moe_wgmma_available()) GTEST_SKIP() << "FP8 wgmma decode tiles need an sm_90 device and an arch-90a build";
  // 1280 / 1152: 10 and 9 128-blocks (uneven K slices of the two warpgroups); 4096 / 2048 with
  // K = 6: V4-Flash's expert shape (CPU reference skipped there: seconds per token).
  for (auto [E, d, I, K] : {std::array<int64_t, 4>{16, 256, 128, 4}, {8, 512, 384, 2}, {8, 1280, 1152, 2},
                            {8, 4096, 2048, 6}}) {
    Experts ex = make_experts(Kind::FP4, static_cast<int>(E), d, I);
    cuda::MoeRunner runner;
    ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
    runner.set_poison_scratch(true);
    cuda::set_moe_wide_tiles(-1);
    for (int64_t R : {1, 3, 8, 40}) {
      if (d == 4096 && R > 8) continue;
      const Routing rt = make_routing(R, d, K, static_cast<int>(E));
      auto run = [&](int mode, int tile) {
        cuda::set_moe_decode_wgmma(mode);
        cuda::set_moe_decode_tile(tile);
        std::vector<float> out = run_poisoned(runner, ex, rt, R, K);
        cuda::set_moe_decode_wgmma(0);
        cuda::set_moe_decode_tile(0);
        return out;
      };
      const std::vector<float> mma = run(-1, 0), wg = run(1, 8), wg16 = run(1, 16);
      size_t diff = 0, bad = 0;
      for (size_t i = 0; i < wg.size(); ++i) {
        diff += wg[i] != mma[i];
        bad += !std::isfinite(wg[i]) + !std::isfinite(wg16[i]);
      }
      const double vs_mma = rel_error(wg, mma), t16_vs_t8 = rel_error(wg16, wg);
      double vs_cpu = 0, mma_cpu = 0;
      if (d < 4096) {
        std::vector<float> ref(static_cast<size_t>(R * d), 0.f);
        cpu_moe(ex, rt.x, R, rt.ids, rt.w, K, 10.f, true, ref);
        vs_cpu = rel_error(wg, ref);
        mma_cpu = rel_error(mma, ref);
      }
      std::printf("moe fp8 wgmma decode d=%lld I=%lld R=%lld: vs mma.sync %.2e, vs cpu %.2e (mma.sync vs cpu %.2e), "
                  "%zu differ; 16-token tiles vs 8 %.2e\n",
                  (long long)d, (long long)I, (long long)R, vs_mma, vs_cpu, mma_cpu, diff, t16_vs_t8);
      EXPECT_EQ(bad, 0u) << "d=" << d << " R=" << R << ": unwritten or non-finite outputs";
      // A misplaced row, token or K chunk is O(1); FP8 re-rounding of h moves ~1e-3.
      EXPECT_LE(vs_mma, 1e-2) << "d=" << d << " I=" << I << " R=" << R;
      // The same group products and sums in the same order: a wrong octet or token is O(1).
      EXPECT_LE(t16_vs_t8, 1e-6) << "16-token tiles, d=" << d << " I=" << I << " R=" << R;
      EXPECT_LE(vs_cpu, std::max(1e-2, 2 * mma_cpu)) << "d=" << d << " I=" << I << " R=" << R;
      EXPECT_GT(diff, 0u) << "d=" << d << " R=" << R << ": wgmma output bitwise equal to the mma.sync kernels";
    }
    cuda::set_moe_wide_tiles(0);
  }
}

// 64- and 128-token tiles on wgmma (bf16 operands: the FP4 weights with their scales, the
// FP8-quantised activations, both exact): the 8-token kernels' numbers up to the order of fp32
// sums, and the CPU formula; 64-token FP8 wgmma tiles: the same up to the FP8 tensor core's group
// sums. Outputs poisoned first (accumulate = false must write every element); at least
// one element differs from the 8-token bits (the wgmma kernels ran, not a fallback).
// Rows of every expert weight get one group of each 128-block 6 / 11 / 12 / 20 exponents below the
// rest, or one 9 above (both folding table kinds in one block, rows of each kind in one warp);
// every fifth row keeps the narrow random spread.
void spread_scales(Experts& ex, int64_t E, int64_t d, int64_t I) {
  const int drops[4] = {6, 11, 12, 20};
  auto spread = [&](TestWeight& w, int64_t rows, int64_t in) {
    const int64_t sc = in / 32;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t kb = 0; kb < in / 128; ++kb) {
        const int64_t g = 4 * kb + (r + kb) % 4;
        if (r % 5 == 4) continue;
        uint8_t& b = w.scale[static_cast<size_t>(r * sc + g)];
        b = static_cast<uint8_t>(r % 5 == 3 ? b + 9 : b - drops[r % 4]);
      }
    ASSERT_EQ(cudaMemcpy(w.d_scale.as<uint8_t>(), w.scale.data(), w.scale.size(), cudaMemcpyHostToDevice), cudaSuccess);
  };
  for (int64_t e = 0; e < E; ++e) {
    spread(ex.w1[e], I, d);
    spread(ex.w3[e], I, d);
    spread(ex.w2[e], d, I);
  }
}

// The wide-tile cases: packed FP4 experts of three shapes (1280 / 1152: 10 and 9 128-blocks, the
// 4- and 5-stage rings wrap; 256: 2, fewer than the copies run ahead), each routed for R = 5
// (tiles of one or two tokens, the second warpgroup idle), 300 (75 or 150 tokens per expert: one
// tile, both warpgroups) and 700 (175 or 350: several tiles per expert, partial last ones).
// With spread: a fourth shape whose scales spread_scales widened (the rounded folding tables).
// shapes: other {E, d, I, K} instead of the three (the spread one stays the fourth).
template <class Check>
void for_each_wide_case(Check check, bool spread = false, std::vector<std::array<int64_t, 4>> shapes = {}) {
  std::vector<std::array<int64_t, 4>> cases = {{16, 256, 128, 4}, {8, 512, 384, 2}, {8, 1280, 1152, 2}};
  if (!shapes.empty()) cases = shapes;
  if (spread) cases.push_back({4, 512, 256, 2});
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto [E, d, I, K] = cases[ci];
    Experts ex = make_experts(Kind::FP4, static_cast<int>(E), d, I);
    if (spread && ci + 1 == cases.size()) spread_scales(ex, E, d, I);
    cuda::MoeRunner runner;
    ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
    for (int64_t R : {5, 300, 700}) check(ex, runner, make_routing(R, d, K, static_cast<int>(E)), d, I, R, K);
  }
}

TEST(CudaMoe, WgmmaTilesMatchNarrowTiles) {
  DSV4_REQUIRE_WGMMA_TILES();
  for_each_wide_case([](const Experts& ex, cuda::MoeRunner& runner, const Routing& rt, int64_t d, int64_t I, int64_t R,
                      int64_t K) {
    auto run = [&](int mode) {
      cuda::set_moe_wide_tiles(mode);
      std::vector<float> out = run_poisoned(runner, ex, rt, R, K);
      cuda::set_moe_wide_tiles(0);
      return out;
    };
    cuda::set_moe_decode_wgmma(-1);  // the mma.sync 8-token kernels: same products, fp32 sums
    const std::vector<float> narrow = run(-1);
    cuda::set_moe_decode_wgmma(0);
    std::vector<float> ref(static_cast<size_t>(R * d), 0.f);
    cpu_moe(ex, rt.x, R, rt.ids, rt.w, K, 10.f, true, ref);
    for (int mode : {2, 3, 4}) {  // 64- and 128-token bf16 tiles, 128-token FP8 tiles
      const std::vector<float> wg = run(mode);
      size_t diff = 0, bad = 0;
      for (size_t i = 0; i < wg.size(); ++i) {
        diff += wg[i] != narrow[i];
        bad += !std::isfinite(wg[i]);
      }
      const double vs_narrow = rel_error(wg, narrow), vs_cpu = rel_error(wg, ref), narrow_cpu = rel_error(narrow, ref);
      std::printf("moe wgmma %d-token %s tiles d=%lld I=%lld R=%lld: vs 8-token %.2e, vs cpu %.2e (8-token vs cpu "
                  "%.2e), %zu differ\n", mode == 2 ? 64 : 128, mode == 4 ? "fp8" : "bf16", (long long)d, (long long)I,
                  (long long)R, vs_narrow, vs_cpu, narrow_cpu, diff);
      EXPECT_EQ(bad, 0u) << "d=" << d << " R=" << R << ": unwritten or non-finite outputs";
      // bf16: fp32 sums in another order, ~1e-7 (2026-12-04), but now and then an h element whose
      // sum lands on the other side of a bf16 rounding edge than the 8-token kernels' (one large
      // |h| moved by one bf16 step: 1.2e-4 in one run of fresh inputs, 2026-12-06; the 8-token
      // kernels show the same against the CPU, 1.7e-5). FP8: the tensor core's group sums and the
      // FP8 re-rounding of h, ~1e-3 (as the FP8 decode tiles). One misplaced row or K chunk is O(1).
      EXPECT_LE(vs_narrow, mode == 4 ? 1e-2 : 1e-3) << "d=" << d << " I=" << I << " R=" << R << " mode " << mode;
      EXPECT_LE(vs_cpu, std::max(1e-2, 2 * narrow_cpu)) << "d=" << d << " I=" << I << " R=" << R;
      EXPECT_GT(diff, 0u) << "d=" << d << " R=" << R << ": wgmma output bitwise equal to the 8-token kernels";
    }
  });
}

// The FP8 prefill tiles fold each row's four group scales of a 128-block into the e4m3 weights:
// exact tables while the exponents lie within 11 of each other, rounded ones past that. Rows here
// get one group 6 / 11 / 12 / 20 exponents below the rest and one group 9 above (both table kinds
// in one block, and rows of each kind in one warp): against the CPU formula as tightly as the
// 8-token kernels, which apply every group scale in fp32.
TEST(CudaMoe, Fp8WideTilesFoldSpreadScales) {
  DSV4_REQUIRE_WGMMA_TILES();
  const int64_t E = 4, d = 512, I = 256, K = 2, R = 200;
  Experts ex = make_experts(Kind::FP4, static_cast<int>(E), d, I);
  spread_scales(ex, E, d, I);
  cuda::MoeRunner runner;
  ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
  const Routing rt = make_routing(R, d, K, static_cast<int>(E));
  std::vector<float> ref(static_cast<size_t>(R * d), 0.f);
  cpu_moe(ex, rt.x, R, rt.ids, rt.w, K, 10.f, true, ref);
  cuda::set_moe_decode_wgmma(-1);
  const std::vector<float> narrow = [&] {
    cuda::set_moe_wide_tiles(-1);
    return run_poisoned(runner, ex, rt, R, K);
  }();
  cuda::set_moe_decode_wgmma(0);
  cuda::set_moe_wide_tiles(4);
  const std::vector<float> wide = run_poisoned(runner, ex, rt, R, K);
  cuda::set_moe_wide_tiles(6);  // the warp-specialised kernels fold in another place: same bytes
  const std::vector<float> ws = run_poisoned(runner, ex, rt, R, K);
  cuda::set_moe_wide_tiles(0);
  size_t bad = 0, differ = 0;
  for (size_t i = 0; i < wide.size(); ++i) {
    bad += !std::isfinite(wide[i]);
    differ += std::memcmp(&wide[i], &ws[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(differ, 0u) << "warp-specialised FP8 tiles differ from the wide kernels on spread scales";
  const double narrow_cpu = rel_error(narrow, ref), wide_cpu = rel_error(wide, ref);
  std::printf("moe fp8 prefill tiles, spread scales: vs cpu %.2e (8-token vs cpu %.2e), vs 8-token %.2e\n", wide_cpu,
              narrow_cpu, rel_error(wide, narrow));
  EXPECT_LE(wide_cpu, std::max(1e-2, 2 * narrow_cpu));
  EXPECT_LE(rel_error(wide, narrow), 1e-2);
}

// The warp-specialised FP8 prefill kernels (producer warpgroups fold the weights into shared
// memory, two consumers run shared-memory wgmmas) compute the wide kernels' products in the same
// order: outputs bit for bit equal in every given mode, on every wide-tile case (N = 64 and 128
// tiles, rings that wrap and ones shorter than the copies' lead) and the spread scales.
void expect_ws_matches_wide(std::initializer_list<int> modes, std::vector<std::array<int64_t, 4>> shapes = {}) {
  for_each_wide_case(
      [&](const Experts& ex, cuda::MoeRunner& runner, const Routing& rt, int64_t d, int64_t I, int64_t R, int64_t K) {
        cuda::set_moe_wide_tiles(4);
        const std::vector<float> wide = run_poisoned(runner, ex, rt, R, K);
        for (int mode : modes) {
          cuda::set_moe_wide_tiles(mode);
          const std::vector<float> ws = run_poisoned(runner, ex, rt, R, K);
          cuda::set_moe_wide_tiles(0);
          size_t differ = 0, bad = 0;
          for (size_t i = 0; i < ws.size(); ++i) {
            differ += std::memcmp(&wide[i], &ws[i], sizeof(float)) != 0;
            bad += !std::isfinite(ws[i]);
          }
          std::printf("moe fp8 ws tiles (mode %d) d=%lld I=%lld R=%lld: %zu of %zu differ from the wide kernels\n",
                      mode, (long long)d, (long long)I, (long long)R, differ, ws.size());
          EXPECT_EQ(bad, 0u) << "d=" << d << " R=" << R << " mode " << mode << ": unwritten or non-finite outputs";
          EXPECT_EQ(differ, 0u) << "d=" << d << " I=" << I << " R=" << R << " mode " << mode;
        }
      },
      true, shapes);
}

// One producer warpgroup, the proxy fence in the producers (5) or the consumers (6).
TEST(CudaMoe, Fp8WarpSpecialisedTilesMatchWide) {
  DSV4_REQUIRE_WGMMA_TILES();
  expect_ws_matches_wide({5, 6});
}

// Mode 6 persistent (mode 22: a CTA an SM walking the items, one ring across them, outputs through
// the item's last stage): the same bits on every case (rings shorter than the copies' lead
// included), with a CTA an SM and with 3 and 7 CTAs, each then walking many items of both widths.
// Both on merged tiles (an expert's last two 128-token tiles as one item of up to 192 tokens:
// the cases at R = 700 have ~175 pairs an expert) and on 128-token tiles.
TEST(CudaMoe, Fp8WarpSpecialisedPersistentMatchesWide) {
  DSV4_REQUIRE_WGMMA_TILES();
  for (bool merge : {true, false}) {
    cuda::set_moe_merge_tiles(merge);
    for (int ctas : {0, 3, 7}) {
      cuda::set_moe_persistent_ctas(ctas);
      expect_ws_matches_wide({22});
    }
  }
  cuda::set_moe_persistent_ctas(0);
  cuda::set_moe_merge_tiles(true);
}

// The by-size rule at prefill sizes (~75 and ~175 tokens an expert) runs a warp-specialised form
// by default (DSV4_MOE_PREFILL_WS): its outputs are the wide kernels' bit for bit.
TEST(CudaMoe, BySizePrefillTilesMatchWide) {
  DSV4_REQUIRE_WGMMA_TILES();
  const int64_t E = 8, d = 512, I = 384, K = 2;
  Experts ex = make_experts(Kind::FP4, static_cast<int>(E), d, I);
  cuda::MoeRunner runner;
  ASSERT_TRUE(runner.pack_for_tensor_cores(ex.dev, nullptr));
  for (int64_t R : {300, 700}) {
    const Routing rt = make_routing(R, d, K, static_cast<int>(E));
    cuda::set_moe_wide_tiles(4);
    const std::vector<float> wide = run_poisoned(runner, ex, rt, R, K);
    cuda::set_moe_wide_tiles(0);
    const std::vector<float> by_size = run_poisoned(runner, ex, rt, R, K);
    size_t differ = 0;
    for (size_t i = 0; i < wide.size(); ++i) differ += std::memcmp(&wide[i], &by_size[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "R=" << R << ": the by-size prefill tiles differ from the wide kernels";
  }
}

// Two producer warpgroups (512 threads, registers moved by setmaxnreg), both fence places.
TEST(CudaMoe, Fp8WarpSpecialisedTwoProducersMatchWide) {
  DSV4_REQUIRE_WGMMA_TILES();
  expect_ws_matches_wide({7, 8});
}

// The clustered TMA forms (modes 9-12) and step 26's forms (13-21) were removed after measuring
// slower (bench/NOTES.md steps 25-26): asking for one is an error that says so, not a fallback.
TEST(CudaMoe, RemovedFormsAreNamed) {
  for (int mode : {9, 12, 13, 21}) {
    try {
      cuda::set_moe_wide_tiles(mode);
      ADD_FAILURE() << "set_moe_wide_tiles(" << mode << ") accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("removed"), std::string::npos) << e.what();
    }
  }
  cuda::set_moe_wide_tiles(0);
}

}  // namespace
}  // namespace dsv4::test
