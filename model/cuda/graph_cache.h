// CUDA graphs of forward calls, one per call shape (rows, chunk lengths, launch bounds): decode
// steps at a batch size replay one graph instead of ~40 launches per layer. A graph bakes in the
// scratch addresses it was captured with, so it is only replayed while cuda::scratch_epoch() is
// unchanged; and a shape is only captured once an eager call of it has run with no scratch
// allocation since (first uses allocate, expand weight scales, build expert tables).
// Everything that changes from step to step (positions, sequences, window jobs) must reach the
// kernels through device memory (the call's descriptor blob), never through launch arguments.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace dsv4 {

class GraphCache {
 public:
  explicit GraphCache(size_t capacity = 64) : capacity_(capacity) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Enqueues `body`'s work on s for a call of shape `key`: replay, capture then replay, or eager.
  void run(const std::vector<int64_t>& key, cudaStream_t s, const std::function<void()>& body);
  void clear();
  size_t size() const { return entries_.size(); }

  struct Stats {
    int64_t replays = 0, captures = 0, eager = 0, failed_captures = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;          // scratch epoch the graph was captured at
    uint64_t clean_epoch = 0;    // scratch epoch after the last eager run of this shape
    bool ran_eager = false;
    uint64_t last_use = 0;
  };
  bool capture(Entry& e, cudaStream_t s, const std::function<void()>& body, uint64_t epoch);
  void evict_one();

  size_t capacity_;
  uint64_t tick_ = 0;
  std::map<std::vector<int64_t>, Entry> entries_;
  Stats stats_;
};

}  // namespace dsv4
