#include "model/parallel/moe_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/moe.h"

namespace dsv4 {

namespace {

// all_to_all_v, or a copy when the EP degree is 1 (everything stays on this rank).
void exchange(Communicator* c, const void* send, const std::vector<size_t>& sb, void* recv, const std::vector<size_t>& rb) {
  if (c) return c->all_to_all_v(send, sb, recv, rb);
  if (sb[0]) std::memcpy(recv, send, sb[0]);
}

std::vector<size_t> times(const std::vector<int64_t>& counts, size_t bytes_each) {
  std::vector<size_t> b(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) b[i] = static_cast<size_t>(counts[i]) * bytes_each;
  return b;
}

}  // namespace

void moe_forward_parallel(const MoeWeights& w, const ModelConfig& cfg, bool hash, const BatchRows& batch,
                          const float* u, float* out, const RankContext& par) {
  const int64_t R = batch.rows, d = cfg.hidden_size, E = cfg.n_routed_experts, K = cfg.num_experts_per_tok;
  const float limit = static_cast<float>(cfg.swiglu_limit);
  const Routing rt = route(w, cfg, hash, batch, u);

  std::vector<float> shared(R * d);
  swiglu_expert(w.shared, limit, u, R, shared.data());
  if (par.tp) par.tp->all_reduce_sum(shared.data(), shared.size());

  const int P = par.ep ? par.ep->size() : 1, me = par.ep ? par.ep->rank() : 0;
  const int64_t Er = E / P, B = (R + P - 1) / P;
  const int64_t r0 = std::min<int64_t>(R, me * B), r1 = std::min<int64_t>(R, r0 + B);

  // Dispatch: picks (index r·K + k) of our rows, grouped by the rank owning their expert.
  std::vector<std::vector<int64_t>> picks_to(P);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = 0; k < K; ++k) picks_to[rt.experts[r * K + k] / Er].push_back(r * K + k);
  std::vector<int64_t> send_n(P);
  for (int j = 0; j < P; ++j) send_n[j] = static_cast<int64_t>(picks_to[j].size());
  const std::vector<int64_t> recv_n = par.ep ? par.ep->all_to_all_counts(send_n) : send_n;
  int64_t n_send = 0, n_recv = 0;
  for (int j = 0; j < P; ++j) n_send += send_n[j], n_recv += recv_n[j];

  std::vector<float> x_send(n_send * d), x_recv(n_recv * d);
  std::vector<int32_t> e_send(n_send), e_recv(n_recv);
  std::vector<int64_t> slot_of(R * K, -1);  // where a pick's result comes back
  int64_t s = 0;
  for (int j = 0; j < P; ++j)
    for (int64_t pk : picks_to[j]) {
      std::copy_n(u + (pk / K) * d, d, x_send.data() + s * d);
      e_send[s] = rt.experts[pk];
      slot_of[pk] = s++;
    }
  exchange(par.ep, x_send.data(), times(send_n, d * sizeof(float)), x_recv.data(), times(recv_n, d * sizeof(float)));
  exchange(par.ep, e_send.data(), times(send_n, sizeof(int32_t)), e_recv.data(), times(recv_n, sizeof(int32_t)));

  // Our experts over the rows they received, each expert's weights read once.
  std::vector<std::vector<int64_t>> got(E);
  for (int64_t i = 0; i < n_recv; ++i) got[e_recv[i]].push_back(i);
  std::vector<float> y_recv(n_recv * d), xs, ys;
  for (int64_t e = 0; e < E; ++e) {
    const auto& idx = got[e];
    if (idx.empty()) continue;
    DSV4_CHECK(!w.experts[e].w1.empty(), "EP rank ", me, " received rows for expert ", e, ", which it does not hold");
    const int64_t n = static_cast<int64_t>(idx.size());
    xs.resize(n * d);
    ys.resize(n * d);
    for (int64_t i = 0; i < n; ++i) std::copy_n(x_recv.data() + idx[i] * d, d, xs.data() + i * d);
    swiglu_expert(w.experts[e], limit, xs.data(), n, ys.data());
    for (int64_t i = 0; i < n; ++i) std::copy_n(ys.data() + i * d, d, y_recv.data() + idx[i] * d);
  }

  // Combine: results travel back along the same blocks.
  std::vector<float> y_back(n_send * d);
  exchange(par.ep, y_recv.data(), times(recv_n, d * sizeof(float)), y_back.data(), times(send_n, d * sizeof(float)));

  std::vector<float> mine(B * d, 0.0f);
  std::vector<int64_t> order(K);
  for (int64_t r = r0; r < r1; ++r) {
    float* o = mine.data() + (r - r0) * d;
    std::copy_n(shared.data() + r * d, d, o);
    for (int64_t k = 0; k < K; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return rt.experts[r * K + a] < rt.experts[r * K + b]; });
    for (int64_t k : order) {
      const float wt = rt.weights[r * K + k];
      const float* y = y_back.data() + slot_of[r * K + k] * d;
      for (int64_t c = 0; c < d; ++c) o[c] += wt * y[c];
    }
  }
  if (!par.ep) {
    std::copy_n(mine.data(), R * d, out);
    return;
  }
  std::vector<float> all(static_cast<size_t>(P) * B * d);
  par.ep->all_gather(mine.data(), mine.size(), all.data());
  std::copy_n(all.data(), R * d, out);  // rank j's block holds rows [j·B, (j+1)·B)
}

}  // namespace dsv4
