//===- CudaGemm.h - dense matrix products on cuBLAS -------------*- C++ -*-===//
//
// Row-major GEMM for the CUDA kernels, the mirror of cpu/Gemm.h: cuBLAS
// (cublasGemmEx, f32 accumulation) for every product that is only a GEMM.
// A and B share one storage dtype (F32 or BF16); C may be F32 or the same
// dtype. One cuBLAS handle per thread, bound to the launch's stream.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_CUDAGEMM_H_
#define RUNTIME_KERNELS_CUDA_CUDAGEMM_H_

#include <cstdint>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cuda {

/// C[m,n] = alpha * op(A) * op(B) + beta * C on ctx.stream; fails the launch on a cuBLAS error.
void gemm(const KernelContext &ctx, bool transA, bool transB, int64_t m, int64_t n, int64_t k,
          float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, plan::DType abType,
          float beta, void *c, int64_t ldc, plan::DType cType);

/// The same for `batch` products whose operands are `strideA/B/C` elements apart.
void gemmStridedBatched(const KernelContext &ctx, bool transA, bool transB, int64_t m, int64_t n,
                        int64_t k, float alpha, const void *a, int64_t lda, int64_t strideA,
                        const void *b, int64_t ldb, int64_t strideB, plan::DType abType, float beta,
                        void *c, int64_t ldc, int64_t strideC, plan::DType cType, int64_t batch);

} // namespace moec::runtime::cuda

#endif // RUNTIME_KERNELS_CUDA_CUDAGEMM_H_
