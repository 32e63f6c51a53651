// The tensor inventory a config implies (spec/model.md §3.2) and validation of a checkpoint's
// tensor list against it. Works on metadata alone, so it is tested on full V4-Flash/V4-Pro
// manifests without any weight data.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace dsv4 {

// How a linear weight is stored.
enum class LinearFormat {
  Dense,      // BF16 / F32 / F16 weight, no scale
  FP8Block,   // F8_E4M3 weight + `.scale` [ceil(out/128), ceil(in/128)] in F8_E8M0 or F32
  FP4Group32  // I8 (or U8) packed e2m1 [out, in/2] + `.scale` [out, in/32] F8_E8M0
};

struct CheckpointFormat {
  LinearFormat linears = LinearFormat::Dense;  // the FP8-able linears (wq_a, wq_b, wkv, wo_a, wo_b, ...)
  LinearFormat experts = LinearFormat::Dense;  // routed experts
  bool has_mtp = false;                        // mtp.{j}.* present (all of them, validated)
};

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<DType> dtypes;  // any of these is accepted
};

// Every tensor the checkpoint must hold for this config and format (weights and `.scale`s).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg, const CheckpointFormat& fmt);

// Detects the format from dtypes (spec §8.9: I8 expert weights => FP4, F8_E4M3 => FP8 block),
// then checks that every expected tensor is present with the right shape and dtype and that no
// unexpected tensor is left over. Errors name the tensor (and expected vs found shape/dtype).
CheckpointFormat validate_checkpoint(const ModelConfig& cfg, const std::map<std::string, TensorInfo>& tensors);

}  // namespace dsv4
