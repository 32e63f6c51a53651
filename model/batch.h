// The rows of one forward call: several sequences' chunks concatenated (continuous batching).
#pragma once
#include <cstdint>
#include <vector>

#include "model/state.h"

namespace dsv4 {

struct BatchRows {
  struct Segment {
    SequenceState* state;
    int64_t row0;  // first row of this segment in the batch
    int64_t n;     // rows (tokens) of this segment
    int64_t p0;    // absolute position of its first token (= state->pos before the call)
  };
  int64_t rows = 0;
  std::vector<int64_t> pos;    // absolute position per row
  std::vector<int32_t> token;  // token id per row
  std::vector<Segment> segs;
};

}  // namespace dsv4
