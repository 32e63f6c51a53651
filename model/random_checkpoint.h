// Random checkpoints in the official layout (spec/model.md §3, §10): FP8 128×128-block linears
// with E8M0 scales, FP4 experts with per-32 E8M0 scales, plus the dequantised BF16 twin that the
// oracle (HF transformers, fp32) loads. Deterministic in (config, seed) on any machine.
#pragma once
#include <cstdint>
#include <string>

#include "io/config.h"

namespace dsv4 {

struct RandomCheckpointOptions {
  uint64_t seed = 1;
  bool with_mtp = true;  // write mtp.{j}.* when num_nextn_predict_layers > 0
  // Multiplies the init std of every sub-layer output projection (wo_b, expert/shared w2).
  // Below 1 the residual stream dominates each block, as in trained models: the test model is
  // then well conditioned instead of chaotic, so reduced-precision paths can be compared
  // statistically (random tiny models at 1.0 amplify any rounding, spec/model.md §10).
  float output_scale = 1.0f;
};

// Writes `dir/config.json` + safetensors: quantised when `quantized`, else the dequantised twin
// (same names, BF16 linears and experts, no quantization_config). Both share the same values.
void write_random_checkpoint(const ModelConfig& cfg, const std::string& dir, bool quantized,
                             const RandomCheckpointOptions& opt);

// The built-in tiny configuration shipped as models/tiny (every layer kind, hash layers, YaRN).
ModelConfig tiny_config();

}  // namespace dsv4
