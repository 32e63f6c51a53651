// A fixed pool of worker threads with a blocking parallel_for (the CPU backend's only parallelism).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads = 0);  // 0 = hardware concurrency (or DSV4_THREADS)
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }
  // Runs fn(begin, end) over [0, n) split into contiguous chunks; returns when all are done.
  // Exceptions from fn are rethrown on the calling thread.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1);

  static ThreadPool& global();

 private:
  void worker_loop(size_t index);
  std::vector<std::thread> workers_;
  std::mutex mu_, submit_mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunks_ = 0, next_chunk_ = 0, done_chunks_ = 0;
  size_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

inline void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1) {
  ThreadPool::global().parallel_for(n, fn, min_chunk);
}

}  // namespace dsv4
