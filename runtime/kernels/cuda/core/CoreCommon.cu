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

/// f32 values as three bf16 planes hi + mid + lo (planes[p n + i]): each plane takes the next 8
/// significant bits of what the previous left, so their sum is the value to its last bits (24 =
/// 3 x 8) and a product with a bf16 operand is three exact bf16 products summed in f32.
__global__ void splitKernel(const float *in, __nv_bfloat16 *planes, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = in[i];
    __nv_bfloat16 hi = __float2bfloat16(v);
    float rest = isfinite(v) ? v - __bfloat162float(hi) : 0.0f; // inf / nan: the top plane alone
    __nv_bfloat16 mid = __float2bfloat16(rest);
    rest -= __bfloat162float(mid);
    planes[i] = hi;
    planes[n + i] = mid;
    planes[2 * n + i] = __float2bfloat16(rest);
  }
}

/// C = alpha op(A) op(B) + beta C (f32 C) where one of A, B is bf16 and the other f32 and small:
/// the f32 one split into bf16 planes, three tensor-core products accumulated smallest plane
/// first, instead of widening the large bf16 operand and an f32 product without tensor cores.
void splitProducts(const KernelContext &ctx, Workspace &ws, bool transA, bool transB, int64_t m, int64_t n,
                   int64_t k, float alpha, const Matrix &a, int64_t lda, const Matrix &b, int64_t ldb, float beta,
                   float *c) {
  bool splitA = a.dtype == plan::F32;
  const Matrix &wide = splitA ? a : b;
  auto *planes = ws.alloc<__nv_bfloat16>(3 * wide.elements);
  splitKernel<<<gridFor(wide.elements), kThreads, 0, streamOf(ctx)>>>(static_cast<const float *>(wide.p), planes,
                                                                      wide.elements);
  checkLaunch(ctx, "split into bf16 planes");
  for (int plane = 2; plane >= 0; --plane) {
    const void *part = planes + plane * wide.elements;
    gemm(ctx, transA, transB, m, n, k, alpha, splitA ? part : a.p, lda, splitA ? b.p : part, ldb, plan::BF16,
         plane == 2 ? beta : 1.0f, c, n, plan::F32);
  }
}

} // namespace

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
  // One of each (an f32 adapter on bf16 data): f32 precision, as PEFT. The f32 side, when it is
  // the smaller, goes through bf16 planes (no f32 copy of the large side, tensor cores); else
  // the bf16 side is widened.
  bool split = false;
  if (a.dtype != b.dtype) {
    const Matrix &f32Side = a.dtype == plan::F32 ? a : b, &bf16Side = a.dtype == plan::F32 ? b : a;
    split = f32Side.elements <= bf16Side.elements;
    if (!split) {
      pa = asF32(ctx, ws, a);
      pb = asF32(ctx, ws, b);
      abType = plan::F32;
    }
  }
  if (!split && (cType == plan::F32 || cType == abType)) {
    gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, c, n, cType);
    return;
  }
  // An f32 product into a bf16 C: through an f32 copy.
  float *out = cBf16 ? ws.alloc<float>(m * n) : static_cast<float *>(c);
  if (cBf16 && beta != 0.0f)
    convert(ctx, FloatIn{c, true}, FloatOut{out, false}, m * n);
  if (split)
    splitProducts(ctx, ws, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, out);
  else
    gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, out, n, plan::F32);
  if (cBf16)
    convert(ctx, FloatIn{out, false}, FloatOut{c, true}, m * n);
}

} // namespace core
} // namespace moec::runtime::cuda
