//===- CudaCommon.cuh - shared pieces of the CUDA kernels -------*- CUDA -*-===//
//
// Storage types (f32 or bf16, arithmetic always in f32), launch checks that
// report through ctx.fail, and the stream of a launch.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_CUDACOMMON_CUH_
#define RUNTIME_KERNELS_CUDA_CUDACOMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "runtime/kernels/Kernel.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda {

__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T fromFloat(float v);
template <> __device__ __forceinline__ float fromFloat<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16(v); // round to nearest even
}

inline cudaStream_t streamOf(const KernelContext &ctx) { return static_cast<cudaStream_t>(ctx.stream); }

/// Calls fn(float{}) or fn(__nv_bfloat16{}) for the storage type of `t`; fails otherwise.
template <typename Fn> void withFloatType(const KernelContext &ctx, const TensorRef &t, const char *what, Fn &&fn) {
  if (t.dtype == plan::F32)
    fn(float{});
  else if (t.dtype == plan::BF16)
    fn(__nv_bfloat16{});
  else
    ctx.fail(std::string(what) + " must be f32 or bf16");
}

/// Fails the launch with the CUDA error of the last kernel launch, if any.
inline void checkLaunch(const KernelContext &ctx, const char *what) {
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    ctx.fail(std::string(what) + ": " + cudaGetErrorString(error));
}

/// Zeroes every output of the launch (0 bits are 0 in every storage type): for the early returns
/// of kernels registered with OutputInit::Any, whose outputs the executor does not zero.
inline void zeroOutputs(const KernelContext &ctx) {
  for (const TensorRef &out : ctx.outputs) {
    if (out.numel() == 0)
      continue;
    cudaError_t error = cudaMemsetAsync(
        out.data, 0, static_cast<size_t>(out.numel() * plan::dtypeSize(out.dtype)), streamOf(ctx));
    if (error != cudaSuccess)
      ctx.fail(std::string("zeroing an output: ") + cudaGetErrorString(error));
  }
}

inline unsigned blocksFor(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

} // namespace moec::runtime::cuda

#endif // RUNTIME_KERNELS_CUDA_CUDACOMMON_CUH_
