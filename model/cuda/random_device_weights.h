// Random weights at real V4 shapes for benchmarks (`dsv4 bench --random-weights`): matrices are
// generated on the device in their stored formats (FP8 blocks, FP4 groups, BF16), small vectors
// on the host; the result binds like a loaded checkpoint.
#pragma once
#include <cstdint>

#include "io/config.h"
#include "model/weights.h"

namespace dsv4 {

ModelWeights random_device_weights(const ModelConfig& cfg, uint64_t seed);

// Built-in configs: "v4-flash", "v4-pro" (spec/model.md §2.1), optionally cut to `layers`.
ModelConfig preset_config(const std::string& name, int64_t layers);

}  // namespace dsv4
