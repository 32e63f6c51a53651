// ModelWeights uploaded to the GPU once: every checkpoint tensor's bytes copied as stored (FP8 and
// FP4 stay packed), small fp32 vectors copied, and the same structure re-pointed at device memory.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "model/weights.h"

namespace dsv4 {

struct DeviceCompressor {
  WeightView wkv, wgate;
  const float* ape = nullptr;
  const float* norm = nullptr;
};

struct DeviceLayer {
  AttnKind kind = AttnKind::SWA;
  int64_t ratio = 0;
  bool hash = false;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  cuda::HcParams hc_attn{}, hc_ffn{};
  WeightView wq_a, wq_b, wkv, wo_a, wo_b;
  const float *q_norm = nullptr, *kv_norm = nullptr, *sink = nullptr;
  DeviceCompressor compressor;
  WeightView idx_wq_b, idx_weights_proj;
  DeviceCompressor idx_compressor;
  WeightView gate;
  const float* gate_bias = nullptr;
  const int32_t* tid2eid = nullptr;
  cuda::ExpertSet experts;
  WeightView shared_w1, shared_w2, shared_w3;
};

// The MTP module mtp.0 (spec/model.md §5.6): its decoder block runs like a main SWA layer.
struct DeviceMtp {
  DeviceLayer block;
  WeightView e_proj, h_proj;
  const float *enorm = nullptr, *hnorm = nullptr, *norm = nullptr;
  cuda::HcParams hc_head{};
};

struct DeviceWeights {
  ModelConfig config;
  WeightView embed, head;
  const float* norm = nullptr;
  cuda::HcParams hc_head{};
  std::vector<DeviceLayer> layers;
  std::vector<DeviceMtp> mtp;  // empty when the checkpoint has no mtp.* tensors
  const float *rope_swa = nullptr, *rope_compressed = nullptr;  // inv_freq tables
  size_t bytes = 0;                                             // device bytes held
  std::vector<cuda::DeviceBuffer> storage;
  std::shared_ptr<Checkpoint> source;  // keeps in-place device tensors (random weights) alive
};

// Copies the checkpoint tensors the model uses to the device (one allocation) and builds views.
DeviceWeights upload_weights(const ModelWeights& w);

}  // namespace dsv4
