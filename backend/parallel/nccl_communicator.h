// Communicator over NCCL: one process per GPU, buffers are device pointers and every
// collective is enqueued on the communicator's stream (callers order their kernels on it or
// synchronise). Built only with -DDSV4_NCCL=ON. The group is created from an ncclUniqueId that
// rank 0 makes and hands out through the TCP rendezvous, so it can span hosts.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "backend/parallel/communicator.h"
#include "backend/parallel/tcp_rendezvous.h"

namespace dsv4 {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over the `world` ranks; the calling process must have selected its GPU.
  NcclCommunicator(const UniqueIdBytes& id, int rank, int world, cudaStream_t stream);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // rank 0 creates the id; everyone meets at host:port (tcp_rendezvous.h).
  static UniqueIdBytes new_unique_id();
  static std::unique_ptr<NcclCommunicator> join(const std::string& host, int port, int rank, int world,
                                                cudaStream_t stream, double timeout_s = 300);

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  void all_reduce_sum(float* data, size_t n) override;
  void all_gather(const float* send, size_t n, float* recv) override;
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes) override;
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send) override;
  cudaStream_t stream() const { return stream_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_, world_;
  cudaStream_t stream_;
  int64_t* counts_dev_ = nullptr;  // staging for all_to_all_counts: [2, world]
};

}  // namespace dsv4
