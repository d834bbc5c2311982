//===- Parallel.cpp - a fixed thread pool with deterministic splits -------===//

#include "runtime/kernels/Parallel.h"

#include <algorithm>

namespace moec::runtime {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < threads; ++i)
    workers.emplace_back([this, i] { work(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  for (std::thread &worker : workers)
    worker.join();
}

namespace {
/// Chunk `index` of `parts` over [0, n): the same split every time.
std::pair<int64_t, int64_t> chunk(int64_t n, int parts, int index) {
  int64_t base = n / parts, extra = n % parts;
  int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}
} // namespace

void ThreadPool::parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  if (workers.empty() || n == 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    job = &fn;
    jobSize = n;
    pending = static_cast<int>(workers.size());
    ++generation;
  }
  wake.notify_all();
  auto [begin, end] = chunk(n, size(), 0);
  if (begin < end)
    fn(begin, end);
  std::unique_lock<std::mutex> lock(mutex);
  done.wait(lock, [this] { return pending == 0; });
  job = nullptr;
}

void ThreadPool::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)> *task;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [&] { return stopping || generation != seen; });
      if (stopping)
        return;
      seen = generation;
      task = job;
      n = jobSize;
    }
    auto [begin, end] = chunk(n, size(), index);
    if (begin < end)
      (*task)(begin, end);
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (--pending == 0)
        done.notify_one();
    }
  }
}

} // namespace moec::runtime
