//===- CopyBlocks.cu - row gathers and sums in one kernel -----------------===//
//
// gatherRows and sumRows copy or add rows named by a table: one block per
// destination row (gathers copy 16-, 4- or 1-byte units, the largest that the
// row size and both buffers' alignment allow).
//
//===----------------------------------------------------------------------===//

#include "runtime/backends/cuda/CopyBlocks.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace moec::runtime::cuda {

namespace {

/// One block per destination row, copying units (16, 4 or 1 bytes).
template <typename Unit>
__global__ void gatherRowsKernel(Unit *dst, const Unit *src, const int64_t *rows, int64_t units) {
  int64_t i = blockIdx.x, from = rows[i] * units;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x)
    dst[i * units + u] = src[from + u];
}

__device__ float toFloat(float v) { return v; }
__device__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ void fromFloat(float &out, float v) { out = v; }
__device__ void fromFloat(__nv_bfloat16 &out, float v) { out = __float2bfloat16_rn(v); }

/// dst[i] = src[i] in dst's type, a grid-stride loop.
template <typename In, typename Out>
__global__ void convertKernel(Out *dst, const In *src, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    fromFloat(dst[i], toFloat(src[i]));
}

/// One block per destination row; the sources in table order, f32 accumulation.
template <typename In, typename Out>
__global__ void sumRowsKernel(Out *dst, const In *src, const int64_t *rows, int64_t perRow, int64_t width) {
  int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < width; d += blockDim.x) {
    float sum = 0.0f;
    for (int64_t s = 0; s < perRow; ++s)
      if (int64_t row = rows[t * perRow + s]; row >= 0)
        sum = __fadd_rn(sum, toFloat(src[row * width + d]));
    fromFloat(dst[t * width + d], sum);
  }
}

template <typename Index>
__global__ void localExpertsKernel(Index *indices, int64_t count, int64_t first, int64_t perRank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t e = int64_t(indices[i]) - first;
    indices[i] = static_cast<Index>(e >= 0 && e < perRank ? e : -1);
  }
}

std::string error(cudaError_t e, const char *what) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

} // namespace

BlockCopier::~BlockCopier() {
  for (int i = 0; i < kSlots; ++i) {
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
  next = (next + 1) % kSlots;
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

std::string BlockCopier::reserveTable(size_t bytes) {
  if (tableBytes >= bytes)
    return "";
  if (table) { // the old one may still be read
    if (cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream)); e != cudaSuccess)
      return error(e, "device table: cudaStreamSynchronize");
    cudaFree(table);
    table = nullptr;
    tableBytes = 0;
  }
  if (cudaError_t e = cudaMalloc(&table, bytes); e != cudaSuccess)
    return error(e, "device table: cudaMalloc");
  tableBytes = bytes;
  return "";
}

std::string BlockCopier::uploadTable(const void *host, size_t bytes) {
  auto s = static_cast<cudaStream_t>(stream);
  int k = 0;
  if (std::string e = nextPinned(bytes, k); !e.empty())
    return e;
  if (std::string e = reserveTable(bytes); !e.empty())
    return e;
  std::memcpy(pinned[k], host, bytes);
  if (cudaError_t e = cudaMemcpyAsync(table, pinned[k], bytes, cudaMemcpyHostToDevice, s); e != cudaSuccess)
    return error(e, "row table upload");
  if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(uploaded[k]), s); e != cudaSuccess)
    return error(e, "row table: cudaEventRecord");
  return "";
}

std::string BlockCopier::gatherRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t rowBytes) {
  if (rows.empty() || rowBytes == 0)
    return "";
  if (std::string e = uploadTable(rows.data(), rows.size() * sizeof(int64_t)); !e.empty())
    return e;
  auto s = static_cast<cudaStream_t>(stream);
  const auto *device = static_cast<const int64_t *>(table);
  unsigned grid = static_cast<unsigned>(rows.size());
  auto aligned = [&](size_t unit) {
    return rowBytes % unit == 0 && (reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) % unit == 0;
  };
  if (aligned(16))
    gatherRowsKernel<<<grid, 128, 0, s>>>(static_cast<uint4 *>(dst), static_cast<const uint4 *>(src), device,
                                          static_cast<int64_t>(rowBytes / 16));
  else if (aligned(4))
    gatherRowsKernel<<<grid, 128, 0, s>>>(static_cast<uint32_t *>(dst), static_cast<const uint32_t *>(src), device,
                                          static_cast<int64_t>(rowBytes / 4));
  else
    gatherRowsKernel<<<grid, 128, 0, s>>>(static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), device,
                                          static_cast<int64_t>(rowBytes));
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return error(e, "gatherRows kernel launch");
  return "";
}

std::string BlockCopier::convert(void *dst, const void *src, size_t count, bool srcBf16, bool dstBf16) {
  if (count == 0)
    return "";
  auto s = static_cast<cudaStream_t>(stream);
  unsigned grid = static_cast<unsigned>(std::min<size_t>((count + 255) / 256, 4096));
  auto n = static_cast<int64_t>(count);
  using Bf16 = __nv_bfloat16;
  if (srcBf16 && dstBf16)
    convertKernel<<<grid, 256, 0, s>>>(static_cast<Bf16 *>(dst), static_cast<const Bf16 *>(src), n);
  else if (srcBf16)
    convertKernel<<<grid, 256, 0, s>>>(static_cast<float *>(dst), static_cast<const Bf16 *>(src), n);
  else if (dstBf16)
    convertKernel<<<grid, 256, 0, s>>>(static_cast<Bf16 *>(dst), static_cast<const float *>(src), n);
  else
    convertKernel<<<grid, 256, 0, s>>>(static_cast<float *>(dst), static_cast<const float *>(src), n);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return error(e, "convert kernel launch");
  return "";
}

std::string BlockCopier::sumRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t perRow,
                                 size_t width, bool srcBf16, bool dstBf16) {
  size_t count = perRow ? rows.size() / perRow : 0;
  if (count == 0 || width == 0)
    return "";
  if (std::string e = uploadTable(rows.data(), rows.size() * sizeof(int64_t)); !e.empty())
    return e;
  auto s = static_cast<cudaStream_t>(stream);
  const auto *device = static_cast<const int64_t *>(table);
  unsigned grid = static_cast<unsigned>(count);
  auto p = static_cast<int64_t>(perRow), w = static_cast<int64_t>(width);
  using Bf16 = __nv_bfloat16;
  if (srcBf16 && dstBf16)
    sumRowsKernel<<<grid, 256, 0, s>>>(static_cast<Bf16 *>(dst), static_cast<const Bf16 *>(src), device, p, w);
  else if (srcBf16)
    sumRowsKernel<<<grid, 256, 0, s>>>(static_cast<float *>(dst), static_cast<const Bf16 *>(src), device, p, w);
  else if (dstBf16)
    sumRowsKernel<<<grid, 256, 0, s>>>(static_cast<Bf16 *>(dst), static_cast<const float *>(src), device, p, w);
  else
    sumRowsKernel<<<grid, 256, 0, s>>>(static_cast<float *>(dst), static_cast<const float *>(src), device, p, w);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return error(e, "sumRows kernel launch");
  return "";
}

std::string BlockCopier::localExperts(void *indices, size_t count, bool i64, int64_t first, int64_t perRank) {
  if (count == 0)
    return "";
  auto s = static_cast<cudaStream_t>(stream);
  unsigned grid = static_cast<unsigned>(std::min<size_t>((count + 255) / 256, 4096));
  auto n = static_cast<int64_t>(count);
  if (i64)
    localExpertsKernel<<<grid, 256, 0, s>>>(static_cast<int64_t *>(indices), n, first, perRank);
  else
    localExpertsKernel<<<grid, 256, 0, s>>>(static_cast<int32_t *>(indices), n, first, perRank);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return error(e, "localExperts kernel launch");
  return "";
}

} // namespace moec::runtime::cuda
