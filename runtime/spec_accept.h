// The acceptance rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a draft
// token x drawn from q is kept with probability min(1, p(x)/q(x)); on rejection the token is
// drawn from norm(max(p − q, 0)). The emitted token is then distributed exactly as p. With
// greedy decoding p and q are one-hot and this is "keep x iff it is the target's argmax".
#pragma once
#include <cstdint>
#include <span>

namespace dsv4 {

struct DraftVerdict {
  bool accepted;
  int32_t token;  // x when accepted, else the replacement
};

// u_accept, u_resample: independent uniforms in [0, 1).
DraftVerdict verify_draft(std::span<const double> p, std::span<const double> q, int32_t x, double u_accept,
                          double u_resample);

// Inverse-CDF draw from p (skips zeros; the last kept token absorbs rounding).
int32_t draw_token(std::span<const double> p, double u);

// Salts of the uniform streams a speculative round uses besides the normal draw (seed, step).
inline uint64_t spec_seed(uint64_t seed, uint64_t salt) { return seed ^ (0xA24BAED4963EE407ull * (salt + 1)); }
enum SpecSalt : uint64_t { kSaltDraft = 1, kSaltAccept = 2, kSaltResample = 3 };

}  // namespace dsv4
