#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace dsv4 {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (size_t threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {0, 1, 3, 17, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, [&](size_t b, size_t e) {
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, RethrowsWorkerExceptions) {
  ThreadPool pool(4);
  EXPECT_THROW(pool.parallel_for(100, [](size_t b, size_t) {
    if (b > 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<size_t> sum{0};  // the pool is still usable afterwards
  pool.parallel_for(100, [&](size_t b, size_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100u);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  std::atomic<size_t> total{0};
  pool.parallel_for(8, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(10, [&](size_t b2, size_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 80u);
}

TEST(ThreadPool, CallersFromSeveralThreadsTakeTurns) {
  ThreadPool pool(4);
  std::atomic<size_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      for (int r = 0; r < 50; ++r) pool.parallel_for(64, [&](size_t b, size_t e) { total += e - b; });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 4u * 50u * 64u);
}

}  // namespace
}  // namespace dsv4
