//===- CoreCommon.cu - helpers shared by the core CUDA kernels ------------===//

#include "runtime/kernels/cuda/core/CoreCommon.cuh"

#include <algorithm>
#include <cstdint>
#include <string>

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

/// An f32 matrix [rows, cols] (row stride ld) as three bf16 planes hi + mid + lo: each takes the
/// next 8 significant bits of what the previous left, so their sum is the value to its last bits
/// (24 = 3 x 8) and a product with a bf16 operand is three exact bf16 products summed in f32.
/// The planes stack along the rows ([3 rows, cols], plane p at row p rows) or along the columns
/// ([rows, 3 cols], plane p at column p cols): the dimension that is not the product's k, so one
/// product reads the bf16 operand once and gives the three parts side by side.
__global__ void splitKernel(const float *in, int64_t rows, int64_t cols, int64_t ld, bool stackRows,
                            __nv_bfloat16 *planes) {
  int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    float v = in[r * ld + c];
    __nv_bfloat16 part[3];
    part[0] = __float2bfloat16(v);
    float rest = isfinite(v) ? v - __bfloat162float(part[0]) : 0.0f; // inf / nan: the top plane alone
    part[1] = __float2bfloat16(rest);
    part[2] = __float2bfloat16(rest - __bfloat162float(part[1]));
    for (int p = 0; p < 3; ++p)
      planes[stackRows ? (p * rows + r) * cols + c : r * 3 * cols + p * cols + c] = part[p];
  }
}

/// C[i, j] = beta C[i, j] + ((lo + mid) + hi) from the three parts of each output: rows p m of
/// `parts` ([3m, n]) when `partsInRows`, else columns p n ([m, 3n]); smallest part first.
__global__ void sumPartsKernel(const float *parts, int64_t m, int64_t n, bool partsInRows, float beta,
                               FloatOut c) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i / n, col = i % n;
    auto part = [&](int p) {
      return partsInRows ? parts[(p * m + r) * n + col] : parts[r * 3 * n + p * n + col];
    };
    float v = (part(2) + part(1)) + part(0);
    if (beta != 0.0f)
      v = fmaf(beta, c.get(i), v);
    c.set(i, v);
  }
}

/// C = alpha op(A) op(B) + beta C where one of A, B is bf16 and the other f32 and small: the f32
/// one as bf16 planes stacked along its dimension that is not k (A's m, B's n), one tensor-core
/// product into f32 scratch, then the parts summed into C (f32 or bf16): the large bf16 operand
/// is read once, not widened, and the product keeps f32 precision.
void splitProducts(const KernelContext &ctx, Workspace &ws, bool transA, bool transB, int64_t m,
                   int64_t n, int64_t k, float alpha, const Matrix &a, int64_t lda, const Matrix &b,
                   int64_t ldb, float beta, void *c, plan::DType cType) {
  bool splitA = a.dtype == plan::F32;
  // The f32 operand's storage [rows, cols]; m (A) or n (B) is its rows when A is not transposed
  // (B is), else its columns.
  bool stackRows = splitA ? !transA : transB;
  int64_t wide = splitA ? m : n;
  int64_t rows = stackRows ? wide : k, cols = stackRows ? k : wide;
  auto *planes = ws.alloc<__nv_bfloat16>(3 * rows * cols);
  splitKernel<<<gridFor(rows * cols), kThreads, 0, streamOf(ctx)>>>(
      static_cast<const float *>(splitA ? a.p : b.p), rows, cols, splitA ? lda : ldb, stackRows, planes);
  checkLaunch(ctx, "split into bf16 planes");
  int64_t ldPlanes = stackRows ? cols : 3 * cols;
  float *parts = ws.alloc<float>(3 * m * n);
  if (splitA) // parts [3m, n]: plane p's product in rows p m
    gemm(ctx, transA, transB, 3 * m, n, k, alpha, planes, ldPlanes, b.p, ldb, plan::BF16, 0.0f, parts, n,
         plan::F32);
  else // parts [m, 3n]: plane p's product in columns p n
    gemm(ctx, transA, transB, m, 3 * n, k, alpha, a.p, lda, planes, ldPlanes, plan::BF16, 0.0f, parts,
         3 * n, plan::F32);
  sumPartsKernel<<<gridFor(m * n), kThreads, 0, streamOf(ctx)>>>(parts, m, n, splitA, beta,
                                                                 FloatOut{c, cType == plan::BF16});
  checkLaunch(ctx, "sum of the planes' products");
}

/// The plane pairs whose products sum to an f32 x f32 product to about f32 precision: hi hi,
/// hi mid, mid hi, hi lo, lo hi, mid mid (the three dropped are below 2^-24 of it).
constexpr int kPlanePairs = 6;
__constant__ int kPlaneOfA[kPlanePairs] = {0, 0, 1, 0, 2, 1};
__constant__ int kPlaneOfB[kPlanePairs] = {0, 1, 0, 2, 0, 1};

/// op(A) [m, k] as [m, 6k] bf16 (aSide; block q of k columns: plane kPlaneOfA[q]), or op(B)
/// [k, n] as [6k, n] (block q of k rows: plane kPlaneOfB[q]); the f32 matrix has row stride ld.
/// A thread per value: it reads the value once and writes its six plane copies. Consecutive
/// threads take consecutive values of the stored matrix's rows (reads are coalesced; so are the
/// writes where the stored and the stacked layouts agree). 32-bit indices (the launch checks).
__global__ void stackPlanesKernel(const float *in, uint32_t ld, bool trans, bool aSide, uint32_t k,
                                  uint32_t other, __nv_bfloat16 *out) {
  // The stored matrix has rows o and columns l when op() keeps them (aSide: !trans), else the reverse.
  bool rowIsO = aSide ? !trans : trans;
  uint32_t n = k * other;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t o = rowIsO ? i / k : i % other, l = rowIsO ? i % k : i / other;
    float v = rowIsO ? in[size_t(o) * ld + l] : in[size_t(l) * ld + o];
    __nv_bfloat16 plane[3];
    plane[0] = __float2bfloat16(v);
    float rest = isfinite(v) ? v - __bfloat162float(plane[0]) : 0.0f; // inf / nan: the top plane alone
    plane[1] = __float2bfloat16(rest);
    plane[2] = __float2bfloat16(rest - __bfloat162float(plane[1]));
#pragma unroll
    for (int q = 0; q < kPlanePairs; ++q) {
      __nv_bfloat16 p = plane[aSide ? kPlaneOfA[q] : kPlaneOfB[q]];
      if (aSide) // out[o][q k + l]
        out[size_t(o) * kPlanePairs * k + q * k + l] = p;
      else // out[q k + l][o]
        out[size_t(q * k + l) * other + o] = p;
    }
  }
}

/// C = alpha op(A) op(B) + beta C for f32 A and B with a small k: both as bf16 planes stacked
/// along k (six plane pairs), so one tensor-core product sums the pairs in f32 and writes C in
/// its type directly (for a bf16 C: no f32 copy of C; no f32 product on the CUDA cores).
void stackedPlaneProducts(const KernelContext &ctx, Workspace &ws, bool transA, bool transB,
                          int64_t m, int64_t n, int64_t k, float alpha, const Matrix &a, int64_t lda,
                          const Matrix &b, int64_t ldb, float beta, void *c, plan::DType cType) {
  auto *aStack = ws.alloc<__nv_bfloat16>(kPlanePairs * k * m);
  auto *bStack = ws.alloc<__nv_bfloat16>(kPlanePairs * k * n);
  if (kPlanePairs * k * std::max(m, n) > int64_t(UINT32_MAX) || std::max(lda, ldb) > int64_t(UINT32_MAX))
    ctx.fail("internal: f32 product of " + std::to_string(m) + " x " + std::to_string(n) +
             " too large for the stacked bf16 planes");
  stackPlanesKernel<<<gridFor(k * m), kThreads, 0, streamOf(ctx)>>>(static_cast<const float *>(a.p), lda, transA,
                                                                     true, k, m, aStack);
  stackPlanesKernel<<<gridFor(k * n), kThreads, 0, streamOf(ctx)>>>(static_cast<const float *>(b.p), ldb, transB,
                                                                     false, k, n, bStack);
  checkLaunch(ctx, "stack bf16 planes");
  gemm(ctx, false, false, m, n, kPlanePairs * k, alpha, aStack, kPlanePairs * k, bStack, n, plan::BF16,
       beta, c, n, cType);
}

/// Up to this k, an f32 x f32 product goes through stackedPlaneProducts: its stacked copies
/// ((m + n) 6k values) stay small next to the m n output.
constexpr int64_t kStackedPlanesMaxK = 128;

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
  if (split)
    return splitProducts(ctx, ws, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, cType);
  if (a.dtype == plan::F32 && b.dtype == plan::F32 && k <= kStackedPlanesMaxK) // LoRA's rank-k
    return stackedPlaneProducts(ctx, ws, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                cType);
  if (cType == plan::F32 || cType == abType) {
    gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, c, n, cType);
    return;
  }
  // An f32 product into a bf16 C: through an f32 copy.
  float *out = ws.alloc<float>(m * n);
  if (beta != 0.0f)
    convert(ctx, FloatIn{c, true}, FloatOut{out, false}, m * n);
  gemm(ctx, transA, transB, m, n, k, alpha, pa, lda, pb, ldb, abType, beta, out, n, plan::F32);
  convert(ctx, FloatIn{out, false}, FloatOut{c, true}, m * n);
}

} // namespace core
} // namespace moec::runtime::cuda
