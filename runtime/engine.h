// The serving engine: owns the scheduler, the KV budget and the prefix cache over one
// ModelBackend, and runs the step loop on its own thread. submit()/cancel()/stats() may be
// called from any thread; each request's events arrive through its callback (on the engine
// thread) in order, the last one carrying finish != None.
//
//   CpuBackend backend(model);
//   EngineOptions opt;
//   opt.kv_memory_bytes = parse_memory_size("1GiB");
//   Engine engine(backend, opt);
//   engine.start();
//   EventQueue q;
//   Request req;
//   req.prompt = ids;
//   req.sampling.temperature = 0;
//   req.stop.max_tokens = 64;
//   req.on_event = q.callback();
//   uint64_t id = engine.submit(std::move(req));   // throws Error on bad input (→ HTTP 400)
//   for (TokenEvent e = q.pop();; e = q.pop()) { send(e.text); if (e.finish != FinishReason::None) break; }
// (the queue must outlive the request: it is written until the finish event.)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/backend.h"
#include "runtime/kv_budget.h"
#include "runtime/prefix_cache.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace dsv4 {

struct EngineOptions {
  size_t kv_memory_bytes = size_t{1} << 30;  // --kv-memory (or gpu_kv_budget(...) on a GPU)
  int64_t page_entries = 16;                 // entries per page of each kind
  SchedulerLimits limits;
  bool prefix_cache = true;
  // Snapshots at every prompt prefix that is a multiple of this; prompt pieces are cut at
  // these boundaries. Each snapshot is a whole state copy (fixed part + entries): pick a block
  // near the prefill chunk on big models. LRU keeps them within the kv budget.
  int64_t prefix_block = 64;
  // Context limit (prompt + generated). 0 = config max_position_embeddings, lowered to what
  // one sequence can reach in the budget; an explicit value that does not fit is an Error.
  int64_t max_model_len = 0;
  // MTP speculative decoding: draft this many tokens per decode step and verify them in the
  // same batched forward (0 = off; needs backend.has_mtp()). Outputs keep the target's
  // distribution (greedy: identical tokens).
  int64_t speculative_tokens = 0;
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  size_t kv_budget = 0, kv_used = 0, prefix_cache_bytes = 0;
  int64_t prefix_cache_entries = 0, prefix_hit_tokens = 0, preemptions = 0;
  int64_t steps = 0, prompt_tokens = 0, generated_tokens = 0, finished = 0;
  double forward_seconds = 0;
  // Speculative decoding: drafts proposed and accepted (acceptance rate = accepted / drafted).
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;
};

class Engine {
 public:
  Engine(ModelBackend& backend, EngineOptions opt);
  ~Engine();  // stops the loop; unfinished requests get FinishReason::Cancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues; returns the request id. Throws Error naming the bad field.
  uint64_t submit(Request r);
  // Cancels a queued or running request: its state and pages are freed at the next step
  // boundary (within one forward) and it gets a Cancelled event. Unknown/finished ids: no-op.
  void cancel(uint64_t id);

  void start();  // runs the loop on a thread
  void stop();   // joins it (requests stay queued)
  // Single-threaded use (tests, offline batches): steps until no request is left.
  void run_until_idle();
  // One scheduling step (admit, forward, sample, emit). False when there was nothing to run.
  bool step();

  EngineStats stats() const;
  const KvBudget& budget() const { return budget_; }
  int64_t max_model_len() const { return max_len_; }
  // "kv budget …; max_model_len N" for the startup log.
  std::string summary() const;

 private:
  void take_inbox();
  void finish(EngineRequest& r, TokenEvent ev, FinishReason why);
  void on_token(EngineRequest& r, std::span<const float> logits);
  // Emits a chosen token (stop checks, events). False when it finished r (r is gone then).
  bool emit_token(EngineRequest& r, SampleResult s);
  // Drafts tokens for the decode chunks of plan that have room; verify[i] = token + drafts.
  void draft_round(const std::vector<ScheduledChunk>& plan, std::vector<std::vector<int32_t>>& verify,
                   std::vector<std::vector<std::vector<double>>>& q);
  // The tokens a verify chunk emits by the acceptance rule (rows: its logits).
  std::vector<int32_t> accept_round(EngineRequest& r, const std::vector<int32_t>& verify,
                                    const std::vector<std::vector<double>>& q, const float* rows);
  void publish_stats();

  ModelBackend* backend_;
  EngineOptions opt_;
  int64_t max_len_;
  KvBudget budget_;
  std::unique_ptr<PrefixCache> cache_;
  Scheduler sched_;
  std::unordered_map<uint64_t, std::unique_ptr<EngineRequest>> live_;  // loop thread only

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::vector<std::unique_ptr<EngineRequest>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  EngineStats stats_;
  std::thread loop_;
};

}  // namespace dsv4
