// One rank's weights out of the whole model's: views into the same mmap'd checkpoint, so a
// rank only touches the bytes of its slices (row slices are plain views; column slices,
// which the stored layouts cannot express as a view, are copied once into rank-owned memory).
//   TP: wq_b rows and attn_sink of the rank's heads, wo_a rows and wo_b columns of its output
//       groups, shared expert w1/w3 rows and w2 columns of its slice of the intermediate dim.
//       The config's num_heads / o_groups become the rank's counts, so the unchanged attention
//       code runs on the slice; wo_b and shared w2 outputs are partial sums (all-reduced).
//   EP: routed experts of the rank's contiguous block; the others are left empty.
//   Replicated: embedding, head, norms, mHC, wq_a, wkv, compressors, indexer, router, MTP.
// FP8 128×128 blocks must not be cut: row/column slice starts must be multiples of 128 (32
// for FP4 columns); anything else is an Error naming the tensor.
#pragma once
#include "model/parallel/shard_spec.h"
#include "model/weights.h"

namespace dsv4 {

ModelWeights shard_weights(const ModelWeights& full, const ShardSpec& spec);

// Rows [r0, r0 + n) / columns [c0, c0 + n) of a stored matrix; `name` is for errors. Column
// slices append their bytes to `store`.
WeightView slice_rows(const WeightView& w, int64_t r0, int64_t n, const std::string& name);
WeightView slice_cols(const WeightView& w, int64_t c0, int64_t n, const std::string& name,
                      std::vector<std::shared_ptr<const std::vector<uint8_t>>>& store);

}  // namespace dsv4
