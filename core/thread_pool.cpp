#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace dsv4 {

namespace {
// True on pool workers and on a caller inside parallel_for: nested calls then run inline.
thread_local bool t_inside = false;
}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) {
    if (const char* env = std::getenv("DSV4_THREADS")) threads = static_cast<size_t>(std::atoi(env));
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  }
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool;
  return pool;
}

void ThreadPool::worker_loop(size_t) {
  t_inside = true;
  size_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return stop_ || (generation_ != seen && next_chunk_ < job_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (next_chunk_ < job_chunks_) {
      size_t c = next_chunk_++;
      const auto* job = job_;
      size_t n = job_n_, chunks = job_chunks_;
      lk.unlock();
      size_t b = n * c / chunks, e = n * (c + 1) / chunks;
      try {
        (*job)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lk.lock();
      if (++done_chunks_ == job_chunks_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk) {
  if (n == 0) return;
  size_t chunks = std::min(size() * 4, (n + min_chunk - 1) / std::max<size_t>(min_chunk, 1));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  if (t_inside) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> one_job(submit_mu_);  // callers from several threads take turns
  std::unique_lock<std::mutex> lk(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  next_chunk_ = 0;
  done_chunks_ = 0;
  error_ = nullptr;
  ++generation_;
  cv_work_.notify_all();
  t_inside = true;
  while (next_chunk_ < job_chunks_) {
    size_t c = next_chunk_++;
    lk.unlock();
    size_t b = n * c / chunks, e = n * (c + 1) / chunks;
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lk.lock();
    ++done_chunks_;
  }
  cv_done_.wait(lk, [&] { return done_chunks_ == job_chunks_; });
  t_inside = false;
  job_ = nullptr;
  auto err = error_;
  error_ = nullptr;
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

}  // namespace dsv4
