//===- GroupedGemmTiles.cuh - which expert and rows a grouped GEMM CTA owns -*- CUDA -*-===//
//
// Shared by the grouped GEMM kernels (mma.sync in GroupedGemm.cu, wgmma in
// GroupedGemmWgmma.cu): the row forms launch an upper bound on the row tiles
// of all experts, and each CTA finds its expert from the device offsets.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_

#include <cstdint>

#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::routing {

/// Threads of every grouped GEMM CTA (8 warps; two warpgroups for wgmma).
constexpr int kGroupedThreads = 256;

/// The operands of one grouped GEMM launch.
struct GroupedParams {
  const void *a = nullptr, *b = nullptr;
  void *c = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t bStride = 0, cStride = 0; // per expert (B for the row forms, C for Reduce)
  int64_t m = 0, n = 0, k = 0;      // row forms: n, k; Reduce: m, n
  float alpha = 1, beta = 0;
  const int64_t *offsets = nullptr;
  int experts = 0;
};

__device__ __forceinline__ int64_t minI64(int64_t a, int64_t b) { return a < b ? a : b; }

/// The expert and first row of the row tile `tile` (tiles of `bm` rows, expert
/// by expert, in expert order), or false when the experts have fewer tiles.
/// Every thread of the block must call it; all get the same answer.
__device__ inline bool findRowTile(const int64_t *offsets, int experts, int64_t tile, int bm,
                                   int &expert, int64_t &rowBegin, int64_t &rowEnd) {
  __shared__ int warpSums[kGroupedThreads / 32];
  __shared__ int found;
  __shared__ int64_t foundFirst;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0)
    found = -1;
  __syncthreads();
  int64_t carry = 0;
  for (int base = 0; base < experts; base += blockDim.x) {
    int e = base + threadIdx.x;
    int64_t tiles = 0;
    if (e < experts) {
      int64_t rows = offsets[e + 1] - offsets[e];
      tiles = rows > 0 ? (rows + bm - 1) / bm : 0;
    }
    // Inclusive scan over the warp, then over the warps.
    int v = static_cast<int>(tiles);
    for (int d = 1; d < 32; d <<= 1) {
      int o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d)
        v += o;
    }
    if (lane == 31)
      warpSums[warp] = v;
    __syncthreads();
    int64_t before = carry, total = carry;
    for (int w = 0; w < warps; ++w) {
      if (w < warp)
        before += warpSums[w];
      total += warpSums[w];
    }
    int64_t first = before + v - tiles;
    if (tiles > 0 && tile >= first && tile < first + tiles) {
      found = e;
      foundFirst = first;
    }
    __syncthreads(); // warpSums is rewritten next round only after everyone read it
    if (found >= 0)
      break;
    carry = total;
  }
  if (found < 0)
    return false;
  expert = found;
  rowBegin = offsets[expert] + (tile - foundFirst) * bm;
  rowEnd = offsets[expert + 1];
  return true;
}

__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// A 16-byte global -> shared copy; `valid` false writes zeros (reads nothing).
__device__ __forceinline__ void cpAsync16(void *smem, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(smem)),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <typename CT> __device__ __forceinline__ float loadC(const CT *c) { return toFloat(*c); }

/// Two adjacent outputs in one store (`c` aligned to both).
__device__ __forceinline__ void storePair(float *c, float v0, float v1) {
  *reinterpret_cast<float2 *>(c) = make_float2(v0, v1);
}
__device__ __forceinline__ void storePair(__nv_bfloat16 *c, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162 *>(c) = __floats2bfloat162_rn(v0, v1);
}

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_
