// NcclCommunicator on a host with >= 2 GPUs (skips otherwise): two processes, one per GPU,
// meet through the TCP rendezvous on localhost and check all-reduce, all-gather and the
// variable all-to-all on device buffers against the values computed on the host.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "backend/parallel/nccl_communicator.h"

namespace dsv4 {
namespace {

constexpr int kSkip = 77;

// One rank's whole check; the exit code is the result (0 ok, kSkip no GPUs, else failure).
int rank_main(int rank, int world, int port) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < world) return kSkip;
  try {
    cudaSetDevice(rank);
    cudaStream_t s;
    cudaStreamCreate(&s);
    auto comm = NcclCommunicator::join("127.0.0.1", port, rank, world, s, 60);
    const size_t n = 1024;
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(rank + 1) * 0.5f + i;
    float* d = nullptr;
    cudaMalloc(&d, n * world * sizeof(float));
    cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    comm->all_reduce_sum(d, n);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < world; ++r) want += static_cast<float>(r + 1) * 0.5f + i;
      if (h[i] != want) return 2;
    }
    // all-to-all: rank r sends r+j+1 floats of value 10 r + j to rank j.
    std::vector<int64_t> cnt(world);
    std::vector<float> send;
    for (int j = 0; j < world; ++j) {
      cnt[j] = rank + j + 1;
      send.insert(send.end(), cnt[j], static_cast<float>(10 * rank + j));
    }
    const std::vector<int64_t> rc = comm->all_to_all_counts(cnt);
    std::vector<size_t> sb(world), rb(world);
    size_t total = 0;
    for (int j = 0; j < world; ++j) {
      if (rc[j] != j + rank + 1) return 3;
      sb[j] = cnt[j] * sizeof(float);
      rb[j] = rc[j] * sizeof(float);
      total += rc[j];
    }
    float *ds = nullptr, *dr = nullptr;
    cudaMalloc(&ds, send.size() * sizeof(float));
    cudaMalloc(&dr, total * sizeof(float));
    cudaMemcpy(ds, send.data(), send.size() * sizeof(float), cudaMemcpyHostToDevice);
    comm->all_to_all_v(ds, sb, dr, rb);
    std::vector<float> recv(total);
    cudaStreamSynchronize(s);
    cudaMemcpy(recv.data(), dr, total * sizeof(float), cudaMemcpyDeviceToHost);
    size_t at = 0;
    for (int j = 0; j < world; ++j)
      for (int64_t k = 0; k < rc[j]; ++k)
        if (recv[at++] != static_cast<float>(10 * j + rank)) return 4;
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 5;
  }
}

TEST(NcclCommunicator, TwoProcessesOverTheRendezvous) {
  int port;
  {
    RendezvousServer probe(0);
    port = probe.port();
  }
  const int world = 2;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t p = fork();  // before any CUDA call in this process
    if (p == 0) _exit(rank_main(r, world, port));
    pids.push_back(p);
  }
  std::vector<int> codes;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
  for (int c : codes)
    if (c == kSkip) GTEST_SKIP() << "needs " << world << " GPUs";
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace dsv4
