// DeepSeek-V4 weights bound to a checkpoint: big matrices stay as stored (views into the mmap),
// small vectors (norms, mHC, sinks, ape, router bias) are copied to fp32.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/weight_view.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/inventory.h"

namespace dsv4 {

using Vec = std::vector<float>;

struct HcWeights {
  Vec fn;     // [(2+n)n, n*d] for sub-layers, [n, n*d] for the head
  Vec base;   // [(2+n)n] or [n]
  Vec scale;  // [3] or [1]
};

struct CompressorWeights {
  WeightView wkv, wgate;  // [coff*c, d]; coff = 2 with overlap (CSA), 1 without (HCA)
  Vec ape;                // [m, coff*c]
  Vec norm;               // [c]
};

struct IndexerWeights {
  WeightView wq_b;          // [nI*dI, q_lora]
  WeightView weights_proj;  // [nI, d]
  CompressorWeights compressor;
};

struct AttentionWeights {
  WeightView wq_a, wq_b, wkv, wo_a, wo_b;
  Vec q_norm, kv_norm, sink;
  bool has_compressor = false, has_indexer = false;
  CompressorWeights compressor;
  IndexerWeights indexer;
};

struct ExpertWeights {
  WeightView w1, w2, w3;  // gate [I, d], down [d, I], up [I, d]
};

struct MoeWeights {
  WeightView gate;               // router [E, d]
  Vec bias;                      // [E] (non-hash layers)
  std::vector<int32_t> tid2eid;  // [vocab, top_k] (hash layers)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

struct LayerWeights {
  AttnKind kind = AttnKind::SWA;
  int64_t ratio = 0;  // compression ratio m (0 for SWA)
  bool hash = false;
  Vec attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  MoeWeights ffn;
};

struct MtpWeights {
  LayerWeights block;
  WeightView e_proj, h_proj;
  Vec enorm, hnorm, norm;
  HcWeights hc_head;
};

struct ModelWeights {
  ModelConfig config;
  CheckpointFormat format;
  WeightView embed, head;
  Vec norm;
  HcWeights hc_head;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;
  std::shared_ptr<Checkpoint> checkpoint;  // keeps the mmaps alive
  // Bytes of views that are not in the mmap: a TP rank's column slices (model/parallel).
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> slices;
};

// Loads config.json + safetensors from `dir`, validates the inventory, binds views.
ModelWeights load_weights(const std::string& dir);
ModelWeights bind_weights(const ModelConfig& cfg, std::shared_ptr<Checkpoint> ckpt);

}  // namespace dsv4
