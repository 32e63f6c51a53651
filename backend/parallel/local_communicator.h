// In-process communicator: the ranks of a group are threads of one process sharing a
// LocalGroup. Each collective publishes the rank's buffer, waits for all ranks, reads the
// others' buffers directly, and waits again before anyone may reuse them. Sums run in rank
// order on every rank, so all ranks hold bitwise identical results (as NCCL guarantees).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/parallel/communicator.h"

namespace dsv4 {

class LocalGroup {
 public:
  explicit LocalGroup(int size);
  int size() const { return size_; }
  // A rank failed: every rank waiting now or later in a collective throws instead of hanging.
  void abort();
  // Back to a usable state once every rank's thread has left its collective.
  void reset();

 private:
  friend class LocalCommunicator;
  struct Slot {
    const void* send = nullptr;
    size_t n = 0;                             // element count (all_reduce, all_gather)
    const std::vector<size_t>* bytes = nullptr;  // all_to_all_v block sizes
  };
  void wait_all();  // barrier over the group's ranks; throws once aborted
  // A rank found its part of a collective wrong; every rank throws after the next barrier
  // (so nobody frees buffers others still read). Sticky until reset().
  void note_failure(const std::string& what);
  std::string failure();

  const int size_;
  std::vector<Slot> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string failure_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void all_reduce_sum(float* data, size_t n) override;
  void all_gather(const float* send, size_t n, float* recv) override;
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes) override;

 private:
  std::shared_ptr<LocalGroup> group_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace dsv4
