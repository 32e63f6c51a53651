#include "model/cuda/graph_cache.h"

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"

namespace dsv4 {

GraphCache::~GraphCache() { clear(); }

void GraphCache::clear() {
  for (auto& [key, e] : entries_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  entries_.clear();
}

void GraphCache::evict_one() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->second.exec && (victim == entries_.end() || it->second.last_use < victim->second.last_use)) victim = it;
  if (victim == entries_.end()) return;
  cudaGraphExecDestroy(victim->second.exec);
  entries_.erase(victim);
}

// Relaxed mode: the body's host code may query attributes; anything that would allocate has
// already happened in the eager run (and a late allocation is caught by the epoch check).
bool GraphCache::capture(Entry& e, cudaStream_t s, const std::function<void()>& body, uint64_t epoch) {
  cudaGraph_t g = nullptr;
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  bool ok = end == cudaSuccess && g && cuda::scratch_epoch() == epoch;
  if (ok) ok = cudaGraphInstantiate(&e.exec, g, 0) == cudaSuccess;
  if (g) cudaGraphDestroy(g);
  if (!ok) {
    cudaGetLastError();  // capture errors are not sticky; the eager run below redoes the work
    e.exec = nullptr;
    ++stats_.failed_captures;
    return false;
  }
  e.epoch = epoch;
  return true;
}

void GraphCache::run(const std::vector<int64_t>& key, cudaStream_t s, const std::function<void()>& body) {
  const uint64_t epoch = cuda::scratch_epoch();
  if (entries_.size() > 4 * capacity_ && !entries_.count(key))  // forget shapes seen once, never captured
    std::erase_if(entries_, [](const auto& kv) { return kv.second.exec == nullptr; });
  Entry& e = entries_[key];
  e.last_use = ++tick_;
  if (e.exec && e.epoch != epoch) {  // captured with addresses that may since have moved
    DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(e.exec);
    e.exec = nullptr;
  }
  if (!e.exec && e.ran_eager && e.clean_epoch == epoch) {
    size_t live = 0;
    for (const auto& [k, x] : entries_) live += x.exec != nullptr;
    if (live >= capacity_) {  // e holds no graph, so it is not the one evicted
      DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
      evict_one();
    }
    if (capture(e, s, body, epoch)) ++stats_.captures;
  }
  if (e.exec) {
    DSV4_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
    ++stats_.replays;
    return;
  }
  body();
  ++stats_.eager;
  e.ran_eager = true;
  e.clean_epoch = cuda::scratch_epoch();
}

}  // namespace dsv4
