// Parity of cuda::moe_route with route() (model/moe.cpp). route() takes the router input u and
// a gate matrix; an identity gate makes its logits equal u exactly. Rows whose top-(K+1)
// biased scores come within 1e-4 of each other are redrawn, so libm ulp differences between
// host and device cannot flip a pick; experts must then match exactly.
#include <algorithm>
#include <cmath>

#include "backend/cuda/ops.h"
#include "model/moe.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::poisoned;
using test::randn;
using test::rel_error;

bool well_separated(const float* l, const std::vector<float>& bias, int64_t E, int64_t K) {
  std::vector<double> b(E);
  for (int64_t e = 0; e < E; ++e) {
    const double x = l[e];
    b[e] = std::sqrt(x > 20 ? x : std::log1p(std::exp(x))) + bias[e];
  }
  std::sort(b.begin(), b.end(), std::greater<>());
  for (int64_t k = 0; k < K; ++k)
    if (b[k] - b[k + 1] < 1e-4) return false;
  return true;
}

void run_case(int64_t R, int64_t E, int64_t K, bool hash) {
  const int64_t V = 1000;
  ModelConfig cfg;
  cfg.n_routed_experts = E;
  cfg.num_experts_per_tok = K;
  cfg.vocab_size = V;
  cfg.routed_scaling_factor = 2.5;
  MoeWeights w;
  w.bias = randn(E, 0.3f);
  std::vector<float> eye(E * E, 0.0f);
  for (int64_t e = 0; e < E; ++e) eye[e * E + e] = 1.0f;
  w.gate.format = WeightFormat::Dense;
  w.gate.dtype = DType::F32;
  w.gate.out = w.gate.in = E;
  w.gate.data = reinterpret_cast<const uint8_t*>(eye.data());
  w.tid2eid.resize(V * K);
  for (int64_t t = 0; t < V; ++t)
    for (int64_t k = 0; k < K; ++k) w.tid2eid[t * K + k] = static_cast<int32_t>((t * 7 + k * 13) % E);
  std::vector<float> logits = randn(R * E, 3.0f);
  for (int64_t r = 0; r < R; ++r)
    while (!hash && !well_separated(logits.data() + r * E, w.bias, E, K)) {
      const std::vector<float> redo = randn(E, 3.0f);
      std::copy(redo.begin(), redo.end(), logits.begin() + r * E);
    }
  BatchRows batch;
  batch.rows = R;
  batch.pos.assign(R, 0);
  batch.token.resize(R);
  for (auto& t : batch.token) t = static_cast<int32_t>(test::rng()() % V);
  const Routing rt = route(w, cfg, hash, batch, logits.data());

  DeviceBuffer dl = to_device(logits), db = to_device(w.bias), dt = to_device(w.tid2eid), dtok = to_device(batch.token);
  DeviceBuffer dex = poisoned<int32_t>(R * K), dwt = poisoned<float>(R * K);
  cuda::moe_route(dl.as<float>(), db.as<float>(), hash ? dt.as<int32_t>() : nullptr, dtok.as<int32_t>(), R, E, K, 2.5f,
                  dex.as<int32_t>(), dwt.as<float>(), nullptr);
  EXPECT_EQ(to_host<int32_t>(dex, R * K), rt.experts);
  EXPECT_LE(rel_error(to_host<float>(dwt, R * K), rt.weights), 1e-5);
}

TEST(CudaOpsMoeRoute, TopkMatchesRouteFlashShapes) {
  DSV4_REQUIRE_GPU();
  run_case(300, 256, 6, false);
}
TEST(CudaOpsMoeRoute, HashMatchesRoute) {
  DSV4_REQUIRE_GPU();
  run_case(37, 256, 6, true);
}
TEST(CudaOpsMoeRoute, TinyModelShapes) {
  DSV4_REQUIRE_GPU();
  run_case(9, 8, 2, false);
}

}  // namespace
}  // namespace dsv4
