#include "backend/parallel/communicator.h"

#include "core/error.h"

namespace dsv4 {

std::vector<size_t> block_offsets(const std::vector<size_t>& bytes) {
  std::vector<size_t> off(bytes.size() + 1, 0);
  for (size_t i = 0; i < bytes.size(); ++i) off[i + 1] = off[i] + bytes[i];
  return off;
}

std::vector<int64_t> Communicator::all_to_all_counts(const std::vector<int64_t>& send) {
  const size_t n = static_cast<size_t>(size());
  DSV4_CHECK(send.size() == n, "all_to_all_counts: ", send.size(), " counts for ", n, " ranks");
  std::vector<int64_t> recv(n);
  const std::vector<size_t> bytes(n, sizeof(int64_t));
  all_to_all_v(send.data(), bytes, recv.data(), bytes);
  return recv;
}

}  // namespace dsv4
