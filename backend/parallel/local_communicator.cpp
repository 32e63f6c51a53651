#include "backend/parallel/local_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace dsv4 {

LocalGroup::LocalGroup(int size) : size_(size), slots_(static_cast<size_t>(size)) {
  DSV4_CHECK(size >= 1, "LocalGroup: size must be >= 1, got ", size);
}

void LocalGroup::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void LocalGroup::reset() {
  std::lock_guard<std::mutex> lk(mu_);
  aborted_ = false;
  failure_.clear();
  arrived_ = 0;
  ++generation_;
}

void LocalGroup::note_failure(const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  if (failure_.empty()) failure_ = what;
}

std::string LocalGroup::failure() {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

void LocalGroup::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  DSV4_CHECK(!aborted_, "collective aborted: another rank failed");
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  DSV4_CHECK(generation_ != gen, "collective aborted: another rank failed");
}

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank) : group_(std::move(group)), rank_(rank) {
  DSV4_CHECK(group_ && rank >= 0 && rank < group_->size(), "LocalCommunicator: rank ", rank, " outside the group");
}

void LocalCommunicator::all_reduce_sum(float* data, size_t n) {
  LocalGroup& g = *group_;
  g.slots_[rank_] = {data, n, nullptr};
  g.wait_all();
  // Every rank checks every slot, so a mismatch makes all of them throw together.
  for (const auto& s : g.slots_) DSV4_CHECK(s.n == n, "all_reduce_sum: ranks disagree on the length (", s.n, " vs ", n, ")");
  scratch_.resize(n);
  std::memcpy(scratch_.data(), g.slots_[0].send, n * sizeof(float));
  for (int j = 1; j < g.size(); ++j) {
    const float* src = static_cast<const float*>(g.slots_[j].send);
    for (size_t i = 0; i < n; ++i) scratch_[i] += src[i];
  }
  g.wait_all();  // nobody reads `data` any more
  std::copy(scratch_.begin(), scratch_.end(), data);
}

void LocalCommunicator::all_gather(const float* send, size_t n, float* recv) {
  LocalGroup& g = *group_;
  g.slots_[rank_] = {send, n, nullptr};
  g.wait_all();
  for (const auto& s : g.slots_) DSV4_CHECK(s.n == n, "all_gather: ranks disagree on the length (", s.n, " vs ", n, ")");
  for (int j = 0; j < g.size(); ++j) std::memcpy(recv + j * n, g.slots_[j].send, n * sizeof(float));
  g.wait_all();
}

void LocalCommunicator::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                     const std::vector<size_t>& recv_bytes) {
  LocalGroup& g = *group_;
  const size_t P = static_cast<size_t>(g.size());
  DSV4_CHECK(send_bytes.size() == P && recv_bytes.size() == P, "all_to_all_v: need one block size per rank (", P, ")");
  g.slots_[rank_] = {send, 0, &send_bytes};
  g.wait_all();
  // Checked by every rank over the whole matrix, so all throw together on a mismatch.
  bool ok = true;
  for (size_t j = 0; j < P; ++j) ok = ok && g.slots_[j].bytes->size() == P;
  DSV4_CHECK(ok, "all_to_all_v: a rank passed the wrong number of blocks");
  const std::vector<size_t> roff = block_offsets(recv_bytes);
  std::string mismatch;
  for (size_t j = 0; j < P; ++j) {
    const std::vector<size_t>& sb = *g.slots_[j].bytes;
    const size_t len = sb[rank_];
    if (len != recv_bytes[j]) {
      mismatch = detail::concat("rank ", j, " sends ", len, " bytes to rank ", rank_, ", which expects ", recv_bytes[j]);
      break;
    }
    const size_t soff = block_offsets(sb)[rank_];
    if (len) std::memcpy(static_cast<uint8_t*>(recv) + roff[j], static_cast<const uint8_t*>(g.slots_[j].send) + soff, len);
  }
  // Leaving before the barrier would free our send buffer while other ranks still copy from
  // it: report, wait for everyone, then all throw together.
  if (!mismatch.empty()) g.note_failure(mismatch);
  g.wait_all();
  const std::string failed = g.failure();
  DSV4_CHECK(failed.empty(), "all_to_all_v: ", failed);
}

}  // namespace dsv4
