// The DeepSeek-V4 forward on one GPU, device-resident: weights uploaded once, per-sequence state
// on the device, activations fp32, one descriptor upload and one logits download per call.
// Precision::Exact mirrors the CPU reference (oracle goldens); Precision::Fast runs FP8/FP4
// linears on tensor cores (compared statistically).
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/linear.h"
#include "backend/cuda/moe.h"
#include "model/cuda/branches.h"
#include "model/cuda/device_state.h"
#include "model/cuda/device_weights.h"
#include "model/cuda/graph_cache.h"
#include "model/cuda/op_profile.h"

namespace dsv4 {

struct CallBlob;
struct CallSegment;

// One MTP chunk: rows at state->pos…, their input streams (host, [rows, hc_mult · hidden]) and
// token t+1 of each row (model/mtp.h is the CPU twin).
struct DeviceMtpChunk {
  DeviceSequence* state;
  const float* streams;
  std::span<const int32_t> next;
};

struct DeviceChunk {
  DeviceSequence* seq;
  std::span<const int32_t> tokens;  // continue from seq->pos
  bool every_row = false;           // logits of every token of this chunk even when !all_logits
};

class CudaModel {
 public:
  CudaModel(const ModelWeights& w, cuda::Precision precision);
  ~CudaModel();
  const ModelConfig& config() const { return dw_.config; }
  size_t weight_bytes() const { return dw_.bytes; }
  DeviceSequence new_sequence(int64_t capacity) const {
    return DeviceSequence(dw_.config, capacity, index_keys_, kv_format_);
  }
  // How this model's sequences store indexer keys: bf16 in Fast precision where the tensor-core
  // scorer takes the shape (same scores, half the bytes; DSV4_INDEX_KEYS=f32 keeps fp32).
  cuda::KeyFormat index_keys() const { return index_keys_; }
  // How they store attention keys (window ring, compressed entries, the chunk's own keys): bf16
  // in Fast precision where the tensor-core attention takes the shape, which rounds every key to
  // bf16 before its MMAs (same outputs, half the bytes; DSV4_KV=f32 keeps fp32).
  cuda::KeyFormat kv_format() const { return kv_format_; }

  // Same contract as Model::forward: logits [rows, vocab] for every token (all_logits) or for
  // the last token of each chunk, copied to the host. hidden (optional) receives every row's
  // streams after the last block, before hc_head ([rows, hc_mult · hidden], chunk order): the
  // MTP module's input.
  std::vector<float> forward(std::span<const DeviceChunk> chunks, bool all_logits,
                             std::vector<float>* hidden = nullptr);
  // Same, leaving logits on the device (valid until the next call); returns the row count.
  int64_t forward_device(std::span<const DeviceChunk> chunks, bool all_logits, const float** logits,
                         std::vector<float>* hidden = nullptr);
  cudaStream_t stream() const { return stream_; }

  // The MTP module (spec/model.md §5.6), when the checkpoint has mtp.0.*: its own state (one SWA
  // layer) and a forward returning logits for token t+2 (every row when all_logits, else each
  // chunk's last), with the block's output streams of those rows in out_streams.
  bool has_mtp() const { return !dw_.mtp.empty(); }
  DeviceSequence new_mtp_sequence(int64_t capacity) const;
  std::vector<float> mtp_forward(std::span<const DeviceMtpChunk> chunks, bool all_logits,
                                 std::vector<float>* out_streams = nullptr);
  // Tests: fill every scratch buffer with NaN bytes before each call, so a kernel that leaves
  // an element unwritten shows up as NaN in the logits.
  void set_poison(bool on) { poison_ = on; }
  // CUDA graphs for decode-shaped calls (every chunk <= kGraphMaxChunk tokens, <= kGraphMaxRows
  // rows): on by default, off with set_graphs(false) or DSV4_CUDA_GRAPHS=0.
  static constexpr int64_t kGraphMaxChunk = 4, kGraphMaxRows = 512;
  void set_graphs(bool on);
  bool graphs() const { return graphs_on_; }
  const GraphCache::Stats& graph_stats() const { return graphs_.stats(); }
  // Per-op timing of the following calls (forces eager launches, on one stream); nullptr stops it.
  void set_profile(OpProfile* p) { prof_ = p; }
  // Independent chains of a layer on side streams (model/cuda/branches.h): on by default, off with
  // set_branches(false) or DSV4_BRANCHES=0; the outputs are the same bits either way.
  void set_branches(bool on);
  bool branches() const { return branches_on_; }
  // The routed experts' weighted sum made inside hc_post instead of by its own combine kernel
  // (one launch and an [R, d] round trip less a layer; same floats): on by default, off with
  // set_combine_in_hc_post(false) or DSV4_COMBINE_IN_HC_POST=0. Takes effect at the next call
  // (captured graphs are dropped).
  void set_combine_in_hc_post(bool on);
  // The router's selection made in the routed experts' grouping launch (MoeRunner::run_routed;
  // same experts and weights): on by default, off with set_route_in_group(false) or
  // DSV4_ROUTE_IN_GROUP=0.
  void set_route_in_group(bool on);
  // q's per-head norm + RoPE applied by the attention kernel as it stages q (bf16 keys, where
  // cuda::attention_norms_q; same bits) instead of in their own pass: on by default, off with
  // set_q_norm_in_attention(false) or DSV4_ATTN_NORM_Q=0.
  void set_q_norm_in_attention(bool on);

 private:
  struct Workspace;
  struct PlanBuffers;
  struct Rows;
  struct LayerDesc;
  struct Acts;
  Rows gather_rows_of(std::span<const DeviceChunk> chunks, bool all_logits) const;
  Acts scratch(int64_t rows);
  LayerDesc describe_layer(const DeviceLayer& L, size_t li, const Rows& rows, const Acts& a, CallBlob& blob) const;
  void upload_blob(const CallBlob& blob, Acts& a);
  // projected: the previous hc_post did this layer's first hc_pre projection (hc_post_project).
  // next: the hc_pre after this layer (the next layer's), for its last hc_post to project for;
  // returns whether it did.
  bool run_layer(const DeviceLayer& L, size_t li, const float* rope, const LayerDesc& ld, const Rows& rows,
                 const Acts& a, bool projected = false, const cuda::HcParams* next = nullptr);
  const float* head(const cuda::HcParams& hc, const float* norm, const Rows& rows, const Acts& a,
                    std::vector<float>* out_streams);
  void set_launch_switch(bool& flag, bool on);
  void poison_workspace();
  void mark(const char* op);
  std::vector<int64_t> graph_key(const Rows& rows, const std::vector<LayerDesc>& ld, size_t blob_bytes) const;
  void linear(const WeightView& w, const float* x, int64_t rows, float* y, int64_t row_begin = 0,
              int64_t row_end = -1, int64_t ldx = -1, int64_t ldy = -1);
  // A full linear on stream s (the main stream or a side stream of branches_).
  void linear_on(cudaStream_t s, const WeightView& w, const float* x, int64_t rows, float* y);
  // Several full linears on one input (Fast: one activation quantisation at decode sizes).
  void linear_shared_input(std::initializer_list<cuda::FastLinear::Output> outs, const float* x, int64_t rows,
                           int64_t ldx, cudaStream_t s = nullptr);
  // The FastLinear of stream s: each stream has its own (their scratch buffers are per instance).
  cuda::FastLinear& fast_for(cudaStream_t s);

  DeviceWeights dw_;
  cuda::Precision precision_;
  cuda::KeyFormat index_keys_ = cuda::KeyFormat::F32;
  cuda::KeyFormat kv_format_ = cuda::KeyFormat::F32;
  cuda::KeyFormat q_format_ = cuda::KeyFormat::F32;  // q as attention reads it (BF16 only with bf16 keys)
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::FastLinear> fast_;
  std::unique_ptr<cuda::FastLinear> side_fast_[Branches::kSides];
  std::unique_ptr<Branches> branches_;
  bool branches_on_ = true;
  bool combine_in_post_ = true;
  bool route_in_group_ = true;
  bool q_norm_in_attention_ = true;
  bool streams_bf16_ = true;  // Fast past 4 rows: the mHC streams as bf16 (DSV4_STREAMS_BF16=0: fp32)
  std::unique_ptr<cuda::MoeRunner> moe_;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<PlanBuffers> plans_;
  bool poison_ = false;
  GraphCache graphs_;
  bool graphs_on_ = true;
  OpProfile* prof_ = nullptr;
};

}  // namespace dsv4
