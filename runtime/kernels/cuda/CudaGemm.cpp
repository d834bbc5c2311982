//===- CudaGemm.cpp - dense matrix products on cuBLAS ---------------------===//

#include "runtime/kernels/cuda/CudaGemm.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace moec::runtime::cuda {

namespace {

cudaDataType_t cudaType(const KernelContext &ctx, plan::DType dtype) {
  if (dtype == plan::F32)
    return CUDA_R_32F;
  if (dtype == plan::BF16)
    return CUDA_R_16BF;
  ctx.fail("GEMM operands must be f32 or bf16");
}

cublasHandle_t handleFor(const KernelContext &ctx) {
  thread_local cublasHandle_t handle = nullptr;
  if (!handle && cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
    ctx.fail("cannot create a cuBLAS handle");
  cublasSetStream(handle, static_cast<cudaStream_t>(ctx.stream));
  return handle;
}

void check(const KernelContext &ctx, cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS)
    ctx.fail(std::string("cuBLAS GEMM failed: ") + cublasGetStatusString(status));
}

} // namespace

// Row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ: swap the operands.
void gemm(const KernelContext &ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, plan::DType abType,
          float beta, void *c, int64_t ldc, plan::DType cType) {
  gemmStridedBatched(ctx, transA, transB, m, n, k, alpha, a, lda, 0, b, ldb, 0, abType, beta, c, ldc, 0,
                     cType, 1);
}

void gemmStridedBatched(const KernelContext &ctx, bool transA, bool transB, int64_t m, int64_t n,
                        int64_t k, float alpha, const void *a, int64_t lda, int64_t strideA,
                        const void *b, int64_t ldb, int64_t strideB, plan::DType abType, float beta,
                        void *c, int64_t ldc, int64_t strideC, plan::DType cType, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0)
    return;
  cublasHandle_t handle = handleFor(ctx);
  cudaDataType_t ab = cudaType(ctx, abType), cc = cudaType(ctx, cType);
  check(ctx, cublasGemmStridedBatchedEx(
                 handle, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                 static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, ab,
                 static_cast<int>(ldb), strideB, a, ab, static_cast<int>(lda), strideA, &beta, c, cc,
                 static_cast<int>(ldc), strideC, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT));
}

} // namespace moec::runtime::cuda
