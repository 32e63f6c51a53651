// Parity of the CUDA mHC kernels with model/mhc.cpp (hc_pre incl. Sinkhorn, hc_post, hc_head).
#include <cmath>
#include <cstring>

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_mhc_decode.h"
#include "model/mhc.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;
using test::rel_error;

ModelConfig hc_config(int64_t n, int64_t d) {
  ModelConfig c;
  c.hc_mult = n;
  c.hidden_size = d;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  return c;
}

// Projections scaled so mu is O(1), as in the trained model.
HcWeights hc_weights(int64_t n_out, int64_t nd, int64_t n_scale) {
  HcWeights w;
  w.fn = randn(n_out * nd, 1.0f / std::sqrt(static_cast<float>(nd)));
  w.base = randn(n_out, 0.5f);
  w.scale = randn(n_scale);
  return w;
}

struct DevHc {
  DeviceBuffer fn, base, scale;
  cuda::HcParams p;
  explicit DevHc(const HcWeights& w)
      : fn(to_device(w.fn)), base(to_device(w.base)), scale(to_device(w.scale)),
        p{fn.as<float>(), base.as<float>(), scale.as<float>()} {}
};

// A second stream for the mHC gates and the event it waits on (destroyed with it).
struct GatesStreams {
  cudaStream_t s = nullptr, gates = nullptr;
  cudaEvent_t ev = nullptr;
  GatesStreams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&gates, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
  }
  ~GatesStreams() {
    cudaEventDestroy(ev);
    cudaStreamDestroy(gates);
    cudaStreamDestroy(s);
  }
};

// hc_pre's outputs (poisoned before a run).
struct HcOut {
  DeviceBuffer pre, post, comb, u;
  int64_t R, n, d;
  HcOut(int64_t rows, int64_t streams, int64_t width)
      : pre(poisoned<float>(rows * streams)), post(poisoned<float>(rows * streams)),
        comb(poisoned<float>(rows * streams * streams)), u(poisoned<float>(rows * width)), R(rows), n(streams),
        d(width) {}
  void expect_same(const HcOut& o) const {
    EXPECT_EQ(to_host<float>(pre, R * n), to_host<float>(o.pre, R * n));
    EXPECT_EQ(to_host<float>(post, R * n), to_host<float>(o.post, R * n));
    EXPECT_EQ(to_host<float>(comb, R * n * n), to_host<float>(o.comb, R * n * n));
    EXPECT_EQ(to_host<float>(u, R * d), to_host<float>(o.u, R * d));
  }
};

// F as two addends (the shared and the routed experts' outputs) and their float sum: hc_post on
// (F1, F2) must give the bits of hc_post on sum.
struct SplitF {
  DeviceBuffer F1, F2, sum;
  explicit SplitF(const std::vector<float>& F) {
    const std::vector<float> f1 = randn(F.size());
    std::vector<float> f2(F.size()), s(F.size());
    for (size_t i = 0; i < F.size(); ++i) {
      f2[i] = F[i] - f1[i];
      s[i] = f1[i] + f2[i];
    }
    F1 = to_device(f1);
    F2 = to_device(f2);
    sum = to_device(s);
  }
};

class CudaOpsMhc : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};  // (R, d)

// One (R, d) case of n = 4 streams: fresh random weights and streams, the CPU's hc_pre, and
// the same inputs on the device.
struct HcCase {
  int64_t n = 4, n_out = (2 + n) * n, R, d;
  ModelConfig cfg;
  HcWeights w;
  std::vector<float> X;
  HcMix mix;
  std::vector<float> u;
  DevHc dw;
  DeviceBuffer dX;
  HcCase(int64_t rows, int64_t width)
      : R(rows), d(width), cfg(hc_config(n, d)), w(hc_weights(n_out, n * d, 3)), X(randn(R * n * d, 2.0f)),
        u(R * d), dw(w), dX(to_device(X)) {
    hc_pre(w, cfg, X.data(), R, mix, u.data());
  }
  // cuda::hc_pre on the case (gates: its second stream, projected: its event).
  void gpu(DeviceBuffer& pre, DeviceBuffer& post, DeviceBuffer& comb, DeviceBuffer& out, cudaStream_t s = nullptr,
           cudaStream_t gates = nullptr, cudaEvent_t projected = nullptr) const {
    cuda::hc_pre(dw.p, dX.as<float>(), R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(),
                 comb.as<float>(), out.as<float>(), s, gates, projected);
  }
};

TEST_P(CudaOpsMhc, HcPreMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const HcCase c(R, d);
  const int64_t n = c.n;
  DeviceBuffer dpre = poisoned<float>(R * n), dpost = poisoned<float>(R * n), dcomb = poisoned<float>(R * n * n),
               du = poisoned<float>(R * d);
  c.gpu(dpre, dpost, dcomb, du);
  EXPECT_LE(rel_error(to_host<float>(dpre, R * n), c.mix.pre), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(dpost, R * n), c.mix.post), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(dcomb, R * n * n), c.mix.comb), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(du, R * d), c.u), 1e-5);

  // The gates (pre / post / comb) on a second stream while the first mixes u: the same bits.
  const GatesStreams st;
  HcOut side(R, n, d);
  c.gpu(side.pre, side.post, side.comb, side.u, st.s, st.gates, st.ev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host<float>(side.pre, R * n), to_host<float>(dpre, R * n));
  EXPECT_EQ(to_host<float>(side.post, R * n), to_host<float>(dpost, R * n));
  EXPECT_EQ(to_host<float>(side.comb, R * n * n), to_host<float>(dcomb, R * n * n));
  EXPECT_EQ(to_host<float>(side.u, R * d), to_host<float>(du, R * d));
}

// From 256 rows the projection runs in tiles on split-TF32 tensor cores (hi·hi + hi·lo + lo·hi):
// against the CPU as tightly as the fp32 FMA form, and not bitwise equal to it (the form ran). The two
// forms sum K = n·d products in different orders, each ~5e-7 from the CPU at 65540 rows, so they
// differ by up to ~1e-6 (measured 1.008e-6); one plain TF32 product would be ~1e-3 off.
TEST_P(CudaOpsMhc, HcPreTf32ProjectionMatchesFmaForm) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  if (R < 256) GTEST_SKIP() << "the tiled projection starts at 256 rows";
  const HcCase c(R, d);
  const int64_t n = c.n;
  std::vector<float> out[2];
  for (int tf32 = 0; tf32 < 2; ++tf32) {
    DeviceBuffer dpre = poisoned<float>(R * n), dpost = poisoned<float>(R * n), dcomb = poisoned<float>(R * n * n),
                 du = poisoned<float>(R * d);
    cuda::set_hc_project_tf32(tf32 == 1);
    c.gpu(dpre, dpost, dcomb, du);
    out[tf32] = to_host<float>(du, R * d);
    EXPECT_LE(rel_error(to_host<float>(dpre, R * n), c.mix.pre), 1e-5) << "tf32 " << tf32;
    EXPECT_LE(rel_error(to_host<float>(dcomb, R * n * n), c.mix.comb), 1e-5) << "tf32 " << tf32;
    EXPECT_LE(rel_error(out[tf32], c.u), 1e-5) << "tf32 " << tf32;
  }
  cuda::set_hc_project_tf32(true);
  EXPECT_LE(rel_error(out[1], out[0]), 4e-6);
  EXPECT_NE(out[1], out[0]) << "the TF32 form gave the FMA form's bits: did it run?";
}

bool hc_pre_decode_applies(int64_t R, int64_t n, int64_t d) { return cuda::detail::hc_pre_decode_slices(R, n, d) > 0; }

// hc_pre with the sub-layer's input norm (one launch at up to 4 rows, ops_mhc_decode.cu; from one
// row per SM, inside the mixing blocks; else the mix then rms_norm): against the CPU's hc_pre +
// rms_norm, and against the GPU's unfused pair (the projection has the same bits; the one-launch
// form adds the norm's square sum in another order, the mixing blocks in rms_norm's).
TEST_P(CudaOpsMhc, HcPreWithNormMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const int64_t n = 4, n_out = (2 + n) * n;
  const ModelConfig cfg = hc_config(n, d);
  const HcWeights w = hc_weights(n_out, n * d, 3);
  const std::vector<float> X = randn(R * n * d, 2.0f), gamma = randn(d, 1.0f);
  const float eps = 1e-6f;
  HcMix mix;
  std::vector<float> u(R * d);
  hc_pre(w, cfg, X.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), gamma.data(), u.data(), R, d, eps);
  if (R <= 4 && d >= 1024) {
    EXPECT_GT(cuda::detail::hc_pre_decode_slices(R, n, d), 0) << "fused form expected";
  }

  DevHc dw(w);
  DeviceBuffer dX = to_device(X), dg = to_device(gamma), dpre = poisoned<float>(R * n), dpost = poisoned<float>(R * n),
               dcomb = poisoned<float>(R * n * n), du = poisoned<float>(R * d);
  for (int rep = 0; rep < 3; ++rep)  // the grid barrier resets itself: repeated calls agree
    cuda::hc_pre(dw.p, dX.as<float>(), R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, eps, dpre.as<float>(), dpost.as<float>(),
                 dcomb.as<float>(), du.as<float>(), nullptr, nullptr, nullptr, dg.as<float>(), eps);
  EXPECT_LE(rel_error(to_host<float>(dpre, R * n), mix.pre), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(dpost, R * n), mix.post), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(dcomb, R * n * n), mix.comb), 1e-5);
  EXPECT_LE(rel_error(to_host<float>(du, R * d), u), 1e-5);

  DeviceBuffer upre = poisoned<float>(R * n), upost = poisoned<float>(R * n), ucomb = poisoned<float>(R * n * n),
               uu = poisoned<float>(R * d);
  cuda::hc_pre(dw.p, dX.as<float>(), R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, eps, upre.as<float>(), upost.as<float>(),
               ucomb.as<float>(), uu.as<float>(), nullptr);
  cuda::rms_norm(uu.as<float>(), dg.as<float>(), uu.as<float>(), R, d, eps, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host<float>(upre, R * n), to_host<float>(dpre, R * n));
  EXPECT_EQ(to_host<float>(ucomb, R * n * n), to_host<float>(dcomb, R * n * n));
  if (hc_pre_decode_applies(R, n, d))
    EXPECT_LE(rel_error(to_host<float>(uu, R * d), to_host<float>(du, R * d)), 1e-6);
  else  // from the SM count up the mixing blocks normalise their rows in rms_norm's order
    EXPECT_EQ(to_host<float>(uu, R * d), to_host<float>(du, R * d));
}

TEST_P(CudaOpsMhc, HcPostMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const int64_t n = 4;
  HcMix mix;
  mix.post = randn(R * n);
  mix.comb = randn(R * n * n);
  const std::vector<float> F = randn(R * d), X = randn(R * n * d);
  std::vector<float> ref = X;
  hc_post(mix, F.data(), ref.data(), R, n, d);
  DeviceBuffer dpost = to_device(mix.post), dcomb = to_device(mix.comb), dF = to_device(F), dX = to_device(X);
  cuda::hc_post(dpost.as<float>(), dcomb.as<float>(), dF.as<float>(), dX.as<float>(), R, n, d, nullptr);
  EXPECT_LE(rel_error(to_host<float>(dX, X.size()), ref), 1e-6);
  // F split into two addends (shared expert, routed experts): the same bits as their sum.
  const SplitF sp(F);
  DeviceBuffer dXa = to_device(X), dXb = to_device(X);
  cuda::hc_post(dpost.as<float>(), dcomb.as<float>(), sp.F1.as<float>(), dXa.as<float>(), R, n, d, nullptr,
                sp.F2.as<float>());
  cuda::hc_post(dpost.as<float>(), dcomb.as<float>(), sp.sum.as<float>(), dXb.as<float>(), R, n, d, nullptr);
  EXPECT_EQ(to_host<float>(dXa, X.size()), to_host<float>(dXb, X.size()));
}

// hc_post that also projects the new streams for the next hc_pre (decode sizes:
// ops_mhc_post_project.cu; more rows: ops_mhc_post_project_tiled.cu), then that hc_pre from its
// partials: against the CPU's hc_post, hc_pre and rms_norm; the gates on a second stream give the
// same bits; F split into F + F2 gives the bits of their sum; the routed experts' rows summed
// inside give hc_post's streams. Other shapes: hc_post_project declines (and enqueues nothing).
TEST_P(CudaOpsMhc, HcPostProjectThenPreMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const int64_t n = 4, n_out = (2 + n) * n;
  const ModelConfig cfg = hc_config(n, d);
  const HcWeights w = hc_weights(n_out, n * d, 3);
  HcMix prev;  // the gates hc_post applies
  prev.post = randn(R * n);
  prev.comb = randn(R * n * n, 0.5f);
  const std::vector<float> F = randn(R * d), X = randn(R * n * d, 2.0f), gamma = randn(d, 1.0f);
  const float eps = 1e-6f;
  std::vector<float> Xn = X, u(R * d), un(R * d);
  hc_post(prev, F.data(), Xn.data(), R, n, d);
  HcMix mix;
  hc_pre(w, cfg, Xn.data(), R, mix, u.data());
  cpu::rms_norm(u.data(), gamma.data(), un.data(), R, d, eps);

  DevHc dw(w);
  DeviceBuffer dppost = to_device(prev.post), dpcomb = to_device(prev.comb), dF = to_device(F), dg = to_device(gamma);
  const bool applies = cuda::detail::hc_post_project_applies(R, n, d);
  if (R <= 4 && d <= 8192) {
    EXPECT_TRUE(applies) << "decode sizes take the projecting hc_post";
  }
  if (R > 4 && d % 32 == 0) {
    EXPECT_TRUE(applies) << "batches take the tiled projecting hc_post";
  }
  DeviceBuffer dX = to_device(X);
  const bool projected =
      cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dX.as<float>(), R, n, d, dw.p, nullptr);
  ASSERT_EQ(projected, applies);
  if (!projected) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(to_host<float>(dX, X.size()), X) << "declined, yet X changed";
    return;
  }
  EXPECT_LE(rel_error(to_host<float>(dX, X.size()), Xn), 1e-6);
  for (const bool norm : {true, false}) {
    HcOut one(R, n, d);
    cuda::hc_pre(dw.p, dX.as<float>(), R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, eps, one.pre.as<float>(),
                 one.post.as<float>(), one.comb.as<float>(), one.u.as<float>(), nullptr, nullptr, nullptr,
                 norm ? dg.as<float>() : nullptr, eps, /*from_post=*/true);
    EXPECT_LE(rel_error(to_host<float>(one.pre, R * n), mix.pre), 1e-5) << "norm " << norm;
    EXPECT_LE(rel_error(to_host<float>(one.post, R * n), mix.post), 1e-5) << "norm " << norm;
    EXPECT_LE(rel_error(to_host<float>(one.comb, R * n * n), mix.comb), 1e-5) << "norm " << norm;
    EXPECT_LE(rel_error(to_host<float>(one.u, R * d), norm ? un : u), 1e-5) << "norm " << norm;
    if (!norm) continue;
    // The gates on a second stream while the first mixes: the same bits.
    const GatesStreams st;
    HcOut side(R, n, d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::hc_pre(dw.p, dX.as<float>(), R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, eps, side.pre.as<float>(),
                 side.post.as<float>(), side.comb.as<float>(), side.u.as<float>(), st.s, st.gates, st.ev,
                 dg.as<float>(), eps, /*from_post=*/true);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    side.expect_same(one);
  }
  // F as two addends (shared and routed experts): the streams of their sum, bit for bit.
  const SplitF sp(F);
  DeviceBuffer dXa = to_device(X), dXb = to_device(X);
  ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), sp.F1.as<float>(), dXa.as<float>(), R, n,
                                    d, dw.p, nullptr, sp.F2.as<float>()));
  ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), sp.sum.as<float>(), dXb.as<float>(), R, n,
                                    d, dw.p, nullptr));
  EXPECT_EQ(to_host<float>(dXa, X.size()), to_host<float>(dXb, X.size()));
  // The routed experts' rows (K = 3 a row, some slots unused: expert -1) summed inside: the same
  // streams as hc_post's, bit for bit (up to 4M floats of rows: the 65540-row case is the grid split).
  const int K = 3, E = 8;
  if (R * K * d > (int64_t{4} << 20)) return;
  std::vector<int32_t> ex(static_cast<size_t>(R * K));
  for (size_t i = 0; i < ex.size(); ++i) ex[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(i % E);
  DeviceBuffer dY = to_device(randn(R * K * d)), dE = to_device(ex), dW = to_device(randn(R * K));
  const cuda::RoutedRows rt{dY.as<float>(), dE.as<int32_t>(), dW.as<float>(), K, E};
  DeviceBuffer dXc = to_device(X), dXd = to_device(X);
  ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dXc.as<float>(), R, n, d,
                                    dw.p, nullptr, nullptr, &rt));
  cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dXd.as<float>(), R, n, d, nullptr, nullptr,
                &rt);
  const std::vector<float> want = to_host<float>(dXd, X.size());
  EXPECT_EQ(to_host<float>(dXc, X.size()), want);
  // The rows as bf16 (RoutedRows::Y16, the FP8 prefill tiles' form): the streams of the fp32 rows
  // holding the same (widened) values, bit for bit, in both kernels.
  const std::vector<float> y = to_host<float>(dY, R * K * d);
  std::vector<uint16_t> y16(y.size());
  std::vector<float> y_wide(y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    y16[i] = test::bf16_bits_of(y[i]);
    y_wide[i] = test::bf16_round(y[i]);
  }
  DeviceBuffer dY16 = to_device(y16), dYw = to_device(y_wide);
  cuda::RoutedRows rt16 = rt, rtw = rt;
  rt16.Y = nullptr;
  rt16.Y16 = dY16.as<uint16_t>();
  rtw.Y = dYw.as<float>();
  DeviceBuffer dXe = to_device(X), dXf = to_device(X), dXg = to_device(X);
  ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dXe.as<float>(), R, n, d,
                                    dw.p, nullptr, nullptr, &rt16));
  cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dXf.as<float>(), R, n, d, nullptr, nullptr,
                &rt16);
  cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dXg.as<float>(), R, n, d, nullptr, nullptr,
                &rtw);
  const std::vector<float> want16 = to_host<float>(dXg, X.size());
  EXPECT_EQ(to_host<float>(dXe, X.size()), want16) << "projecting hc_post, bf16 rows";
  EXPECT_EQ(to_host<float>(dXf, X.size()), want16) << "hc_post, bf16 rows";
}

// The bf16 streams (cuda::StreamStore, Fast precision past 4 rows): hc_post's new streams are the
// fp32 forms' rounded to bf16, bit for bit — from fp32 streams (F32ToBF16, the first sub-layer)
// and from bf16 ones (BF16, in place) — in the plain and the projecting (tiled) kernel, with F,
// with F2 and with routed rows; the hc_pre after the projecting one, reading the bf16 streams,
// matches the CPU's on their widened values (the projection is of the stored streams).
TEST_P(CudaOpsMhc, Bf16StreamsAreTheRoundedFp32Streams) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const int64_t n = 4, n_out = (2 + n) * n;
  if (!cuda::hc_streams_bf16_ok(R, n, d)) {
    EXPECT_TRUE(R <= 4 || d % 32 != 0) << "R " << R << " d " << d << ": expected the bf16 forms";
    return;
  }
  const ModelConfig cfg = hc_config(n, d);
  const HcWeights w = hc_weights(n_out, n * d, 5);
  HcMix prev;
  prev.post = randn(R * n);
  prev.comb = randn(R * n * n, 0.5f);
  const std::vector<float> F = randn(R * d), X = randn(R * n * d, 2.0f), gamma = randn(d, 1.0f);
  const float eps = 1e-6f;
  DevHc dw(w);
  DeviceBuffer dppost = to_device(prev.post), dpcomb = to_device(prev.comb), dF = to_device(F), dg = to_device(gamma);
  const SplitF sp(F);
  const int K = 3, E = 8;
  std::vector<int32_t> ex(static_cast<size_t>(R * K));
  for (size_t i = 0; i < ex.size(); ++i) ex[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(i % E);
  DeviceBuffer dY = to_device(randn(R * K * d)), dE = to_device(ex), dW = to_device(randn(R * K));
  const cuda::RoutedRows rt{dY.as<float>(), dE.as<int32_t>(), dW.as<float>(), K, E};
  // The streams hc_post makes from fp32 streams x (float bits), rounded to bf16.
  const auto want16 = [&](const std::vector<float>& x, int addends) {
    DeviceBuffer dx = to_device(x);
    if (addends == 0) cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dx.as<float>(), R, n, d, nullptr);
    if (addends == 1)
      cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), sp.F1.as<float>(), dx.as<float>(), R, n, d, nullptr,
                    sp.F2.as<float>());
    if (addends == 2)
      cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), dF.as<float>(), dx.as<float>(), R, n, d, nullptr, nullptr,
                    &rt);
    return test::bf16_bits(to_host<float>(dx, x.size()));
  };
  const auto widen = [](const std::vector<uint16_t>& b) {
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(b[i]) << 16;
      std::memcpy(&f[i], &u, sizeof u);
    }
    return f;
  };
  for (int addends : {0, 1, 2}) {
    const float* Fa = addends == 1 ? sp.F1.as<float>() : dF.as<float>();
    const float* F2 = addends == 1 ? sp.F2.as<float>() : nullptr;
    const cuda::RoutedRows* rr = addends == 2 ? &rt : nullptr;
    for (const bool project : {true, false}) {
      // fp32 streams in, bf16 out.
      DeviceBuffer dX = to_device(X), d16 = poisoned<uint16_t>(X.size());
      if (project)
        ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), Fa, dX.as<float>(), R, n, d, dw.p,
                                          nullptr, F2, rr, cuda::StreamStore::F32ToBF16, d16.as<uint16_t>()));
      else
        cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), Fa, dX.as<float>(), R, n, d, nullptr, F2, rr,
                      cuda::StreamStore::F32ToBF16, d16.as<uint16_t>());
      const std::vector<uint16_t> first = to_host<uint16_t>(d16, X.size());
      EXPECT_EQ(first, want16(X, addends)) << "F32ToBF16, project " << project << ", addends " << addends;
      EXPECT_EQ(to_host<float>(dX, X.size()), X) << "the fp32 streams were written";
      // bf16 streams in place.
      if (project)
        ASSERT_TRUE(cuda::hc_post_project(dppost.as<float>(), dpcomb.as<float>(), Fa, nullptr, R, n, d, dw.p, nullptr,
                                          F2, rr, cuda::StreamStore::BF16, d16.as<uint16_t>()));
      else
        cuda::hc_post(dppost.as<float>(), dpcomb.as<float>(), Fa, nullptr, R, n, d, nullptr, F2, rr,
                      cuda::StreamStore::BF16, d16.as<uint16_t>());
      const std::vector<uint16_t> second = to_host<uint16_t>(d16, X.size());
      EXPECT_EQ(second, want16(widen(first), addends)) << "BF16, project " << project << ", addends " << addends;
      if (!project || addends != 0) continue;
      // The hc_pre after it, on the bf16 streams, against the CPU on their values.
      const std::vector<float> xw = widen(second);
      std::vector<float> u(R * d), un(R * d);
      HcMix mix;
      hc_pre(w, cfg, xw.data(), R, mix, u.data());
      cpu::rms_norm(u.data(), gamma.data(), un.data(), R, d, eps);
      for (const bool norm : {true, false}) {
        HcOut one(R, n, d);
        cuda::hc_pre(dw.p, nullptr, R, n, d, cfg.hc_sinkhorn_iters, 1e-6f, eps, one.pre.as<float>(),
                     one.post.as<float>(), one.comb.as<float>(), one.u.as<float>(), nullptr, nullptr, nullptr,
                     norm ? dg.as<float>() : nullptr, eps, /*from_post=*/true, d16.as<uint16_t>());
        EXPECT_LE(rel_error(to_host<float>(one.pre, R * n), mix.pre), 1e-5) << "norm " << norm;
        EXPECT_LE(rel_error(to_host<float>(one.post, R * n), mix.post), 1e-5) << "norm " << norm;
        EXPECT_LE(rel_error(to_host<float>(one.comb, R * n * n), mix.comb), 1e-5) << "norm " << norm;
        EXPECT_LE(rel_error(to_host<float>(one.u, R * d), norm ? un : u), 1e-5) << "norm " << norm;
      }
    }
  }
}

TEST_P(CudaOpsMhc, HcHeadMatchesCpu) {
  DSV4_REQUIRE_GPU();
  const auto [R, d] = GetParam();
  const int64_t n = 4;
  const ModelConfig cfg = hc_config(n, d);
  const HcWeights w = hc_weights(n, n * d, 1);
  const std::vector<float> X = randn(R * n * d, 2.0f);
  std::vector<float> h(R * d);
  hc_head(w, cfg, X.data(), R, h.data());
  DevHc dw(w);
  DeviceBuffer dX = to_device(X), dh = poisoned<float>(R * d);
  cuda::hc_head(dw.p, dX.as<float>(), R, n, d, 1e-6f, 1e-6f, dh.as<float>(), nullptr);
  EXPECT_LE(rel_error(to_host<float>(dh, h.size()), h), 1e-5);
}

// Decode-sized (split-K over many slices; up to 4 rows the one-launch form, d 7168 as V4-Pro), a
// ragged row tile, prefill-sized (the tiled projection
// from 256 rows: a ragged last row block; 1000 rows at d 512, where the stash row bounds the
// slice count; exactly two blocks), the tiny model, and more rows than one grid dimension holds
// (65535: hc_post runs over row ranges); d 1000 (not a multiple of 32: no projecting hc_post
// past 4 rows).
INSTANTIATE_TEST_SUITE_P(Shapes, CudaOpsMhc,
                         ::testing::Values(std::pair<int64_t, int64_t>{1, 4096}, std::pair<int64_t, int64_t>{3, 4096},
                                           std::pair<int64_t, int64_t>{4, 4096}, std::pair<int64_t, int64_t>{2, 7168},
                                           std::pair<int64_t, int64_t>{1, 256}, std::pair<int64_t, int64_t>{7, 4096},
                                           std::pair<int64_t, int64_t>{300, 4096}, std::pair<int64_t, int64_t>{1000, 512},
                                           std::pair<int64_t, int64_t>{256, 1024}, std::pair<int64_t, int64_t>{5, 256},
                                           std::pair<int64_t, int64_t>{65540, 256},
                                           std::pair<int64_t, int64_t>{6, 1000}));

}  // namespace
}  // namespace dsv4
