// Memory accounting for per-sequence state (spec/model.md §6), computed from the config:
//   fixed per sequence : window rings of every layer + the largest possible compressor pending
//                        rows (open window, and for CSA the previous window for the overlap)
//                        + with MTP speculation, the module's ring and stream feed;
//   per token, per kind: CSA entries, CSA indexer keys, HCA entries (one per m tokens).
// One byte budget covers all kinds. Growth is page-granular: a page of a kind holds
// `page_entries` entries of every layer of that kind, so admission/growth/release touch a
// handful of counters (O(1)) and a sequence's pages return at once when it finishes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "io/config.h"

namespace dsv4 {

// What one sequence holds, from the config (fp32 elements, the layout of SequenceState and of
// the CUDA DeviceSequence).
struct StateCosts {
  struct Kind {
    std::string name;    // "csa-entries", "csa-indexer-keys", "hca-entries"
    int64_t ratio;       // tokens per entry (m)
    size_t entry_bytes;  // bytes of one entry summed over the layers of this kind
  };
  size_t window_bytes = 0;       // all layers' sliding-window rings
  size_t pending_max_bytes = 0;  // worst case over positions of the compressor pending rows
  std::vector<Kind> kinds;       // one per (attention kind, ratio) present in the model
  std::vector<int64_t> pending_ratio;     // per compressing layer: m
  std::vector<size_t> pending_row_bytes;  // per compressing layer: bytes of one pending row (a + z, incl. indexer)
  std::vector<bool> pending_overlap;      // per compressing layer: CSA keeps the previous window too

  // MTP speculation with k drafts (state_costs(cfg, k)): the module's own window ring plus its
  // feed of target streams (model/mtp_feed.h, at most a window of rows); and what a verify
  // forward of k + 1 tokens holds until accept(): compressor rows of windows that closed during
  // it (pinned for a rollback, ≤ m·ceil((k+1)/m) rows per compressor) and the saved ring slots
  // (state_undo.h). 0 without speculation.
  size_t mtp_bytes = 0, verify_bytes = 0;

  size_t fixed_bytes() const { return window_bytes + pending_max_bytes + mtp_bytes + verify_bytes; }
  // Exactly what a SequenceState holds after `tokens` tokens.
  size_t bytes_at(int64_t tokens) const;
  // Average per-token bytes of the growing kinds (for reports).
  double bytes_per_token() const;
};

StateCosts state_costs(const ModelConfig& cfg, int64_t speculative_tokens = 0);

// Parses "1073741824", "1GiB", "512MiB", "1.5G", "64K" (binary units; B optional).
size_t parse_memory_size(const std::string& text);
// GPU budget in the vLLM manner: utilization × total minus what is already used (weights,
// workspaces). Throws when nothing is left.
size_t gpu_kv_budget(size_t total_bytes, size_t used_bytes, double utilization);
std::string format_bytes(double bytes);

class KvBudget {
 public:
  // Pages of every kind a sequence holds, plus its fixed part.
  struct Reservation {
    int64_t tokens = 0;  // capacity covered
    std::vector<int64_t> pages;
    size_t bytes = 0;
    bool active = false;
  };

  KvBudget(StateCosts costs, size_t budget_bytes, int64_t page_entries = 16);

  const StateCosts& costs() const { return costs_; }
  size_t budget() const { return budget_; }
  size_t used() const;
  size_t free() const { return budget_ - used(); }
  int64_t page_entries() const { return page_entries_; }
  // Bytes a reservation covering `tokens` tokens holds (fixed part + whole pages).
  size_t bytes_for(int64_t tokens) const;
  // Grows (never shrinks) `r` to cover `tokens`. False, leaving r and the budget unchanged,
  // when the budget cannot hold it.
  bool reserve(Reservation& r, int64_t tokens);
  // Returns everything r holds; r becomes inactive.
  void release(Reservation& r);

  // Longest context one sequence can reach alone; sequences that fit at a given context.
  int64_t max_tokens_one_sequence() const;
  int64_t sequences_at(int64_t context) const;
  // e.g. "kv budget 1.00 GiB: 2.61 MiB fixed/sequence + 1.53 KiB/token; one sequence up to
  //       9876 tokens; 12 sequences at max context 1024 (12288 tokens)"
  std::string summary(int64_t max_context) const;

 private:
  int64_t pages_for(size_t kind, int64_t tokens) const;
  size_t page_bytes(size_t kind) const;

  StateCosts costs_;
  size_t budget_;
  int64_t page_entries_;
  mutable std::mutex mu_;  // used_ is read by metrics from other threads
  size_t used_ = 0;
};

}  // namespace dsv4
