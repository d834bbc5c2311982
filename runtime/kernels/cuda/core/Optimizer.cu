//===- Optimizer.cu - AdamW and gradient norms on the GPU -----------------===//
//
// The twins of cpu/core/Optimizer.cpp: the optimizer step runs where the
// adapter lives, so the trainer copies nothing but one sum per tensor.
//  - sum_squares: one block per input, each thread sums a strided slice in
//    double, then a fixed-order tree over the block (deterministic);
//  - adamw: one thread per element, checks/core/AdamW.h's arithmetic.
//
//===----------------------------------------------------------------------===//

#include "runtime/kernels/checks/core/AdamW.h"
#include "runtime/kernels/cuda/core/CoreCommon.cuh"

namespace moec::runtime::cuda::core {

namespace {

constexpr int kSumThreads = 512;

__global__ void sumSquaresKernel(const float *g, int64_t n, float *out) {
  __shared__ double partial[kSumThreads];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    sum += static_cast<double>(g[i]) * g[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    *out = static_cast<float>(partial[0]);
}

__global__ void adamwKernel(AdamWConstants c, const float *g, float *p, float *m, float *v, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    adamwElement(c, p[i], g[i], m[i], v[i]);
}

void sumSquares(KernelContext &ctx) {
  const TensorRef &result = ctx.out(0);
  ctx.expectShape(result, "result", {static_cast<int64_t>(ctx.inputs.size())});
  float *out = result.f32();
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    sumSquaresKernel<<<1, kSumThreads, 0, streamOf(ctx)>>>(ctx.inputs[i].f32(), ctx.inputs[i].numel(),
                                                           out + i);
    checkLaunch(ctx, "sum_squares");
  }
}

void adamw(KernelContext &ctx) {
  AdamWConstants c = checks::core::adamwLaunch(ctx);
  const TensorRef &grad = ctx.in(0), &param = ctx.out(0), &m = ctx.out(1), &v = ctx.out(2);
  int64_t n = param.numel();
  if (n == 0)
    return;
  adamwKernel<<<gridFor(n), kThreads, 0, streamOf(ctx)>>>(c, grad.f32(), param.f32(), m.f32(), v.f32(), n);
  checkLaunch(ctx, "adamw");
}

} // namespace

void registerOptimizerKernels(KernelRegistry &registry) {
  registry.add("sum_squares", sumSquares);
  registry.add("adamw", adamw);
}

} // namespace moec::runtime::cuda::core
