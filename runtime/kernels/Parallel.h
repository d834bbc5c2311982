//===- Parallel.h - a fixed thread pool with deterministic splits -*- C++ -*-===//
//
// Work is split into the same chunks for the same (n, threads), so a kernel
// that reduces within chunks gives bit-identical results run after run.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_PARALLEL_H_
#define RUNTIME_KERNELS_PARALLEL_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moec::runtime {

class ThreadPool {
public:
  /// `threads` = 0: one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return static_cast<int>(workers.size()) + 1; }
  /// Calls fn(begin, end) on contiguous chunks covering [0, n); returns when all are done.
  void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &fn);

private:
  void work(int index);

  std::vector<std::thread> workers;
  std::mutex mutex;
  std::condition_variable wake, done;
  const std::function<void(int64_t, int64_t)> *job = nullptr;
  int64_t jobSize = 0;
  uint64_t generation = 0;
  int pending = 0;
  bool stopping = false;
};

} // namespace moec::runtime

#endif // RUNTIME_KERNELS_PARALLEL_H_
