//===- CopyBlocks.h - many device copies in one kernel ----------*- C++ -*-===//
//
// The CUDA device's copyBlocks: the expert exchange regroups rows per (rank,
// expert) segment, hundreds of them per exchange; one cudaMemcpyAsync each
// would cost more than the copies. Plain C++: callers need no CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
#define RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_

#include <cstddef>
#include <string>
#include <vector>

namespace moec::runtime::cuda {

struct CopyBlock {
  size_t to, from, bytes;
};

/// Copies blocks on one stream with one kernel. The block table travels through pinned
/// host memory (two buffers, each reused once the upload that read it is done), so a call
/// does not wait for the stream: the host keeps queueing work.
class BlockCopier {
public:
  explicit BlockCopier(void *stream) : stream(stream) {}
  ~BlockCopier();
  BlockCopier(const BlockCopier &) = delete;
  BlockCopier &operator=(const BlockCopier &) = delete;

  /// Copies every block from `src` to `dst`; an empty string or the CUDA error.
  std::string copy(void *dst, const void *src, const std::vector<CopyBlock> &blocks);
  /// Copies `bytes` from the host to `dst` through the same pinned buffers, without waiting
  /// for the stream.
  std::string upload(void *dst, const void *host, size_t bytes);

private:
  /// The next pinned buffer, with room for `bytes`, once the upload that last read it is done.
  std::string nextPinned(size_t bytes, int &slot);

  void *stream;
  void *pinned[2] = {nullptr, nullptr}; // host tables
  void *uploaded[2] = {nullptr, nullptr}; // events: the upload from pinned[i] is done
  size_t pinnedBytes[2] = {0, 0};
  void *table = nullptr; // the device table (stream-ordered, so one is enough)
  size_t tableBytes = 0;
  int next = 0;
};

} // namespace moec::runtime::cuda

#endif // RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
