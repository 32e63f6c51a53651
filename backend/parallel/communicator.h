// Collectives among the ranks of one group (a tensor-parallel or expert-parallel group). The
// model's parallel pieces only talk through this interface, so the same code runs over the
// in-process LocalCommunicator (simulated ranks, CPU tests) and NCCL (one process per GPU).
// Buffers live where the implementation computes: host memory for LocalCommunicator, device
// memory (enqueued on its stream) for NcclCommunicator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv4 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[n] ← Σ over ranks, fp32. Every rank ends with identical values.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // recv[size · n]: rank i's send[n] at recv + i·n.
  virtual void all_gather(const float* send, size_t n, float* recv) = 0;
  // Personalised exchange of bytes: send holds the blocks for ranks 0..size-1 back to back
  // (send_bytes[j] for rank j); recv receives rank j's block for us at the j-th position
  // (recv_bytes[j], which the caller knows, e.g. from a prior exchange of counts).
  virtual void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                            const std::vector<size_t>& recv_bytes) = 0;

  // One int64 to every rank and one from every rank (counts before a payload exchange). Host
  // vectors on every implementation (NCCL stages them through the device).
  virtual std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send);
};

// Byte offsets of the blocks of a back-to-back layout.
std::vector<size_t> block_offsets(const std::vector<size_t>& bytes);

}  // namespace dsv4
