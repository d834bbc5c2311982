//===- ChunkedReference.h - the chunked delta rule on the host (tests only) -*- C++ -*-===//
//
// ChunkedDeltaRule.h's driver with host primitives: plain loops, one per
// primitive, each the obvious reading of the primitive's contract (and the
// twin of its CUDA kernel in ChunkedDeltaRule.cu). Real = double checks the
// algorithm to rounding; Real = float shows what f32 arithmetic costs. Scratch
// is filled with NaN, so a primitive reading what nobody wrote shows up.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDREFERENCE_H_
#define RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDREFERENCE_H_

#include <memory>
#include <vector>

#include "runtime/kernels/cuda/linear_attention/ChunkedDeltaRule.h"

namespace moec::runtime::cuda::linattn::chunked {

template <typename Real> class HostOps {
public:
  template <typename T> T *alloc(int64_t n);

  void packRows(const Dims &d, const Real *src, int64_t ld, int64_t off, int64_t headDiv, int64_t width,
                Real *dst);
  void packDecay(const Dims &d, const Real *g, double *gam);
  void unpackRows(const Dims &d, const Real *src, int64_t width, Real *dst, int64_t ld, int64_t off);
  void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, Real alpha, const Real *a, int64_t lda,
            int64_t strideA, const Real *b, int64_t ldb, int64_t strideB, Real beta, Real *c, int64_t ldc,
            int64_t strideC, int64_t batch);
  void lowerDecay(const Dims &d, const double *gam, const Real *beta, bool strict, const Real *src,
                  Real *dst);
  void invertUnitLower(const Dims &d, const Real *a, Real *t);
  void rowScale(const Dims &d, RowFactor factor, const double *gam, const Real *beta, const Real *src,
                int64_t width, bool accumulate, Real *dst);
  void sweep(const Dims &d, const SweepArgs<Real> &a);
  void rowScalars(const Dims &d, const ScalarArgs<Real> &a, Real *dBeta, Real *dg);

private:
  std::vector<std::unique_ptr<char[]>> buffers;
};

/// The whole forward (o) and backward (forward, then every gradient) on the host.
template <typename Real> void hostForward(const Problem<Real> &p, Real *o);
template <typename Real> void hostBackward(const Problem<Real> &p, const Real *dO, const Grads<Real> &g);

} // namespace moec::runtime::cuda::linattn::chunked

#endif // RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_CHUNKEDREFERENCE_H_
