//===- CopyBlocks.h - row gathers and sums in one kernel --------*- C++ -*-===//
//
// The CUDA device's gatherRows, sumRows, localExperts and staged uploads: the
// expert exchange gathers the rows of thousands of tokens per message, adds each
// token's returned rows and renumbers received experts; one cudaMemcpyAsync per
// row would cost more than the copies.
// Plain C++: callers need no CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
#define RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moec::runtime::cuda {

/// Gathers or sums rows on one stream with one kernel. The row table travels through pinned
/// host memory (a ring of buffers, each reused once the upload that read it is done), so a call
/// does not wait for the stream: the host keeps queueing work.
class BlockCopier {
public:
  explicit BlockCopier(void *stream) : stream(stream) {}
  ~BlockCopier();
  BlockCopier(const BlockCopier &) = delete;
  BlockCopier &operator=(const BlockCopier &) = delete;

  /// Each call returns an empty string or the CUDA error.
  /// Copies `bytes` from the host to `dst` through the same pinned buffers, without waiting
  /// for the stream.
  std::string upload(void *dst, const void *host, size_t bytes);
  /// `count` elements of `src` into `dst`, f32 or bf16 each (to bf16: rounded to nearest even).
  std::string convert(void *dst, const void *src, size_t count, bool srcBf16, bool dstBf16);
  /// dst row i = src row rows[i], rows of `rowBytes` bytes.
  std::string gatherRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t rowBytes);
  /// dst row t = the sum of src rows rows[t perRow + s] (s in order; negative: none) with f32
  /// accumulation, for rows.size() / perRow rows of `width` elements, f32 or bf16 in `src` and
  /// in `dst` (rounded once).
  std::string sumRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t perRow, size_t width,
                      bool srcBf16, bool dstBf16);
  /// In place over `count` expert indices (i64 or i32): e in [first, first + perRank) becomes
  /// e - first, any other -1 (another rank's expert).
  std::string localExperts(void *indices, size_t count, bool i64, int64_t first, int64_t perRank);

private:
  /// The device table, with room for `bytes` (a larger one waits for the stream first).
  std::string reserveTable(size_t bytes);
  /// `bytes` of `host` into the device table through a pinned buffer, without waiting.
  std::string uploadTable(const void *host, size_t bytes);
  /// The next pinned buffer, with room for `bytes`, once the upload that last read it is done.
  std::string nextPinned(size_t bytes, int &slot);

  void *stream;
  // Host tables in a ring: a call waits only for the upload kSlots calls back, so the host
  // keeps queueing work ahead of the device (an expert-parallel layer makes about eight).
  static constexpr int kSlots = 16;
  void *pinned[kSlots] = {};   // host tables
  void *uploaded[kSlots] = {}; // events: the upload from pinned[i] is done
  size_t pinnedBytes[kSlots] = {};
  void *table = nullptr; // the device table (stream-ordered, so one is enough)
  size_t tableBytes = 0;
  int next = 0;
};

} // namespace moec::runtime::cuda

#endif // RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
