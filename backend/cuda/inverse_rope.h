// The inverse RoPE that the attention output undergoes before the output projection (spec:
// the rotary part of each head is rotated back by the query's position), as a description that
// the activation quantisation can apply on its way (act_quant_fp8_inverse_rope).
#pragma once
#include <cstdint>

namespace dsv4::cuda {

// Rows of heads of head_len channels: the last 2 * pairs channels of each head are interleaved
// pairs rotated by -pos[r] * inv_freq[i] (ops.h rope(..., inverse = true)). Device pointers.
struct InverseRope {
  const float* inv_freq;  // [pairs]
  int64_t pairs;
  const int64_t* pos;  // [rows]
  int64_t head_len;
};

}  // namespace dsv4::cuda
