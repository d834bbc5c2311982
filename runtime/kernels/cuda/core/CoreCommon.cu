//===- CoreCommon.cu - helpers shared by the core CUDA kernels ------------===//

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

#include "runtime/kernels/cuda/CudaGemm.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda {

void registerCoreKernels(KernelRegistry &registry) {
  core::registerNormKernels(registry);
  core::registerDenseKernels(registry);
  core::registerElementwiseKernels(registry);
  core::registerTokenKernels(registry);
  core::registerLmHeadLossKernels(registry);
  core::registerRandomKernels(registry);
  core::registerOptimizerKernels(registry);
}

namespace core {

//===----------------------------------------------------------------------===//
// Tensors and launch checks
//===----------------------------------------------------------------------===//

void expectFloats(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  if (t.dtype != plan::F32 && t.dtype != plan::BF16)
    ctx.fail(what + " must be f32 or bf16, got " + plan::dtypeName(t.dtype));
}

FloatIn floatIn(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  expectFloats(ctx, t, what);
  return FloatIn{t.data, t.dtype == plan::BF16};
}

FloatOut floatOut(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  expectFloats(ctx, t, what);
  return FloatOut{t.data, t.dtype == plan::BF16};
}

IndexIn indexIn(const KernelContext &ctx, const TensorRef &t, const std::string &what) {
  expectIndices(ctx, t, what);
  return IndexIn{t.data, t.dtype == plan::I64};
}

//===----------------------------------------------------------------------===//
// Scratch memory, fills, GEMM over mixed storage types
//===----------------------------------------------------------------------===//

Workspace::~Workspace() {
  for (void *p : blocks)
    cudaFreeAsync(p, streamOf(ctx));
}

void *Workspace::bytes(size_t n) {
  void *p = nullptr;
  cudaError_t error = cudaMallocAsync(&p, n, streamOf(ctx));
  if (error != cudaSuccess) {
    cudaGetLastError(); // not the launch's error: report it here
    ctx.fail("cannot allocate " + std::to_string(n) + " bytes of scratch memory: " +
             cudaGetErrorString(error));
  }
  blocks.push_back(p);
  return p;
}

namespace {

__global__ void fillKernel(FloatOut out, int64_t n, float value) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out.set(i, value);
}

/// out[i] = in[i] (widening or rounding between the storage types).
__global__ void convertKernel(FloatIn in, FloatOut out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out.set(i, in[i]);
}

void convert(const KernelContext &ctx, FloatIn in, FloatOut out, int64_t n) {
  if (n == 0)
    return;
  convertKernel<<<gridFor(n), kThreads, 0, streamOf(ctx)>>>(in, out, n);
  checkLaunch(ctx, "convert");
}

/// `m` as f32: itself, or a widened copy in scratch.
const void *asF32(const KernelContext &ctx, Workspace &ws, const Matrix &m) {
  if (m.dtype == plan::F32)
    return m.p;
  float *wide = ws.alloc<float>(m.elements);
  convert(ctx, FloatIn{m.p, true}, FloatOut{wide, false}, m.elements);
  return wide;
}

} // namespace

Matrix widenedAgainst(const KernelContext &ctx, Workspace &ws, Matrix m, plan::DType other) {
  if (m.dtype != plan::BF16 || other != plan::F32)
    return m;
  return Matrix{asF32(ctx, ws, m), plan::F32, m.elements};
}

void fillFloats(const KernelContext &ctx, FloatOut out, int64_t n, float value) {
  if (n == 0)
    return;
  fillKernel<<<gridFor(n), kThreads, 0, streamOf(ctx)>>>(out, n, value);
  checkLaunch(ctx, "fill");
}

void gemmAny(const KernelContext &ctx, Workspace &ws, bool transA, bool transB, int64_t m,
             int64_t n, int64_t k, float alpha, Matrix a, int64_t lda, Matrix b, int64_t ldb,
             float beta, void *c, plan::DType cType) {
  if (m == 0 || n == 0)
    return;
  bool cBf16 = cType == plan::BF16;
  if (k == 0) { // an empty sum: C = beta C
    if (beta == 0.0f)
      fillFloats(ctx, FloatOut{c, cBf16}, m * n, 0.0f);
    else if (beta != 1.0f)
      ctx.fail("internal: gemmAny with k = 0 and beta other than 0 or 1");
    return;
  }
  const void *pa = a.p, *pb = b.p;
  plan::DType abType = a.dtype;
  if (a.dtype != b.dtype) { // one of each (an f32 adapter on bf16 data): exact f32, as PEFT
    pa = asF32(ctx, ws, a);
    pb = asF32(ctx, ws, b);
    abType = plan::F32;
  }
  if (cType == plan::F32 || cType == abType) {
    gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, c, n, cType);
    return;
  }
  // f32 product into a bf16 C: through an f32 copy.
  float *wide = ws.alloc<float>(m * n);
  if (beta != 0.0f)
    convert(ctx, FloatIn{c, true}, FloatOut{wide, false}, m * n);
  gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, wide, n, plan::F32);
  convert(ctx, FloatIn{wide, false}, FloatOut{c, true}, m * n);
}

} // namespace core
} // namespace moec::runtime::cuda
