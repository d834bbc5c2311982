//===- Gemm.h - dense matrix products for the CPU kernels -------*- C++ -*-===//
//
// Row-major single-precision GEMM on OpenBLAS (Debian's libopenblas-dev):
// tuned kernels for the dense products, which dominate every layer, and
// results that repeat exactly for the same shapes and thread count (what
// bit-identical resume needs). Everything else in the CPU backend is ours.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_GEMM_H_
#define RUNTIME_KERNELS_CPU_GEMM_H_

#include <cstdint>

namespace moec::runtime::cpu {

/// C[m,n] = alpha * op(A) * op(B) + beta * C, row-major, op(X) = X or Xᵀ.
/// A is [m,k] (or [k,m] when transA), B is [k,n] (or [n,k] when transB).
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/// Sets how many threads OpenBLAS uses (the executor's pool size).
void setGemmThreads(int threads);

} // namespace moec::runtime::cpu

#endif // RUNTIME_KERNELS_CPU_GEMM_H_
