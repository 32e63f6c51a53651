// What the serving runtime needs from a model implementation: sequences with state, one batched
// forward over chunks of several sequences, state size, and snapshot/restore of a sequence's
// whole state (prefix caching). The CPU Model and the CUDA model each sit behind a small
// adapter; the engine never sees SequenceState or DeviceSequence.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// One sequence's decoding state inside a backend. Released (memory returned) when destroyed.
class BackendSequence {
 public:
  virtual ~BackendSequence() = default;
  virtual int64_t pos() const = 0;       // tokens consumed so far
  virtual size_t bytes() const = 0;      // memory held now
};

// An immutable copy of a sequence's state at some position; restore() makes a new sequence
// that continues exactly as the original did from that position.
class BackendSnapshot {
 public:
  virtual ~BackendSnapshot() = default;
  virtual int64_t pos() const = 0;
  virtual size_t bytes() const = 0;
};

struct BackendChunk {
  BackendSequence* seq;
  std::span<const int32_t> tokens;  // continues from seq->pos()
  bool want_logits;                 // return the logits of this chunk's last token
  // Speculative verification: logits of every token, and accept() must end the round.
  bool verify = false;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual const ModelConfig& config() const = 0;
  // True when a sequence's memory is allocated for its whole capacity up front (GPU): the
  // engine then reserves budget for prompt + max_tokens at admission instead of growing.
  virtual bool fixed_capacity() const = 0;
  // A fresh sequence able to hold `capacity` tokens (ignored by backends that grow).
  virtual std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) = 0;
  // Runs every chunk (distinct sequences) in one call, advancing their states. Returns
  // [k, vocab] logits in chunk order: one row per chunk with want_logits, every row of a verify chunk.
  virtual std::vector<float> forward(std::span<const BackendChunk> chunks) = 0;

  // MTP speculative decoding (model/speculative.h). A round per sequence: draft() k times
  // (tokens[i]: the token about to be fed to seqs[i] on the first call, the previous draft
  // after; returns [seqs, vocab] draft logits), a verify forward of those k+1 tokens, then
  // accept(seq, new_pos) keeping the first new_pos tokens and rolling back the rest.
  virtual bool has_mtp() const { return false; }
  virtual std::vector<float> draft(std::span<BackendSequence* const> seqs, std::span<const int32_t> tokens);
  virtual void accept(BackendSequence& seq, int64_t new_pos);
  virtual std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) = 0;
  virtual std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) = 0;
};

}  // namespace dsv4
