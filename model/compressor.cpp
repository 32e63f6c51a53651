#include "model/compressor.h"

#include <cmath>

#include "backend/cpu/linear.h"
#include "backend/cpu/ops.h"
#include "core/error.h"

namespace dsv4 {

void compressor_project(const CompressorWeights& w, const CompressorSpec& spec, const BatchRows& batch,
                        const float* u, std::vector<float>& a, std::vector<float>& z) {
  const int64_t width = (spec.overlap ? 2 : 1) * spec.width, R = batch.rows;
  a.resize(R * width);
  z.resize(R * width);
  cpu::linear(w.wkv, u, R, a.data());
  cpu::linear(w.wgate, u, R, z.data());
  for (int64_t r = 0; r < R; ++r) {
    const float* ape = w.ape.data() + (batch.pos[r] % spec.ratio) * width;
    for (int64_t c = 0; c < width; ++c) z[r * width + c] += ape[c];
  }
}

void compressor_segment(const CompressorWeights& w, const CompressorSpec& spec, const RopeFreqs& rope,
                        const float* a, const float* z, int64_t p0, int64_t n, CompressorState& st,
                        std::vector<float>& entries) {
  const int64_t m = spec.ratio, c = spec.width, width = (spec.overlap ? 2 : 1) * c;
  DSV4_CHECK(st.start + static_cast<int64_t>(st.a.size()) / width == p0, "compressor state out of sync");
  st.a.insert(st.a.end(), a, a + n * width);
  st.z.insert(st.z.end(), z, z + n * width);
  const int64_t end = p0 + n;
  int64_t next_w = static_cast<int64_t>(entries.size()) / c;
  std::vector<float> C(c), logits(2 * m), vals(2 * m);
  auto row = [&](int64_t pos) { return (pos - st.start) * width; };
  for (; (next_w + 1) * m <= end; ++next_w) {
    for (int64_t ch = 0; ch < c; ++ch) {
      int64_t ns = 0;
      if (spec.overlap && next_w > 0) {  // lo-halves of the previous window
        for (int64_t p = (next_w - 1) * m; p < next_w * m; ++p) {
          logits[ns] = st.z[row(p) + ch];
          vals[ns++] = st.a[row(p) + ch];
        }
      }
      const int64_t off = spec.overlap ? c : 0;  // hi-halves (or the whole vector) of this window
      for (int64_t p = next_w * m; p < (next_w + 1) * m; ++p) {
        logits[ns] = st.z[row(p) + off + ch];
        vals[ns++] = st.a[row(p) + off + ch];
      }
      float mx = logits[0];
      for (int64_t i = 1; i < ns; ++i) mx = std::max(mx, logits[i]);
      float den = 0, num = 0;
      for (int64_t i = 0; i < ns; ++i) {
        const float e = std::exp(logits[i] - mx);
        den += e;
        num += e * vals[i];
      }
      C[ch] = num / den;
    }
    cpu::rms_norm(C.data(), w.norm.data(), C.data(), 1, c, spec.eps);
    cpu::rope_inplace(C.data(), c, rope.inv_freq.data(), rope.pairs(), next_w * m, false);
    entries.insert(entries.end(), C.begin(), C.end());
  }
  // Keep what the next entries need: the open window, plus the previous one for the overlap.
  const int64_t keep = std::min(st.pin, std::max<int64_t>(0, (spec.overlap ? next_w - 1 : next_w) * m));
  if (keep > st.start) {
    const int64_t drop = (keep - st.start) * width;
    st.a.erase(st.a.begin(), st.a.begin() + drop);
    st.z.erase(st.z.begin(), st.z.begin() + drop);
    st.start = keep;
  }
}

}  // namespace dsv4
