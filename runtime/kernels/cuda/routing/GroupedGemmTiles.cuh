//===- GroupedGemmTiles.cuh - what the grouped GEMM kernels share -*- CUDA -*-===//
//
// What the grouped GEMM kernels share (mma.sync in GroupedGemm.cu, wgmma in
// GroupedGemmWgmma.cu): the launch parameters and the epilogue's stores.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_

#include <cstdint>

#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::routing {

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

__device__ __forceinline__ uint32_t sharedAddress(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <typename CT> __device__ __forceinline__ float loadC(const CT *c) { return toFloat(*c); }

/// Two adjacent outputs in one store (`c` aligned to both).
__device__ __forceinline__ void storePair(float *c, float v0, float v1) {
  *reinterpret_cast<float2 *>(c) = make_float2(v0, v1);
}
__device__ __forceinline__ void storePair(__nv_bfloat16 *c, float v0, float v1) {
  *reinterpret_cast<__nv_bfloat162 *>(c) = __floats2bfloat162_rn(v0, v1);
}

/// out[0] = v0 (+ beta out[0]) and, when `both`, out[1] = v1 (+ beta out[1]); beta == 0 never
/// reads the output. Both in one store where the address allows it.
template <typename CT>
__device__ __forceinline__ void storeTwo(CT *out, bool both, float v0, float v1, float beta) {
  if (both && reinterpret_cast<uintptr_t>(out) % (2 * sizeof(CT)) == 0) {
    if (beta != 0.0f) {
      v0 = fmaf(beta, loadC(out), v0);
      v1 = fmaf(beta, loadC(out + 1), v1);
    }
    storePair(out, v0, v1);
    return;
  }
  if (beta != 0.0f)
    v0 = fmaf(beta, loadC(out), v0);
  *out = fromFloat<CT>(v0);
  if (both) {
    if (beta != 0.0f)
      v1 = fmaf(beta, loadC(out + 1), v1);
    out[1] = fromFloat<CT>(v1);
  }
}

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_GROUPEDGEMMTILES_CUH_
