//===- CopyBlocks.cu - many device copies in one kernel -------------------===//
//
// Every thread copies units (16, 4 or 1 bytes: the largest that divides every
// offset and size) in a grid-stride loop over all blocks' units laid end to
// end; a unit finds its block by binary search in the blocks' first units.
//
//===----------------------------------------------------------------------===//

#include "runtime/backends/cuda/CopyBlocks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

namespace moec::runtime::cuda {

namespace {

/// The table on the device: per block, its first unit (prefix sum), destination and source
/// offsets in units; `first` has one entry more (the total).
template <typename Unit>
__global__ void copyBlocksKernel(Unit *dst, const Unit *src, const int64_t *first, const int64_t *to,
                                 const int64_t *from, int blocks) {
  int64_t total = first[blocks];
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int lo = 0, hi = blocks - 1; // the last block whose first unit is <= u
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (first[mid] <= u)
        lo = mid;
      else
        hi = mid - 1;
    }
    int64_t k = u - first[lo];
    dst[to[lo] + k] = src[from[lo] + k];
  }
}

std::string error(cudaError_t e, const char *what) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

} // namespace

BlockCopier::~BlockCopier() {
  for (int i = 0; i < 2; ++i) {
    if (uploaded[i]) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(uploaded[i]));
      cudaEventDestroy(static_cast<cudaEvent_t>(uploaded[i]));
    }
    if (pinned[i])
      cudaFreeHost(pinned[i]);
  }
  if (table) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    cudaFree(table);
  }
}

std::string BlockCopier::nextPinned(size_t bytes, int &slot) {
  // Wait only for the upload that last read this buffer.
  int k = next;
  next ^= 1;
  if (uploaded[k])
    if (cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(uploaded[k])); e != cudaSuccess)
      return error(e, "staged copy: waiting for a pinned buffer");
  if (!uploaded[k]) {
    cudaEvent_t event;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess)
      return error(e, "staged copy: cudaEventCreate");
    uploaded[k] = event;
  }
  if (pinnedBytes[k] < bytes) {
    if (pinned[k])
      cudaFreeHost(pinned[k]);
    pinned[k] = nullptr;
    pinnedBytes[k] = 0;
    if (cudaError_t e = cudaMallocHost(&pinned[k], bytes); e != cudaSuccess)
      return error(e, "staged copy: cudaMallocHost");
    pinnedBytes[k] = bytes;
  }
  slot = k;
  return "";
}

std::string BlockCopier::upload(void *dst, const void *host, size_t bytes) {
  if (bytes == 0)
    return "";
  int k = 0;
  if (std::string e = nextPinned(bytes, k); !e.empty())
    return e;
  std::memcpy(pinned[k], host, bytes);
  auto s = static_cast<cudaStream_t>(stream);
  if (cudaError_t e = cudaMemcpyAsync(dst, pinned[k], bytes, cudaMemcpyHostToDevice, s); e != cudaSuccess)
    return error(e, "staged copy: cudaMemcpyAsync");
  if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(uploaded[k]), s); e != cudaSuccess)
    return error(e, "staged copy: cudaEventRecord");
  return "";
}

std::string BlockCopier::copy(void *dst, const void *src, const std::vector<CopyBlock> &blocks) {
  size_t align = 16;
  for (const CopyBlock &b : blocks)
    while (align > 1 && ((b.to | b.from | b.bytes) % align != 0 ||
                         (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % align != 0))
      align = align == 16 ? 4 : 1;
  std::vector<int64_t> first{0}, to, from;
  for (const CopyBlock &b : blocks) {
    if (b.bytes == 0)
      continue;
    first.push_back(first.back() + static_cast<int64_t>(b.bytes / align));
    to.push_back(static_cast<int64_t>(b.to / align));
    from.push_back(static_cast<int64_t>(b.from / align));
  }
  int n = static_cast<int>(to.size());
  if (n == 0)
    return "";
  size_t bytes = (3 * static_cast<size_t>(n) + 1) * sizeof(int64_t); // first[n + 1], to[n], from[n]
  auto s = static_cast<cudaStream_t>(stream);
  int k = 0;
  if (std::string e = nextPinned(bytes, k); !e.empty())
    return e;
  if (tableBytes < bytes) { // a larger device table: the old one may still be read
    if (table) {
      if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess)
        return error(e, "copyBlocks: cudaStreamSynchronize");
      cudaFree(table);
      table = nullptr;
      tableBytes = 0;
    }
    if (cudaError_t e = cudaMalloc(&table, bytes); e != cudaSuccess)
      return error(e, "copyBlocks: cudaMalloc");
    tableBytes = bytes;
  }
  auto *host = static_cast<int64_t *>(pinned[k]);
  std::copy(first.begin(), first.end(), host);
  std::copy(to.begin(), to.end(), host + n + 1);
  std::copy(from.begin(), from.end(), host + 2 * n + 1);
  if (cudaError_t e = cudaMemcpyAsync(table, host, bytes, cudaMemcpyHostToDevice, s); e != cudaSuccess)
    return error(e, "copyBlocks: table upload");
  if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(uploaded[k]), s); e != cudaSuccess)
    return error(e, "copyBlocks: cudaEventRecord");
  int64_t units = first.back();
  unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 4096));
  const int64_t *device = static_cast<const int64_t *>(table);
  const int64_t *f = device, *t = device + n + 1, *r = device + 2 * n + 1;
  if (align == 16)
    copyBlocksKernel<<<grid, 256, 0, s>>>(static_cast<uint4 *>(dst), static_cast<const uint4 *>(src), f, t, r, n);
  else if (align == 4)
    copyBlocksKernel<<<grid, 256, 0, s>>>(static_cast<uint32_t *>(dst), static_cast<const uint32_t *>(src), f, t,
                                          r, n);
  else
    copyBlocksKernel<<<grid, 256, 0, s>>>(static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), f, t, r,
                                          n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return error(e, "copyBlocks kernel launch");
  return "";
}

} // namespace moec::runtime::cuda
