#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

Scheduler::Scheduler(SchedulerLimits limits, ModelBackend& backend, KvBudget& budget, PrefixCache* cache)
    : lim_(limits), backend_(&backend), budget_(&budget), cache_(cache) {
  DSV4_CHECK(lim_.max_batch > 0, "scheduler: max_batch must be positive, got ", lim_.max_batch);
  DSV4_CHECK(lim_.max_tokens_per_step > 0, "scheduler: max_tokens_per_step must be positive, got ",
             lim_.max_tokens_per_step);
  DSV4_CHECK(lim_.prefill_chunk >= 0, "scheduler: prefill_chunk must be >= 0, got ", lim_.prefill_chunk);
}

void Scheduler::enqueue(EngineRequest* r) { waiting_.push_back(r); }

void Scheduler::free_state(EngineRequest& r) {
  r.seq.reset();
  budget_->release(r.resv);
}

void Scheduler::remove(EngineRequest* r) {
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), r); it != waiting_.end()) waiting_.erase(it);
  free_state(*r);
}

void Scheduler::preempt(EngineRequest* r) {
  running_.erase(std::find(running_.begin(), running_.end(), r));
  free_state(*r);
  ++r->preemptions;
  ++preemptions_;
  waiting_.push_front(r);
}

int64_t Scheduler::chunk_len(const EngineRequest& r, int64_t done, int64_t tokens_left) const {
  const int64_t todo = static_cast<int64_t>(r.tokens.size()) - done;
  int64_t n = std::min(todo, tokens_left);
  if (lim_.prefill_chunk > 0) n = std::min(n, lim_.prefill_chunk);
  // Stop prompt pieces at the next cache block boundary inside the prompt: the state is
  // only observable (snapshot) between forwards.
  if (cache_) {
    const int64_t B = cache_->block(), next = (done / B + 1) * B;
    if (next < done + n && next <= r.prompt_len) n = next - done;
  }
  return n;
}

bool Scheduler::grow(EngineRequest& r, int64_t tokens, const BackendSnapshot* keep) {
  if (backend_->fixed_capacity()) tokens = std::max(tokens, r.capacity());
  while (!budget_->reserve(r.resv, tokens))
    if (!cache_ || !cache_->evict_one(keep)) return false;
  return true;
}

std::vector<ScheduledChunk> Scheduler::schedule() {
  std::vector<ScheduledChunk> plan;
  int64_t left = lim_.max_tokens_per_step;
  bool preempted = false;
  for (size_t i = 0; i < running_.size() && left > 0;) {
    EngineRequest* r = running_[i];
    const int64_t n = chunk_len(*r, r->computed(), left);
    bool ok = grow(*r, r->computed() + n, nullptr);
    while (!ok && running_.back() != r) {  // take memory from the newest
      preempt(running_.back());
      preempted = true;
      ok = grow(*r, r->computed() + n, nullptr);
    }
    if (!ok) {  // r itself is the newest
      preempt(r);
      preempted = true;
      break;
    }
    plan.push_back({r, n, r->computed() + n == static_cast<int64_t>(r->tokens.size())});
    left -= n;
    ++i;
  }
  // Admit only when nothing had to be preempted (else the queue would thrash).
  while (!preempted && !waiting_.empty() && static_cast<int64_t>(running_.size()) < lim_.max_batch && left > 0) {
    EngineRequest* r = waiting_.front();
    PrefixCache::Hit hit;
    if (cache_) hit = cache_->lookup(r->tokens, static_cast<int64_t>(r->tokens.size()) - 1);
    const int64_t n = chunk_len(*r, hit.tokens, left);
    if (!grow(*r, hit.tokens + n, hit.snapshot)) break;  // wait for running requests to finish
    r->seq = hit.snapshot ? backend_->restore(*hit.snapshot, r->capacity()) : backend_->new_sequence(r->capacity());
    if (r->preemptions == 0) r->cached_tokens = hit.tokens;
    prefix_hit_tokens_ += hit.tokens;
    waiting_.pop_front();
    running_.push_back(r);
    plan.push_back({r, n, hit.tokens + n == static_cast<int64_t>(r->tokens.size())});
    left -= n;
  }
  return plan;
}

}  // namespace dsv4
