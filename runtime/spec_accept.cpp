#include "runtime/spec_accept.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace dsv4 {

int32_t draw_token(std::span<const double> p, double u) {
  double total = 0;
  for (double v : p) total += v;
  const double target = u * total;
  double c = 0;
  int32_t tok = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    tok = static_cast<int32_t>(i);
    if ((c += p[i]) > target) break;
  }
  DSV4_CHECK(tok >= 0, "draw_token: empty distribution");
  return tok;
}

DraftVerdict verify_draft(std::span<const double> p, std::span<const double> q, int32_t x, double u_accept,
                          double u_resample) {
  DSV4_CHECK(p.size() == q.size() && x >= 0 && static_cast<size_t>(x) < p.size(), "verify_draft: bad input");
  const double px = p[x], qx = q[x];
  if (qx <= 0 ? px > 0 : u_accept * qx < px) return {true, x};  // u < p/q without dividing
  std::vector<double> r(p.size());
  double mass = 0;
  for (size_t i = 0; i < p.size(); ++i) mass += (r[i] = std::max(p[i] - q[i], 0.0));
  // mass = 0 only when p == q (then every draft is kept): guard rounding with p itself.
  return {false, draw_token(mass > 0 ? std::span<const double>(r) : p, u_resample)};
}

}  // namespace dsv4
