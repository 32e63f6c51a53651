// Where a forward's GPU time goes, op by op: CudaModel records an event on its stream after
// each op of an eager call; the time between consecutive events is charged to the op that
// ended, so launch gaps count against the op whose launch was late (what a step pays).
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dsv4 {

class OpProfile {
 public:
  OpProfile() = default;
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  void begin(cudaStream_t s);
  void mark(const std::string& op, cudaStream_t s);
  // Waits for the call's events and adds their intervals to the totals.
  void end();
  void reset();
  // Host time of a forward's phase outside the GPU ops (preparing the call, enqueueing it,
  // waiting for the GPU): the report lists them after the ops, to tell host-bound from GPU-bound.
  void host_phase(const std::string& phase, double ms);
  // One line per op: total ms over the recorded calls, per call µs, share of the sum.
  std::string report() const;
  int64_t calls() const { return calls_; }

 private:
  cudaEvent_t event();
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<std::string> names_;  // names_[i]: op ending at event i + 1
  std::map<std::string, std::pair<double, int64_t>> totals_;  // ms, marks
  std::vector<std::pair<std::string, double>> host_;          // phase, ms (in first-seen order)
  int64_t calls_ = 0;
};

}  // namespace dsv4
