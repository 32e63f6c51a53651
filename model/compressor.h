// Learned gated-pooling KV compressor (spec/model.md §5.3): one entry per m tokens, with the
// overlapping 8-slot scheme for CSA (m = 4). Works on any chunk of tokens: complete windows are
// pooled, the rest stays in CompressorState for the next call.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "model/rope.h"
#include "model/weights.h"

namespace dsv4 {

struct CompressorSpec {
  int64_t ratio;   // m
  bool overlap;    // CSA scheme (coff = 2)
  int64_t width;   // c: output entry width
  float eps;
};

// u: [R, d] sub-layer input of all rows. For each segment, appends the entries that close inside
// its chunk to `entries_of(segment)` (n × c, normalised, RoPE'd at w·m) and updates its state.
// state_of / entries_of pick the per-layer state of a segment.
template <typename StateOf, typename EntriesOf>
void compressor_forward(const CompressorWeights& w, const CompressorSpec& spec, const RopeFreqs& rope,
                        const BatchRows& batch, const float* u, int64_t d, StateOf state_of, EntriesOf entries_of);

// Non-template core used by the template above.
void compressor_project(const CompressorWeights& w, const CompressorSpec& spec, const BatchRows& batch,
                        const float* u, std::vector<float>& a, std::vector<float>& z);
void compressor_segment(const CompressorWeights& w, const CompressorSpec& spec, const RopeFreqs& rope,
                        const float* a, const float* z, int64_t p0, int64_t n, CompressorState& st,
                        std::vector<float>& entries);

template <typename StateOf, typename EntriesOf>
void compressor_forward(const CompressorWeights& w, const CompressorSpec& spec, const RopeFreqs& rope,
                        const BatchRows& batch, const float* u, int64_t d, StateOf state_of, EntriesOf entries_of) {
  std::vector<float> a, z;
  compressor_project(w, spec, batch, u, a, z);
  const int64_t width = (spec.overlap ? 2 : 1) * spec.width;
  for (const auto& s : batch.segs)
    compressor_segment(w, spec, rope, a.data() + s.row0 * width, z.data() + s.row0 * width, s.p0, s.n, state_of(s),
                       entries_of(s));
}

}  // namespace dsv4
