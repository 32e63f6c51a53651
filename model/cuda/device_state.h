// Per-sequence decoding state on the GPU (spec/model.md §6): per layer the sliding-window ring,
// compressor input rings (previous + open window for CSA, open window for HCA, indexer likewise),
// and the compressed entries / indexer keys up to a fixed context capacity. One allocation.
#pragma once
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "io/config.h"

namespace dsv4 {

struct DeviceLayerState {
  float* ring = nullptr;          // [W, D] in the sequence's kv format (bf16 rows: D / 2 float slots), slot = pos % W
  float *cmp_a = nullptr, *cmp_z = nullptr;  // [cmp_rows, cmp_width]
  int64_t cmp_rows = 0, cmp_width = 0;
  float *idx_a = nullptr, *idx_z = nullptr;  // [idx_rows, idx_width]
  int64_t idx_rows = 0, idx_width = 0;
  float* entries = nullptr;       // [capacity / m, D] in the kv format
  void* idx_keys = nullptr;       // [capacity / m, dI] in the sequence's index_keys format
};

class DeviceSequence {
 public:
  // index_keys: how the CSA layers' indexer keys are stored (bf16 by a Fast model whose scorer
  // takes them, see cuda::KeyFormat); kv: how the attention keys (window ring, compressed
  // entries) are stored (bf16 by a Fast model on the tensor-core attention).
  DeviceSequence(const ModelConfig& cfg, int64_t capacity, cuda::KeyFormat index_keys = cuda::KeyFormat::F32,
                 cuda::KeyFormat kv = cuda::KeyFormat::F32);
  cuda::KeyFormat index_keys() const { return index_keys_; }
  cuda::KeyFormat kv_format() const { return kv_; }
  // Float slots per stored attention key: D (fp32) or D / 2 (bf16 pairs).
  int64_t kv_slots() const { return D0_; }
  int64_t pos = 0;  // tokens consumed
  int64_t capacity() const { return capacity_; }
  size_t bytes() const { return buf_.bytes(); }
  std::vector<DeviceLayerState> layers;
  // Makes this sequence continue exactly like `src` (device-to-device copies of the rings, the
  // closed entries and indexer keys). Needs capacity() >= src.pos. Ordered on `stream`.
  void copy_state_from(const DeviceSequence& src, cudaStream_t stream);

  // Speculative verify rollback (spec/model.md §6). begin_verify saves the ring rows that the next
  // forward of n tokens will overwrite (window slots and compressor/indexer rows of positions
  // [pos, pos + n)); truncate(new_pos) puts back those of positions >= new_pos and rewinds pos, so
  // the state is bitwise that of a run that stopped at new_pos. Closed entries and indexer keys
  // need no copy: their counts derive from pos and re-closing a window rewrites its entry.
  // Both are ordered on `stream`; truncate(pos) keeps everything (accept all).
  void begin_verify(int64_t n, cudaStream_t stream);
  void truncate(int64_t new_pos, cudaStream_t stream);
  // The largest n begin_verify takes: no ring row may be written twice by one verify, since only
  // its pre-verify content is saved (the smallest ring: W, or m rows for HCA).
  int64_t max_verify_tokens() const { return max_verify_; }
  // Position of the pending verify's first saved row; -1 when none is pending.
  int64_t verify_start() const { return undo_p0_; }

 private:
  int64_t capacity_;
  std::vector<int64_t> ratio_, D_, idx_key_bytes_;  // per layer: compression ratio, entry widths, bytes per indexer key
  int64_t W_ = 0, D0_ = 0, max_verify_ = 0;
  cuda::KeyFormat index_keys_, kv_;
  cuda::DeviceBuffer buf_;
  cuda::DeviceBuffer undo_;              // saved rows of the pending verify, grown on demand
  int64_t undo_p0_ = -1, undo_n_ = 0;    // positions [undo_p0_, undo_p0_ + undo_n_) saved; -1 = none
};

}  // namespace dsv4
