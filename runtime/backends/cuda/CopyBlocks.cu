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

std::string copyBlocksOnStream(void *dst, const void *src, const std::vector<CopyBlock> &blocks, void *stream) {
  size_t align = 16;
  for (const CopyBlock &b : blocks)
    while (align > 1 && ((b.to | b.from | b.bytes) % align != 0 ||
                         (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % align != 0))
      align = align == 16 ? 4 : 1;
  std::vector<int64_t> table; // first[n + 1], to[n], from[n]: one upload
  int n = 0;
  std::vector<int64_t> first{0}, to, from;
  for (const CopyBlock &b : blocks) {
    if (b.bytes == 0)
      continue;
    first.push_back(first.back() + static_cast<int64_t>(b.bytes / align));
    to.push_back(static_cast<int64_t>(b.to / align));
    from.push_back(static_cast<int64_t>(b.from / align));
    ++n;
  }
  if (n == 0)
    return "";
  table.insert(table.end(), first.begin(), first.end());
  table.insert(table.end(), to.begin(), to.end());
  table.insert(table.end(), from.begin(), from.end());
  auto s = static_cast<cudaStream_t>(stream);
  int64_t *device = nullptr;
  if (cudaError_t e = cudaMallocAsync(reinterpret_cast<void **>(&device), table.size() * sizeof(int64_t), s);
      e != cudaSuccess)
    return error(e, "copyBlocks: cudaMallocAsync");
  // From pageable memory the copy returns once the table is staged: `table` may go.
  if (cudaError_t e = cudaMemcpyAsync(device, table.data(), table.size() * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, s);
      e != cudaSuccess)
    return error(e, "copyBlocks: table upload");
  int64_t units = first.back();
  unsigned grid = static_cast<unsigned>(std::min<int64_t>((units + 255) / 256, 4096));
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
  if (cudaError_t e = cudaFreeAsync(device, s); e != cudaSuccess)
    return error(e, "copyBlocks: cudaFreeAsync");
  return "";
}

} // namespace moec::runtime::cuda
