#include "kernels/cpu/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace remat::kernels::cpu {

namespace {

int read_threads() {
  for (const char* name : {"REMAT_CPU_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return std::min(n, 16);
    }
  }
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

// Workers that wait for a job, run their chunk of it, and report. One job at a time.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { work(w + 1); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // False when another job is running (the caller then runs it alone).
  bool run(const std::vector<std::int64_t>& bounds, detail::ChunkFn fn, const void* ctx) {
    std::unique_lock<std::mutex> busy(run_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const int chunks = static_cast<int>(bounds.size()) - 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bounds_ = bounds;  // a copy: a worker this job does not need may look at it late
      fn_ = fn;
      ctx_ = ctx;
      pending_ = chunks - 1;
      ++generation_;
    }
    wake_.notify_all();
    fn(ctx, bounds[0], bounds[1]);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    return true;
  }

 private:
  void work(int chunk) {
    std::uint64_t seen = 0;
    for (;;) {
      detail::ChunkFn fn;
      const void* ctx;
      std::int64_t begin, end;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        const int chunks = static_cast<int>(bounds_.size()) - 1;
        if (chunk >= chunks) continue;  // this job has fewer chunks than workers
        fn = fn_;
        ctx = ctx_;
        begin = bounds_[static_cast<std::size_t>(chunk)];
        end = bounds_[static_cast<std::size_t>(chunk) + 1];
      }
      fn(ctx, begin, end);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  std::mutex run_;  // held while a job runs
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  std::vector<std::int64_t> bounds_;
  detail::ChunkFn fn_ = nullptr;
  const void* ctx_ = nullptr;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& shared_pool() {
  static Pool pool(cpu_threads() - 1);
  return pool;
}

}  // namespace

int cpu_threads() {
  static const int threads = read_threads();
  return threads;
}

namespace detail {

void parallel_for(std::int64_t n, std::int64_t grain, std::int64_t align, ChunkFn fn,
                  const void* ctx) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  align = std::max<std::int64_t>(align, 1);
  const std::int64_t chunks = std::min<std::int64_t>(cpu_threads(), n / grain);
  if (chunks <= 1) {
    fn(ctx, 0, n);
    return;
  }
  std::vector<std::int64_t> bounds(static_cast<std::size_t>(chunks) + 1, n);
  bounds[0] = 0;
  for (std::int64_t c = 1; c < chunks; ++c)
    bounds[static_cast<std::size_t>(c)] = std::min(n, (n * c / chunks) / align * align);
  if (!shared_pool().run(bounds, fn, ctx)) fn(ctx, 0, n);
}

}  // namespace detail

}  // namespace remat::kernels::cpu
