// The in-process communicator: collectives over threads give the exact results (sums in rank
// order, identical on every rank), the variable all-to-all routes each block to its rank, and
// a rank that fails makes the others throw instead of waiting forever.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <thread>

#include "backend/parallel/local_communicator.h"
#include "core/error.h"

namespace dsv4 {
namespace {

// Runs fn(comm) on P threads of one group; returns each rank's exception (or null).
std::vector<std::exception_ptr> on_ranks(int P, const std::function<void(Communicator&)>& fn) {
  auto g = std::make_shared<LocalGroup>(P);
  std::vector<std::exception_ptr> err(P);
  std::vector<std::thread> t;
  for (int r = 0; r < P; ++r)
    t.emplace_back([&, r] {
      LocalCommunicator c(g, r);
      try {
        fn(c);
      } catch (...) {
        err[r] = std::current_exception();
        g->abort();
      }
    });
  for (auto& x : t) x.join();
  return err;
}

TEST(LocalCommunicator, AllReduceIsTheRankOrderSumOnEveryRank) {
  for (int P : {1, 2, 3, 8}) {
    std::vector<std::vector<float>> out(P);
    auto err = on_ranks(P, [&](Communicator& c) {
      std::vector<float> v(1000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * (c.rank() + 1) + 1e-3f * i;
      for (int rep = 0; rep < 3; ++rep) c.all_reduce_sum(v.data(), v.size());  // back to back reuse
      out[c.rank()] = v;
    });
    for (auto& e : err) ASSERT_FALSE(e);
    for (size_t i = 0; i < 1000; ++i) {
      float s = 0;  // the same three reductions computed serially, rank order
      std::vector<float> vals(P);
      for (int r = 0; r < P; ++r) vals[r] = 0.1f * (r + 1) + 1e-3f * i;
      for (int rep = 0; rep < 3; ++rep) {
        s = vals[0];
        for (int r = 1; r < P; ++r) s += vals[r];
        for (int r = 0; r < P; ++r) vals[r] = s;
      }
      for (int r = 0; r < P; ++r) ASSERT_EQ(out[r][i], s) << "P " << P << " rank " << r << " i " << i;
    }
  }
}

TEST(LocalCommunicator, AllGatherAndAllToAllV) {
  const int P = 4;
  auto err = on_ranks(P, [&](Communicator& c) {
    const int me = c.rank();
    std::vector<float> mine = {float(me), float(me * 10)}, all(2 * P);
    c.all_gather(mine.data(), 2, all.data());
    for (int j = 0; j < P; ++j) DSV4_CHECK(all[2 * j] == j && all[2 * j + 1] == j * 10, "all_gather");
    // Rank i sends (i + j) % 3 ints of value 100 i + j to rank j; counts first, then payload.
    std::vector<int64_t> n(P);
    std::vector<int32_t> send;
    for (int j = 0; j < P; ++j) {
      n[j] = (me + j) % 3;
      for (int k = 0; k < n[j]; ++k) send.push_back(100 * me + j);
    }
    const std::vector<int64_t> rn = c.all_to_all_counts(n);
    std::vector<size_t> sb(P), rb(P);
    size_t total = 0;
    for (int j = 0; j < P; ++j) {
      DSV4_CHECK(rn[j] == (j + me) % 3, "counts");
      sb[j] = n[j] * 4;
      rb[j] = rn[j] * 4;
      total += rn[j];
    }
    std::vector<int32_t> recv(total);
    c.all_to_all_v(send.data(), sb, recv.data(), rb);
    size_t at = 0;
    for (int j = 0; j < P; ++j)
      for (int k = 0; k < rn[j]; ++k) DSV4_CHECK(recv[at++] == 100 * j + me, "payload from ", j);
  });
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

TEST(LocalCommunicator, MismatchAndFailureThrowOnEveryRank) {
  // A rank expecting the wrong byte count: it throws, and the others do not hang.
  auto err = on_ranks(3, [&](Communicator& c) {
    std::vector<size_t> sb(3, 4), rb(3, c.rank() == 1 ? 8 : 4);
    std::vector<uint8_t> s(12), r(24);
    c.all_to_all_v(s.data(), sb, r.data(), rb);
    c.all_reduce_sum(reinterpret_cast<float*>(s.data()), 3);
  });
  for (auto& e : err) EXPECT_TRUE(e);
  // A rank dying before a collective.
  err = on_ranks(4, [&](Communicator& c) {
    std::vector<float> v(8, 1.0f);
    if (c.rank() == 2) throw Error("rank 2 failed");
    c.all_reduce_sum(v.data(), v.size());
  });
  for (auto& e : err) EXPECT_TRUE(e);
  // Lengths that disagree.
  err = on_ranks(2, [&](Communicator& c) {
    std::vector<float> v(8, 1.0f);
    c.all_reduce_sum(v.data(), c.rank() == 0 ? 8 : 4);
  });
  for (auto& e : err) EXPECT_TRUE(e);
}

}  // namespace
}  // namespace dsv4
