//===- Silu.cuh - SiLU and its derivative in double, as the CPU twin -*- CUDA -*-===//
//
// Shared by the expert MLP's activation kernels (ExpertMlp.cu) and the grouped
// GEMM epilogues that apply the gated SiLU (GroupedGemmWgmma.cu), so both
// paths compute the same values.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_SILU_CUH_
#define RUNTIME_KERNELS_CUDA_ROUTING_SILU_CUH_

namespace moec::runtime::cuda::routing {

__device__ __forceinline__ double sigmoidD(double v) { return 1.0 / (1.0 + exp(-v)); }

/// silu(v) = v sigmoid(v).
__device__ __forceinline__ double siluD(double v) { return v * sigmoidD(v); }

/// d silu / dv = s (1 + v (1 - s)), s = sigmoid(v).
__device__ __forceinline__ double siluGradD(double v) {
  double s = sigmoidD(v);
  return s * (1.0 + v * (1.0 - s));
}

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_SILU_CUH_
