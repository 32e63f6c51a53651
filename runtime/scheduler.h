// Continuous batching: decides, each step, which token chunks of which requests run together.
// Running requests come first (oldest first): a decode token, or the next piece of a chunked
// prefill; then waiting requests are admitted (FCFS) while there are batch slots, step
// tokens and budget. When a running request cannot grow, prefix-cache snapshots are evicted
// first, then the newest running request is preempted by recompute: its state and pages are
// freed and it goes back to the front of the queue with its generated tokens as part of what
// it must prefill (greedy results are unchanged; seeded sampling too, the RNG depends on the
// step only).
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/backend.h"
#include "runtime/engine_request.h"
#include "runtime/kv_budget.h"
#include "runtime/prefix_cache.h"

namespace dsv4 {

struct SchedulerLimits {
  int64_t max_batch = 8;              // sequences per step
  int64_t max_tokens_per_step = 512;  // rows per forward
  int64_t prefill_chunk = 0;          // most prompt tokens of one sequence per step; 0 = no extra limit
};

struct ScheduledChunk {
  EngineRequest* r;
  int64_t n;         // tokens [r->computed(), r->computed() + n)
  bool want_logits;  // the chunk reaches the last known token: sample after it
};

class Scheduler {
 public:
  // cache may be null (prefix caching off).
  Scheduler(SchedulerLimits limits, ModelBackend& backend, KvBudget& budget, PrefixCache* cache);

  void enqueue(EngineRequest* r);  // to the back of the waiting queue
  // Removes r wherever it is and frees its state and pages (finish, cancel).
  void remove(EngineRequest* r);
  std::vector<ScheduledChunk> schedule();

  const std::deque<EngineRequest*>& waiting() const { return waiting_; }
  const std::vector<EngineRequest*>& running() const { return running_; }
  int64_t preemptions() const { return preemptions_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  // Tokens of r to run next when `done` are computed.
  int64_t chunk_len(const EngineRequest& r, int64_t done, int64_t tokens_left) const;
  bool grow(EngineRequest& r, int64_t tokens, const BackendSnapshot* keep);
  void preempt(EngineRequest* r);
  void free_state(EngineRequest& r);

  SchedulerLimits lim_;
  ModelBackend* backend_;
  KvBudget* budget_;
  PrefixCache* cache_;
  std::deque<EngineRequest*> waiting_;
  std::vector<EngineRequest*> running_;  // admission order
  int64_t preemptions_ = 0, prefix_hit_tokens_ = 0;
};

}  // namespace dsv4
