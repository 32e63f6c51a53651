#include "backend/parallel/nccl_communicator.h"

#include <cstring>
#include <memory>

#include "core/error.h"

namespace dsv4 {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  DSV4_CHECK(r == ncclSuccess, "NCCL ", what, ": ", ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* what) {
  DSV4_CHECK(e == cudaSuccess, "CUDA ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

static_assert(sizeof(ncclUniqueId) == sizeof(UniqueIdBytes), "the rendezvous carries exactly an ncclUniqueId");

UniqueIdBytes NcclCommunicator::new_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  UniqueIdBytes b;
  std::memcpy(b.data(), &id, b.size());
  return b;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::join(const std::string& host, int port, int rank, int world,
                                                         cudaStream_t stream, double timeout_s) {
  const UniqueIdBytes id = exchange_unique_id(host, port, rank, world, rank == 0 ? new_unique_id() : UniqueIdBytes{},
                                              timeout_s);
  return std::make_unique<NcclCommunicator>(id, rank, world, stream);
}

NcclCommunicator::NcclCommunicator(const UniqueIdBytes& id, int rank, int world, cudaStream_t stream)
    : rank_(rank), world_(world), stream_(stream) {
  DSV4_CHECK(rank >= 0 && rank < world, "NcclCommunicator: rank ", rank, " outside world ", world);
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  check_nccl(ncclCommInitRank(&comm_, world, nid, rank), "ncclCommInitRank");
  check_cuda(cudaMalloc(&counts_dev_, 2 * static_cast<size_t>(world) * sizeof(int64_t)), "cudaMalloc");
}

NcclCommunicator::~NcclCommunicator() {
  if (counts_dev_) cudaFree(counts_dev_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::all_reduce_sum(float* data, size_t n) {
  check_nccl(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
}

void NcclCommunicator::all_gather(const float* send, size_t n, float* recv) {
  check_nccl(ncclAllGather(send, recv, n, ncclFloat32, comm_, stream_), "ncclAllGather");
}

void NcclCommunicator::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                    const std::vector<size_t>& recv_bytes) {
  const size_t P = static_cast<size_t>(world_);
  DSV4_CHECK(send_bytes.size() == P && recv_bytes.size() == P, "all_to_all_v: need one block size per rank (", P, ")");
  const std::vector<size_t> so = block_offsets(send_bytes), ro = block_offsets(recv_bytes);
  // Grouped point-to-point: NCCL's all-to-all idiom; zero-byte blocks are skipped.
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (size_t j = 0; j < P; ++j) {
    if (send_bytes[j])
      check_nccl(ncclSend(static_cast<const uint8_t*>(send) + so[j], send_bytes[j], ncclUint8, static_cast<int>(j),
                          comm_, stream_),
                 "ncclSend");
    if (recv_bytes[j])
      check_nccl(ncclRecv(static_cast<uint8_t*>(recv) + ro[j], recv_bytes[j], ncclUint8, static_cast<int>(j), comm_,
                          stream_),
                 "ncclRecv");
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

std::vector<int64_t> NcclCommunicator::all_to_all_counts(const std::vector<int64_t>& send) {
  const size_t P = static_cast<size_t>(world_);
  DSV4_CHECK(send.size() == P, "all_to_all_counts: ", send.size(), " counts for ", P, " ranks");
  check_cuda(cudaMemcpyAsync(counts_dev_, send.data(), P * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync");
  const std::vector<size_t> bytes(P, sizeof(int64_t));
  all_to_all_v(counts_dev_, bytes, counts_dev_ + P, bytes);
  std::vector<int64_t> recv(P);
  check_cuda(cudaMemcpyAsync(recv.data(), counts_dev_ + P, P * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return recv;
}

}  // namespace dsv4
